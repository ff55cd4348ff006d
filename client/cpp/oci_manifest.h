#ifndef KILN_CLIENT_OCI_MANIFEST_H_
#define KILN_CLIENT_OCI_MANIFEST_H_

// The OCI documents of a bundle (oci_registry.h describes them) as a pull
// reads them: a registry's text in, what to fetch out. No I/O, so that a
// hostile registry's manifests can be fuzzed without one
// (tests/fuzz/oci_manifest_fuzzer.cc). `reference` in each is the pulled
// reference as OciReference::ToString writes it, for messages.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

inline constexpr absl::string_view kManifestMediaType = "application/vnd.oci.image.manifest.v1+json";
inline constexpr absl::string_view kIndexMediaType = "application/vnd.oci.image.index.v1+json";
inline constexpr absl::string_view kBundleMediaType = "application/vnd.kiln.bundle.v1";
inline constexpr absl::string_view kBundleConfigMediaType =
    "application/vnd.kiln.bundle.config.v1+json";

// The annotation of an index's member that names its GPU target ("cuda:89").
inline constexpr absl::string_view kTargetAnnotation = "dev.kiln.target";
// The annotation of an index's member that names the Triton versions of its
// kernels ("3.5.1,3.6.0"): a kilnd with toolchains of none has no use for it.
inline constexpr absl::string_view kTritonAnnotation = "dev.kiln.triton";

// A JSON string's characters as they may stand between its quotes in these
// documents: what Kiln writes (targets, key ids, digests) never needs
// escaping, so anything else is refused rather than escaped.
bool PlainJsonText(absl::string_view text);

struct BundleLayer {
  std::string digest;  // as the manifest gives it: unchecked until the bytes come
  uint64_t size = 0;
};
// The layer of a bundle's manifest. DATA_LOSS when `text` is not a JSON object;
// INVALID_ARGUMENT when it is not a Kiln bundle's (one layer of
// kBundleMediaType, a config of kBundleConfigMediaType) or gives the layer
// no whole size.
absl::StatusOr<BundleLayer> ParseBundleManifest(absl::string_view text, absl::string_view reference);

struct IndexMember {
  std::string target;
  std::string digest;  // "sha256:HEX" of its manifest
};
struct IndexChoice {
  std::vector<IndexMember> chosen;
  std::vector<std::string> targets;  // every target the index holds
};
// Of the top document a reference names, when it is an index: its members
// for `targets` and, when `tritons` is given, of one of those Triton
// versions (a member that names none is taken). nullopt when `text` is a
// single bundle's manifest. DATA_LOSS when it is not a JSON object;
// INVALID_ARGUMENT when the index holds no Kiln bundle or a chosen member
// names no valid digest; FAILED_PRECONDITION naming what it holds when no
// member matches.
absl::StatusOr<std::optional<IndexChoice>> ChooseIndexMembers(absl::string_view text,
                                                               absl::string_view reference,
                                                               const std::vector<std::string>& targets,
                                                               const std::vector<std::string>& tritons);

}  // namespace kiln

#endif  // KILN_CLIENT_OCI_MANIFEST_H_
