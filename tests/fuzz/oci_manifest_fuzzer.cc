// Feeds what a registry (or a user) hands a pull: the first byte picks the
// reader, the second the targets and Tritons asked of an index, the rest is
// the text.
//   0: a bundle's manifest, ParseBundleManifest (client/cpp/oci_manifest.h):
//      refused with DATA_LOSS or INVALID_ARGUMENT, or a layer of at most 2^53 bytes;
//   1: an index, ChooseIndexMembers: refused with DATA_LOSS, INVALID_ARGUMENT
//      or FAILED_PRECONDITION, or members of the targets asked for, each
//      with a valid digest;
//   2: a reference, ParseOciReference (client/cpp/oci_registry.h): one it
//      reads, written back by ToString, reads the same.
// Traps where one does otherwise.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "client/cpp/oci_manifest.h"
#include "client/cpp/oci_registry.h"

namespace {

constexpr absl::string_view kReference = "registry.example/team/kernels:v1";

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "oci_manifest_fuzzer: %s: %s\n", what, detail.c_str());
  std::abort();
}

void Manifest(absl::string_view text) {
  const absl::StatusOr<kiln::BundleLayer> layer = kiln::ParseBundleManifest(text, kReference);
  if (!layer.ok()) {
    if (!absl::IsDataLoss(layer.status()) && !absl::IsInvalidArgument(layer.status())) {
      Fail("an unexpected refusal", layer.status().ToString());
    }
    return;
  }
  if (layer->size > (uint64_t{1} << 53)) Fail("a size past 2^53", layer->digest);
}

void Index(uint8_t choice, absl::string_view text) {
  std::vector<std::string> targets;
  if (choice & 1) targets.push_back("cuda:89");
  if (choice & 2) targets.push_back("cuda:90");
  std::vector<std::string> tritons;
  if (choice & 4) tritons.push_back("3.6.0");
  const absl::StatusOr<std::optional<kiln::IndexChoice>> index =
      kiln::ChooseIndexMembers(text, kReference, targets, tritons);
  if (!index.ok()) {
    if (!absl::IsDataLoss(index.status()) && !absl::IsInvalidArgument(index.status()) &&
        !absl::IsFailedPrecondition(index.status())) {
      Fail("an unexpected refusal", index.status().ToString());
    }
    return;
  }
  if (!index->has_value()) return;  // a single bundle's manifest
  if ((*index)->chosen.empty() || (*index)->targets.empty()) Fail("an index choice of nothing", "");
  for (const kiln::IndexMember& member : (*index)->chosen) {
    if (!absl::c_linear_search(targets, member.target)) Fail("a member not asked for", member.target);
    if (!absl::StartsWith(member.digest, "sha256:") || member.digest.size() != 71) {
      Fail("a member with no valid digest", member.digest);
    }
  }
}

void Reference(absl::string_view text) {
  const absl::StatusOr<kiln::OciReference> reference = kiln::ParseOciReference(text);
  if (!reference.ok()) {
    if (!absl::IsInvalidArgument(reference.status())) Fail("an unexpected refusal", reference.status().ToString());
    return;
  }
  const std::string written = reference->ToString();
  const absl::StatusOr<kiln::OciReference> again = kiln::ParseOciReference(written);
  if (!again.ok() || again->ToString() != written || again->registry != reference->registry ||
      again->repository != reference->repository || again->tag != reference->tag ||
      again->digest != reference->digest) {
    Fail("a reference that does not read back as it was written", written);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  switch (data[0] % 3) {
    case 0: Manifest(text); break;
    case 1: Index(data[1], text); break;
    case 2: Reference(text); break;
  }
  return 0;
}
