#ifndef KILN_CACHE_DISK_USAGE_H_
#define KILN_CACHE_DISK_USAGE_H_

// What files and directories take on disk, as the cache's size cap counts
// it: file systems allocate whole blocks, so a 100-byte index file or a
// directory of a few names takes a block (4 KiB on ext4, NTFS and tmpfs).

#include <cstdint>
#include <filesystem>
#include <system_error>

namespace kiln::cache {

inline constexpr uint64_t kDiskBlock = 4096;

// What a file of `size` bytes takes on disk.
inline uint64_t OnDisk(uint64_t size) { return (size + kDiskBlock - 1) / kDiskBlock * kDiskBlock; }

// The size of the file at `path`; 0 when it is not there.
inline uint64_t FileSize(const std::filesystem::path& path) {
  std::error_code error;
  const uint64_t size = std::filesystem::file_size(path, error);
  return error ? 0 : size;
}

// What the file at `path` takes on disk now; 0 when it is not there.
inline uint64_t OnDiskNow(const std::filesystem::path& path) { return OnDisk(FileSize(path)); }

// Creates `dir` and the missing directories above it; returns what those it
// made take on disk (a block each).
inline uint64_t CreateDirectoriesCounted(const std::filesystem::path& dir) {
  std::error_code error;
  uint64_t made = 0;
  for (std::filesystem::path missing = dir;
       !missing.empty() && !std::filesystem::exists(missing, error);
       missing = missing.parent_path()) {
    made += kDiskBlock;
  }
  std::filesystem::create_directories(dir, error);
  return error ? 0 : made;
}

}  // namespace kiln::cache

#endif  // KILN_CACHE_DISK_USAGE_H_
