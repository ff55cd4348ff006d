#include "oci_registry.h"

#include <cstdlib>
#include <fstream>
#include <optional>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/platform.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "https_client.h"
#include "registry_auth.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string OciDigest(absl::string_view data) {
  return absl::StrCat("sha256:", DigestHex(DigestBytes(Sha256(data))));
}

// The distribution spec's grammar: '/'-separated components of lower-case
// letters and digits, joined within by one '.', one or two '_', or dashes.
bool IsRepositoryName(absl::string_view name) {
  if (name.empty() || name.size() > 255) return false;
  for (absl::string_view component : absl::StrSplit(name, '/')) {
    if (component.empty() || !absl::ascii_isalnum(component.front()) || !absl::ascii_isalnum(component.back())) {
      return false;
    }
    for (size_t i = 0; i < component.size(); ++i) {
      const char c = component[i];
      if (absl::ascii_isupper(c)) return false;
      if (absl::ascii_isalnum(c) || c == '-') continue;
      if (c != '.' && c != '_') return false;
      const bool doubled_underscore = c == '_' && component[i + 1] == '_' && absl::ascii_isalnum(component[i + 2]);
      if (!absl::ascii_isalnum(component[i + 1]) && !doubled_underscore) return false;
      if (doubled_underscore) ++i;
    }
  }
  return true;
}

// [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
bool IsTag(absl::string_view tag) {
  if (tag.empty() || tag.size() > 128 || tag.front() == '.' || tag.front() == '-') return false;
  return absl::c_all_of(tag, [](char c) { return absl::ascii_isalnum(c) || c == '_' || c == '.' || c == '-'; });
}

// HOST[:PORT]: a DNS name or address ([IPv6] too), never a path.
bool IsRegistryHost(absl::string_view host) {
  return !host.empty() && (absl::ascii_isalnum(host.front()) || host.front() == '[') &&
         absl::c_all_of(host, [](char c) {
    return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == ':' || c == '[' || c == ']';
  });
}

// Requests to one repository of one registry for one operation, logged in
// as its challenges ask (registry_auth.h).
class RegistrySession {
 public:
  RegistrySession(const OciReference& reference, std::string actions)
      : reference_(reference),
        auth_(reference.registry, reference.repository, std::move(actions), SendTokenRequest) {}

  std::string Url(absl::string_view path) const {
    return absl::StrCat("https://", reference_.registry, "/v2/", reference_.repository, path);
  }

  absl::StatusOr<HttpsResponse> Send(const HttpsRequest& request) {
    ASSIGN_OR_RETURN(HttpsResponse response, SendHttps(Authorized(request)));
    if (response.status != 401) return response;
    RETURN_IF_ERROR(auth_.Answer(response.Header("www-authenticate")));
    ASSIGN_OR_RETURN(response, SendHttps(Authorized(request)));
    if (response.status == 401 || response.status == 403) {
      return auth_.Refusal(response.status, response.Header("www-authenticate"));
    }
    return response;
  }

 private:
  HttpsRequest Authorized(HttpsRequest request) {
    if (std::string authorization = auth_.Authorization(); !authorization.empty()) {
      request.headers.emplace_back("Authorization", std::move(authorization));
    }
    return request;
  }

  static absl::StatusOr<TokenAnswer> SendTokenRequest(const TokenRequest& request) {
    HttpsRequest https;
    https.method = request.method;
    https.url = request.url;
    https.headers = request.headers;
    https.body = request.body;
    ASSIGN_OR_RETURN(HttpsResponse response, SendHttps(https));
    return TokenAnswer{response.status, std::move(response.body)};
  }

  const OciReference& reference_;
  RegistryAuth auth_;
};

absl::Status Unexpected(const HttpsResponse& response, absl::string_view what) {
  return absl::UnavailableError(absl::StrFormat("%s: the registry answered %d %s", what,
                                                response.status, response.body.substr(0, 300)));
}

// The URL a Location header names, relative to the registry or absolute.
std::string Resolve(const OciReference& reference, const std::string& location) {
  if (absl::StartsWith(location, "https://") || absl::StartsWith(location, "http://")) {
    return location;
  }
  return absl::StrCat("https://", reference.registry, location);
}

absl::Status PushBlob(RegistrySession& session, const OciReference& reference,
                      const std::string& digest, const std::string& data,
                      const fs::path& file) {
  HttpsRequest exists;
  exists.method = "HEAD";
  exists.url = session.Url(absl::StrCat("/blobs/", digest));
  ASSIGN_OR_RETURN(HttpsResponse found, session.Send(exists));
  if (found.status == 200) return absl::OkStatus();
  HttpsRequest start;
  start.method = "POST";
  start.url = session.Url("/blobs/uploads/");
  ASSIGN_OR_RETURN(HttpsResponse started, session.Send(start));
  if (started.status != 202 || started.Header("location").empty()) {
    return Unexpected(started, "starting an upload");
  }
  std::string url = Resolve(reference, started.Header("location"));
  absl::StrAppend(&url, absl::StrContains(url, '?') ? "&" : "?", "digest=", UrlEncodeComponent(digest));
  HttpsRequest upload;
  upload.method = "PUT";
  upload.url = url;
  upload.headers.emplace_back("Content-Type", "application/octet-stream");
  if (file.empty()) {
    upload.body = data;
  } else {
    upload.body_file = file;
  }
  ASSIGN_OR_RETURN(HttpsResponse uploaded, session.Send(upload));
  if (uploaded.status != 201) return Unexpected(uploaded, "uploading a blob");
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileDigest(const fs::path& file, uint64_t& size) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", file.string()));
  Sha256Stream digest;
  std::string chunk(1 << 20, '\0');
  size = 0;
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const auto read = static_cast<size_t>(in.gcount());
    digest.Update(absl::string_view(chunk.data(), read));
    size += read;
  }
  return absl::StrCat("sha256:", DigestHex(DigestBytes(digest.Finish())));
}

}  // namespace

std::string OciReference::ToString() const {
  std::string text = absl::StrCat(registry, "/", repository);
  if (!tag.empty()) absl::StrAppend(&text, ":", tag);
  if (!digest.empty()) absl::StrAppend(&text, "@", digest);
  return text;
}

absl::StatusOr<OciReference> ParseOciReference(absl::string_view text) {
  OciReference reference;
  const std::string usage = absl::StrFormat(
      "'%s' is not a registry reference; write REGISTRY/REPOSITORY:TAG or "
      "REGISTRY/REPOSITORY@sha256:HEX (e.g. ghcr.io/team/kernels:v1)",
      text);
  absl::string_view rest = text;
  if (const size_t at = rest.find('@'); at != absl::string_view::npos) {
    reference.digest = std::string(rest.substr(at + 1));
    rest = rest.substr(0, at);
    if (!absl::StartsWith(reference.digest, "sha256:") || reference.digest.size() != 7 + 64) {
      return absl::InvalidArgumentError(usage);
    }
  }
  const size_t slash = rest.find('/');
  if (slash == absl::string_view::npos) return absl::InvalidArgumentError(usage);
  reference.registry = std::string(rest.substr(0, slash));
  rest = rest.substr(slash + 1);
  if (const size_t colon = rest.rfind(':');
      colon != absl::string_view::npos && rest.find('/', colon) == absl::string_view::npos) {
    reference.tag = std::string(rest.substr(colon + 1));
    rest = rest.substr(0, colon);
  }
  reference.repository = std::string(rest);
  if (!IsRegistryHost(reference.registry) || !IsRepositoryName(reference.repository) ||
      (!reference.tag.empty() && !IsTag(reference.tag))) {
    return absl::InvalidArgumentError(usage);
  }
  if (reference.tag.empty() && reference.digest.empty()) reference.tag = "latest";
  return reference;
}

namespace {

struct Descriptor {
  std::string digest;
  uint64_t size = 0;
};

// Pushes `bundle`'s config, layer and manifest; the manifest under `tag`, or
// by its digest when `tag` is empty (an index's member).
absl::StatusOr<Descriptor> PushBundleManifest(RegistrySession& session, const OciReference& reference,
                                              const BundleToPush& bundle, const std::string& tag,
                                              uint64_t& layer_bytes) {
  ASSIGN_OR_RETURN(const std::string layer_digest, FileDigest(bundle.file, layer_bytes));
  std::string config = absl::StrFormat(R"({"entries":%d,"signed_by":"%s")", bundle.entries, bundle.signed_by);
  if (!bundle.target.empty()) absl::StrAppend(&config, R"(,"target":")", bundle.target, "\"");
  absl::StrAppend(&config, "}");
  const std::string config_digest = OciDigest(config);
  RETURN_IF_ERROR(PushBlob(session, reference, config_digest, config, {}));
  RETURN_IF_ERROR(PushBlob(session, reference, layer_digest, "", bundle.file));
  const std::string manifest = absl::StrFormat(
      R"({"schemaVersion":2,"mediaType":"%s","artifactType":"%s",)"
      R"("config":{"mediaType":"%s","digest":"%s","size":%d},)"
      R"("layers":[{"mediaType":"%s","digest":"%s","size":%d,)"
      R"("annotations":{"org.opencontainers.image.title":"%s"}}]})",
      kManifestMediaType, kBundleMediaType, kBundleConfigMediaType, config_digest, config.size(),
      kBundleMediaType, layer_digest, layer_bytes, bundle.file.filename().string());
  const std::string manifest_digest = OciDigest(manifest);
  HttpsRequest put;
  put.method = "PUT";
  put.url = session.Url(absl::StrCat("/manifests/", tag.empty() ? manifest_digest : tag));
  put.headers.emplace_back("Content-Type", std::string(kManifestMediaType));
  put.body = manifest;
  ASSIGN_OR_RETURN(HttpsResponse stored, session.Send(put));
  if (stored.status != 201) return Unexpected(stored, "storing the manifest");
  return Descriptor{manifest_digest, manifest.size()};
}

// GETs the manifest (or index) at `where` (a tag or digest): its bytes.
absl::StatusOr<std::string> FetchManifest(RegistrySession& session, const OciReference& reference,
                                          const std::string& where, const PullOptions& options) {
  HttpsRequest get;
  get.cancelled = options.cancelled;
  get.url = session.Url(absl::StrCat("/manifests/", where));
  get.headers.emplace_back("Accept", absl::StrCat(kManifestMediaType, ", ", kIndexMediaType));
  ASSIGN_OR_RETURN(HttpsResponse answer, session.Send(get));
  if (answer.status == 404) {
    return absl::NotFoundError(absl::StrCat(reference.ToString(), ": the registry has no such bundle"));
  }
  if (answer.status != 200) return Unexpected(answer, "fetching the manifest");
  return std::move(answer.body);
}

// Fetches the layer of the bundle manifest `manifest_text` into `file`.
absl::Status FetchBundleLayer(RegistrySession& session, const OciReference& reference,
                              const std::string& manifest_text, const fs::path& file, const PullOptions& options) {
  ASSIGN_OR_RETURN(const BundleLayer layer, ParseBundleManifest(manifest_text, reference.ToString()));

  const fs::path partial = fs::path(file.string() + ".partial");
  std::ofstream out(partial, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InvalidArgumentError(absl::StrCat("cannot write ", partial.string()));
  Sha256Stream digest;
  uint64_t size = 0;
  HttpsRequest blob;
  blob.url = session.Url(absl::StrCat("/blobs/", layer.digest));
  blob.cancelled = options.cancelled;
  blob.on_body = [&](absl::string_view data) -> absl::Status {
    digest.Update(data);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    size += data.size();
    if (size > layer.size) {
      return absl::DataLossError("the layer is larger than its manifest says");
    }
    if (options.received) options.received(size);
    return out ? absl::OkStatus() : absl::ResourceExhaustedError("writing the bundle failed");
  };
  absl::StatusOr<HttpsResponse> fetched = session.Send(blob);
  // Registries that keep blobs elsewhere redirect to them; the credentials stay behind.
  for (int redirects = 0; fetched.ok() && fetched->status / 100 == 3 && redirects < 5; ++redirects) {
    HttpsRequest elsewhere = blob;
    elsewhere.url = Resolve(reference, fetched->Header("location"));
    fetched = SendHttps(elsewhere);
  }
  out.close();
  const std::string actual = absl::StrCat("sha256:", DigestHex(DigestBytes(digest.Finish())));
  absl::Status status = fetched.status();
  if (status.ok() && fetched->status != 200) status = Unexpected(*fetched, "fetching the bundle");
  if (status.ok() && (actual != layer.digest || size != layer.size)) {
    status = absl::DataLossError(absl::StrFormat(
        "%s: the bundle's bytes have digest %s (%d bytes), its manifest says %s (%d bytes): "
        "tampered with or damaged in the registry; nothing was kept",
        reference.ToString(), actual, size, layer.digest, layer.size));
  }
  std::error_code error;
  if (!status.ok()) {
    fs::remove(partial, error);
    return status;
  }
  return platform::MoveFileOver(partial, file).status();
}

// Where the bundle for `target` goes when an index gives more than one: FILE
// with the target before its extension (x.kilnbundle: x.cuda_89.kilnbundle).
fs::path FileForTarget(const fs::path& file, const std::string& target) {
  return file.parent_path() /
         absl::StrCat(file.stem().string(), ".", absl::StrReplaceAll(target, {{":", "_"}}), file.extension().string());
}

// Fetches an index member's manifest, which must have the digest the index
// gives it, and its layer into `file`.
absl::Status FetchIndexMember(RegistrySession& session, const OciReference& reference, const IndexMember& member,
                              const fs::path& file, const PullOptions& options) {
  ASSIGN_OR_RETURN(const std::string manifest, FetchManifest(session, reference, member.digest, options));
  if (OciDigest(manifest) != member.digest) {
    return absl::DataLossError(absl::StrFormat(
        "%s: the manifest for %s has digest %s, its index says %s; nothing was kept", reference.ToString(),
        member.target, OciDigest(manifest), member.digest));
  }
  return FetchBundleLayer(session, reference, manifest, file, options);
}

}  // namespace

absl::StatusOr<PushedBundle> PushBundle(const BundleToPush& bundle, const OciReference& reference) {
  if (reference.tag.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(reference.ToString(), ": push to a tag (REGISTRY/REPOSITORY:TAG)"));
  }
  RegistrySession session(reference, "pull,push");
  PushedBundle pushed;
  ASSIGN_OR_RETURN(const Descriptor manifest, PushBundleManifest(session, reference, bundle, reference.tag,
                                                                 pushed.bytes));
  pushed.manifest_digest = manifest.digest;
  return pushed;
}

absl::StatusOr<PushedBundle> PushBundleIndex(const std::vector<BundleToPush>& bundles, const OciReference& reference) {
  if (reference.tag.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(reference.ToString(), ": push to a tag (REGISTRY/REPOSITORY:TAG)"));
  }
  RegistrySession session(reference, "pull,push");
  PushedBundle pushed;
  std::vector<std::string> members;
  for (const BundleToPush& bundle : bundles) {
    if (!PlainJsonText(bundle.target) || bundle.target.empty() || !PlainJsonText(bundle.signed_by)) {
      return absl::InvalidArgumentError(absl::StrFormat("'%s' is not a target (cuda:89)", bundle.target));
    }
    const std::string tritons = absl::StrJoin(bundle.tritons, ",");
    if (!PlainJsonText(tritons)) {
      return absl::InvalidArgumentError(absl::StrFormat("'%s' are not Triton versions", tritons));
    }
    uint64_t bytes = 0;
    ASSIGN_OR_RETURN(const Descriptor manifest, PushBundleManifest(session, reference, bundle, "", bytes));
    pushed.bytes += bytes;
    const std::string triton_annotation =
        tritons.empty() ? "" : absl::StrFormat(R"(,"%s":"%s")", kTritonAnnotation, tritons);
    members.push_back(absl::StrFormat(
        R"({"mediaType":"%s","artifactType":"%s","digest":"%s","size":%d,"annotations":{"%s":"%s"%s}})",
        kManifestMediaType, kBundleMediaType, manifest.digest, manifest.size, kTargetAnnotation, bundle.target,
        triton_annotation));
  }
  const std::string index =
      absl::StrFormat(R"({"schemaVersion":2,"mediaType":"%s","artifactType":"%s","manifests":[%s]})",
                      kIndexMediaType, kBundleMediaType, absl::StrJoin(members, ","));
  HttpsRequest put;
  put.method = "PUT";
  put.url = session.Url(absl::StrCat("/manifests/", reference.tag));
  put.headers.emplace_back("Content-Type", std::string(kIndexMediaType));
  put.body = index;
  ASSIGN_OR_RETURN(HttpsResponse stored, session.Send(put));
  if (stored.status != 201) return Unexpected(stored, "storing the index");
  pushed.manifest_digest = OciDigest(index);
  return pushed;
}

absl::StatusOr<PulledBundle> PullBundle(const OciReference& reference, const fs::path& file,
                                        const PullOptions& options) {
  RegistrySession session(reference, "pull");
  ASSIGN_OR_RETURN(const std::string top,
                   FetchManifest(session, reference, reference.digest.empty() ? reference.tag : reference.digest,
                                 options));
  PulledBundle pulled;
  pulled.manifest_digest = OciDigest(top);
  if (!reference.digest.empty() && pulled.manifest_digest != reference.digest) {
    return absl::DataLossError(absl::StrFormat(
        "%s: the registry's manifest has digest %s; nothing was fetched", reference.ToString(),
        pulled.manifest_digest));
  }
  if (absl::c_linear_search(options.known_digests, pulled.manifest_digest)) {
    pulled.known = true;
    return pulled;
  }
  ASSIGN_OR_RETURN(const std::optional<IndexChoice> index,
                   ChooseIndexMembers(top, reference.ToString(), options.targets, options.tritons));
  if (!index.has_value()) {
    RETURN_IF_ERROR(FetchBundleLayer(session, reference, top, file, options));
    pulled.files.push_back({file, ""});
    return pulled;
  }
  // An index: a bundle per GPU target; those of `options.targets` (and
  // `options.tritons`) are fetched.
  pulled.index_targets = index->targets;
  for (const IndexMember& member : index->chosen) {
    const fs::path target_file = index->chosen.size() == 1 ? file : FileForTarget(file, member.target);
    if (absl::Status fetched = FetchIndexMember(session, reference, member, target_file, options); !fetched.ok()) {
      std::error_code error;
      for (const PulledFile& kept : pulled.files) fs::remove(kept.path, error);
      return fetched;
    }
    pulled.files.push_back({target_file, member.target});
  }
  return pulled;
}

}  // namespace kiln
