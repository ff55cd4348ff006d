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
// Kernels for several GPUs go as an OCI image index of such manifests, each
// annotated with its target (kTargetAnnotation) and the Triton versions of
// its kernels (kTritonAnnotation), under one tag.
//
// Spoken over the distribution API with https_client.h, logged in as docker
// does (registry_auth.h). The media types and annotations, and the reading
// of what a registry answers, are oci_manifest.h's.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "oci_manifest.h"

namespace kiln {

// REGISTRY/REPOSITORY[:TAG][@sha256:HEX]; the tag is "latest" when neither is given.
struct OciReference {
  std::string registry;    // HOST[:PORT]
  std::string repository;  // lower case, '/'-separated
  std::string tag;
  std::string digest;      // "sha256:HEX", when pinned
  std::string ToString() const;
};
absl::StatusOr<OciReference> ParseOciReference(absl::string_view text);

struct BundleToPush {
  std::filesystem::path file;
  uint64_t entries = 0;
  std::string signed_by;  // the key id; empty when unsigned
  std::string target;     // "cuda:89": the GPU its kernels are for (an index's member)
  std::vector<std::string> tritons;  // "3.6.0": the Triton versions of its kernels (an index's member)
};
struct PushedBundle {
  std::string manifest_digest;  // "sha256:HEX" of the manifest, or of the index
  uint64_t bytes = 0;           // of the bundle files
};
// Pushes the bundle to `reference` (its tag; a digest cannot be pushed to).
absl::StatusOr<PushedBundle> PushBundle(const BundleToPush& bundle, const OciReference& reference);
// Pushes a bundle per GPU target, each a manifest of its own, and under the
// tag an OCI image index naming each by its target (kTargetAnnotation), as
// a multi-platform image names each platform's.
absl::StatusOr<PushedBundle> PushBundleIndex(const std::vector<BundleToPush>& bundles,
                                             const OciReference& reference);

struct PullOptions {
  // Told the bytes received so far, as they come.
  std::function<void(uint64_t)> received;
  // Manifests ("sha256:HEX") the caller has seen before: one of them is not
  // fetched (a subscription's check costs one request).
  std::vector<std::string> known_digests;
  // Of an index, the members for these GPU targets ("cuda:89") are fetched,
  // and of those, when `tritons` is given, the ones holding kernels of one
  // of these Triton versions ("3.6.0"; a member that does not say is taken).
  std::vector<std::string> targets;
  std::vector<std::string> tritons;
  // Ends the pull (CANCELLED, nothing kept) when it returns true.
  std::function<bool()> cancelled;
};
struct PulledFile {
  std::filesystem::path path;
  std::string target;  // of an index's member; empty for a plain manifest
};
struct PulledBundle {
  std::string manifest_digest;  // "sha256:HEX" of what the reference names
  bool known = false;           // one of `known_digests`: nothing was written
  std::vector<PulledFile> files;
  std::vector<std::string> index_targets;  // every target an index holds
};
// Fetches the bundle `reference` names into `file`; of an index, the members
// for `options.targets` and `options.tritons` (FAILED_PRECONDITION naming
// what it holds when none matches): into `file` for one, else FILE.TARGET.kilnbundle beside it. A
// manifest must be a Kiln bundle's and match the digest that names it (the
// reference's pin, the index's entry); the layer's bytes must match the
// manifest's digest and size (DATA_LOSS naming both when not: nothing of it
// is kept).
absl::StatusOr<PulledBundle> PullBundle(const OciReference& reference,
                                        const std::filesystem::path& file,
                                        const PullOptions& options = {});

}  // namespace kiln

#endif  // KILN_CLIENT_OCI_REGISTRY_H_
