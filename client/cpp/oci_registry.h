#ifndef KILN_CLIENT_OCI_REGISTRY_H_
#define KILN_CLIENT_OCI_REGISTRY_H_

// Bundles in an OCI registry (`kiln push`, `kiln pull`): a bundle is an OCI
// image manifest with Kiln's own media types, one layer holding the bundle
// file as it is, and a small config describing it:
//
//   manifest: application/vnd.oci.image.manifest.v1+json,
//             artifactType application/vnd.kiln.bundle.v1
//   config:   application/vnd.kiln.bundle.config.v1+json  {"entries": N, "signed_by": "KEY ID"}
//   layer:    application/vnd.kiln.bundle.v1              the bundle file
//
// Spoken over the distribution API with https_client.h, logged in as docker
// does (registry_auth.h).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

inline constexpr absl::string_view kBundleMediaType = "application/vnd.kiln.bundle.v1";
inline constexpr absl::string_view kBundleConfigMediaType =
    "application/vnd.kiln.bundle.config.v1+json";

// REGISTRY/REPOSITORY[:TAG][@sha256:HEX]; the tag is "latest" when neither is given.
struct OciReference {
  std::string registry;    // HOST[:PORT]
  std::string repository;  // lower case, '/'-separated
  std::string tag;
  std::string digest;      // "sha256:HEX", when pinned
  std::string ToString() const;
};
absl::StatusOr<OciReference> ParseOciReference(absl::string_view text);

struct PushedBundle {
  std::string manifest_digest;  // "sha256:HEX"
  uint64_t bytes = 0;
};
// Pushes the bundle file `file` (`entries` of it, signed by `signed_by` or
// unsigned) to `reference` (its tag; a digest cannot be pushed to).
absl::StatusOr<PushedBundle> PushBundle(const std::filesystem::path& file, uint64_t entries,
                                        const std::string& signed_by,
                                        const OciReference& reference);

struct PullOptions {
  // Told the bytes received so far, as they come.
  std::function<void(uint64_t)> received;
  // Manifests ("sha256:HEX") the caller has seen before: one of them is not
  // fetched (a subscription's check costs one request).
  std::vector<std::string> known_digests;
  // Ends the pull (CANCELLED, nothing kept) when it returns true.
  std::function<bool()> cancelled;
};
struct PulledBundle {
  std::string manifest_digest;  // "sha256:HEX"
  bool known = false;           // one of `known_digests`: `file` was not written
};
// Fetches the bundle `reference` names into `file`. Its manifest must be a
// Kiln bundle's, and match the digest when the reference pins one; the
// layer's bytes must match the manifest's digest and size (DATA_LOSS naming
// both when not: nothing of it is kept).
absl::StatusOr<PulledBundle> PullBundle(const OciReference& reference,
                                        const std::filesystem::path& file,
                                        const PullOptions& options = {});

}  // namespace kiln

#endif  // KILN_CLIENT_OCI_REGISTRY_H_
