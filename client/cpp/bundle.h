#ifndef KILN_CLIENT_BUNDLE_H_
#define KILN_CLIENT_BUNDLE_H_

// Bundle files of cache entries (`kiln export`, `kiln import`): a cache to
// ship, e.g. in a Docker image or beside a ComfyUI node pack.
//
//   "KILNBUNDLE 1\n"
//   ( u32 little-endian length, kiln.v1.BundleEntry ) *
//   "END " SHA-256 of every byte before it
//
// Each blob carries its SHA-256 too. A bundle is read whole and checked
// before anything is used: one changed byte anywhere refuses all of it.

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/v1/kiln.pb.h"

namespace kiln {

class BundleWriter {
 public:
  void Add(const v1::BundleEntry& entry);
  size_t entries() const { return entries_; }
  // Writes the bundle to `path` (through a temporary file beside it).
  absl::Status Finish(const std::filesystem::path& path);

 private:
  std::string content_ = "KILNBUNDLE 1\n";
  size_t entries_ = 0;
};

// The entries of the bundle at `path`, every digest checked. INVALID_ARGUMENT
// naming what is wrong (not a bundle, damaged, truncated) otherwise.
absl::StatusOr<std::vector<v1::BundleEntry>> ReadBundle(const std::filesystem::path& path);

}  // namespace kiln

#endif  // KILN_CLIENT_BUNDLE_H_
