#include "service/request_validation.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "common/json_syntax.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace kiln::service {
namespace {

constexpr size_t kMaxNamespaceLength = 64;
constexpr size_t kMaxKeyLength = 512;
constexpr size_t kMaxBlobNameLength = 255;

absl::Status ValidateNamespace(const std::string& ns) {
  const bool valid_chars = std::all_of(ns.begin(), ns.end(), [](char c) {
    return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '.' || c == '_' || c == '-';
  });
  if (ns.empty() || ns.size() > kMaxNamespaceLength || !valid_chars) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "namespace '%s' is invalid: use 1-%d characters of a-z 0-9 . _ - (e.g. 'triton')",
        absl::CHexEscape(ns.substr(0, kMaxNamespaceLength)), kMaxNamespaceLength));
  }
  return absl::OkStatus();
}

absl::Status ValidateKey(const std::string& key) {
  const bool printable = std::all_of(key.begin(), key.end(), [](char c) {
    return absl::ascii_isgraph(static_cast<unsigned char>(c));
  });
  if (key.empty() || key.size() > kMaxKeyLength || !printable) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "key is invalid (%d bytes): use 1-%d printable ASCII characters without spaces, such as "
        "Triton's hex or base32 hashes",
        key.size(), kMaxKeyLength));
  }
  return absl::OkStatus();
}

absl::Status ValidateDigest(const std::string& digest, absl::string_view field) {
  if (digest.size() != kSha256Size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has %d bytes; a SHA-256 digest is 32 raw bytes", field, digest.size()));
  }
  return absl::OkStatus();
}

absl::Status ValidateBlobName(const std::string& name) {
  const bool clean = std::none_of(name.begin(), name.end(), [](char c) {
    return c == '/' || c == '\\' || c == '\0' || absl::ascii_iscntrl(static_cast<unsigned char>(c));
  });
  if (name.empty() || name.size() > kMaxBlobNameLength || !clean || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "blob name '%s' is invalid: use 1-%d characters with no path separators or control "
        "characters (e.g. 'add_kernel.cubin')",
        absl::CHexEscape(name.substr(0, kMaxBlobNameLength)), kMaxBlobNameLength));
  }
  return absl::OkStatus();
}

absl::Status ValidateTarget(const v1::Target& target) {
  const std::string& arch = target.arch();
  size_t digits = 0;
  while (digits < arch.size() && absl::ascii_isdigit(static_cast<unsigned char>(arch[digits]))) {
    ++digits;
  }
  const bool arch_ok = (digits == 2 || digits == 3) &&
                       (arch.size() == digits ||
                        (arch.size() == digits + 1 && absl::ascii_islower(arch.back())));
  if (target.backend().empty() || !arch_ok || target.warp_size() <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "unknown target '%s:%s' (warp size %d); give a GPU target as Triton names it, e.g. "
        "backend 'cuda', arch '90' or '80', warp size 32",
        absl::CHexEscape(target.backend().substr(0, 32)), absl::CHexEscape(arch.substr(0, 32)),
        target.warp_size()));
  }
  return absl::OkStatus();
}

// The worker sets each variable for its job: a name must be one it can set.
absl::Status ValidateEnvNames(const google::protobuf::Map<std::string, std::string>& env) {
  for (const auto& [name, value] : env) {
    if (name.empty() || name.find('=') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "env variable name '%s' is invalid; send names without '=', as the environment has them",
          absl::CHexEscape(name)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateLookup(const v1::LookupRequest& request) {
  RETURN_IF_ERROR(ValidateNamespace(request.namespace_()));
  RETURN_IF_ERROR(ValidateKey(request.key()));
  for (const std::string& digest : request.have_sha256()) {
    RETURN_IF_ERROR(ValidateDigest(digest, "have_sha256"));
  }
  if (request.claimant().size() > 128) {
    return absl::InvalidArgumentError(
        "claimant is longer than 128 characters; send a short per-process identity");
  }
  if (request.renew_claim() && request.claimant().empty()) {
    return absl::InvalidArgumentError(
        "renew_claim needs the claimant that holds the claim; send the claimant of the claiming "
        "LookupOrClaim");
  }
  // kilnd keeps them (miss reasons): digests and a name, not the inputs themselves.
  const v1::KeyComponents& components = request.key_components();
  for (const std::string* part : {&components.kernel(), &components.toolchain(), &components.source(),
                                  &components.backend(), &components.options(), &components.env()}) {
    if (part->size() > 256) {
      return absl::InvalidArgumentError(
          "key_components: each is at most 256 characters; send digests of the key's inputs");
    }
  }
  return absl::OkStatus();
}

// Blobs a client sends with their data (a Put, a compile's own artifacts).
absl::Status ValidateSentBlobs(const google::protobuf::RepeatedPtrField<v1::Blob>& blobs) {
  for (const v1::Blob& blob : blobs) {
    RETURN_IF_ERROR(ValidateBlobName(blob.name()));
    if (!blob.sha256().empty()) RETURN_IF_ERROR(ValidateDigest(blob.sha256(), "blob sha256"));
    if (blob.data_omitted()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "blob '%s' is marked data_omitted; a put must carry every blob's data", blob.name()));
    }
    if (blob.size() != 0 && blob.size() != blob.data().size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "blob '%s' declares size %d but carries %d bytes", blob.name(), blob.size(),
          blob.data().size()));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRecordHits(const v1::RecordHitsRequest& request) {
  RETURN_IF_ERROR(ValidateNamespace(request.namespace_()));
  if (request.keys_size() > 10000) {
    return absl::InvalidArgumentError("record at most 10,000 hits per call; send them in batches");
  }
  for (const std::string& key : request.keys()) RETURN_IF_ERROR(ValidateKey(key));
  if (!(request.ahead_seconds_saved() >= 0 && request.ahead_seconds_saved() < 1e9)) {
    return absl::InvalidArgumentError(
        "ahead_seconds_saved must be a number of seconds, 0 or more (less than 1e9)");
  }
  return absl::OkStatus();
}

absl::Status ValidatePut(const v1::PutRequest& request) {
  RETURN_IF_ERROR(ValidateNamespace(request.namespace_()));
  RETURN_IF_ERROR(ValidateKey(request.key()));
  if (request.blobs().empty()) {
    return absl::InvalidArgumentError("put has no blobs; send at least one artifact");
  }
  return ValidateSentBlobs(request.blobs());
}

absl::Status ValidatePutMany(const v1::PutManyRequest& request) {
  if (request.entries_size() > 10000) {
    return absl::InvalidArgumentError(
        "put_many: at most 10,000 entries a call; send them in batches");
  }
  return absl::OkStatus();
}

absl::Status ValidateCompile(const v1::CompileRequest& request) {
  if (request.triton_key().empty()) {
    return absl::InvalidArgumentError(
        "triton_key is empty; send triton.runtime.cache.triton_key() of the client's Triton");
  }
  if (request.stage() == v1::STAGE_UNSPECIFIED || !v1::Stage_IsValid(request.stage())) {
    return absl::InvalidArgumentError(
        "stage is unset; say which IR `ir` holds: STAGE_TTIR (frontend TTIR), STAGE_TTGIR, "
        "STAGE_LLIR or STAGE_PTX");
  }
  if (request.ir().empty()) return absl::InvalidArgumentError("ir is empty; send the TTIR text");
  RETURN_IF_ERROR(ValidateTarget(request.target()));
  if (!request.namespace_().empty()) RETURN_IF_ERROR(ValidateNamespace(request.namespace_()));
  if (!request.cache_key().empty()) RETURN_IF_ERROR(ValidateKey(request.cache_key()));
  if (!IsJsonObject(request.options_json())) {
    return absl::InvalidArgumentError(
        "options_json is not a JSON object; send the backend options (CUDAOptions.__dict__) "
        "as JSON");
  }
  RETURN_IF_ERROR(ValidateEnvNames(request.env()));
  for (const std::string& digest : request.have_sha256()) {
    RETURN_IF_ERROR(ValidateDigest(digest, "have_sha256"));
  }
  if (!request.metadata_json().empty() && !IsJsonObject(request.metadata_json())) {
    return absl::InvalidArgumentError(
        "metadata_json is not a JSON object; send Triton's metadata dict as triton.compile "
        "writes it, or leave it empty");
  }
  if (!request.client_artifacts().empty() && request.cache_key().empty()) {
    return absl::InvalidArgumentError(
        "client_artifacts need a cache_key to be recorded under; send the Triton cache key");
  }
  return ValidateSentBlobs(request.client_artifacts());
}

absl::Status ValidateCompileInductorKernel(const v1::CompileInductorKernelRequest& request) {
  if (request.triton_key().empty()) {
    return absl::InvalidArgumentError(
        "triton_key is empty; send triton.runtime.cache.triton_key() of the client's Triton");
  }
  const std::string& name = request.kernel_name();
  const bool identifier =
      !name.empty() && name.size() <= 200 && !absl::ascii_isdigit(name.front()) &&
      std::all_of(name.begin(), name.end(), [](char c) { return absl::ascii_isalnum(c) || c == '_'; });
  if (!identifier) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kernel_name '%s' is not a Python identifier (up to 200 characters); send the kernel's "
        "name in its module",
        absl::CHexEscape(name.substr(0, 64))));
  }
  if (request.source().empty()) {
    return absl::InvalidArgumentError("source is empty; send the module inductor generated");
  }
  if (request.inductor_cache_dir().empty()) {
    return absl::InvalidArgumentError(
        "inductor_cache_dir is empty; send where the client's inductor writes its modules");
  }
  RETURN_IF_ERROR(ValidateEnvNames(request.env()));
  for (const auto& [arch, version] : request.ptxas_versions()) {
    if (arch < 0 || version.empty() || version.size() > 4096) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ptxas_versions[%d] is not an arch and what `ptxas --version` printed (up to 4096 "
          "characters)",
          arch));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidatePrewarm(const v1::PrewarmRequest& request) {
  if (request.namespace_().empty()) {
    return absl::InvalidArgumentError(
        "namespace is empty; send the recorded entry's namespace (\"triton\")");
  }
  RETURN_IF_ERROR(ValidateNamespace(request.namespace_()));
  RETURN_IF_ERROR(ValidateTarget(request.target()));
  return ValidateSentBlobs(request.recorded());
}

absl::Status ValidateBuildLauncher(const v1::BuildLauncherRequest& request) {
  if (request.c_source().empty()) {
    return absl::InvalidArgumentError("c_source is empty; send the launcher's C source");
  }
  if (!request.namespace_().empty()) RETURN_IF_ERROR(ValidateNamespace(request.namespace_()));
  if (request.python_abi().ext_suffix().empty() || request.python_abi().version().empty()) {
    return absl::InvalidArgumentError(
        "python_abi needs version and ext_suffix (sysconfig.get_config_var('EXT_SUFFIX'))");
  }
  // What Triton's make_launcher takes for the widest kernels is a few KiB.
  constexpr size_t kMaxLauncherArgs = 64 << 10;
  if (request.origin().make_launcher_args().size() > kMaxLauncherArgs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "origin.make_launcher_args is %d bytes, more than the %d a launcher's arguments take",
        request.origin().make_launcher_args().size(), kMaxLauncherArgs));
  }
  return absl::OkStatus();
}

absl::Status ValidateListEntries(const v1::ListEntriesRequest& request) {
  if (!request.namespace_().empty()) RETURN_IF_ERROR(ValidateNamespace(request.namespace_()));
  if (request.limit() > 10000) {
    return absl::InvalidArgumentError("limit: at most 10000 entries a page");
  }
  return absl::OkStatus();
}

}  // namespace kiln::service
