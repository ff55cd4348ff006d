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

}  // namespace kiln::cache

#endif  // KILN_CACHE_DISK_USAGE_H_
