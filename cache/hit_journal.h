#ifndef KILN_CACHE_HIT_JOURNAL_H_
#define KILN_CACHE_HIT_JOURNAL_H_

// Hits that local clients served themselves from the served files' index
// (served_files.h), handed to kilnd as files instead of calls: a process whose
// every lookup hit locally then never imports gRPC or connects, not even at
// exit, and kilnd still counts each hit for its stats and LRU.
//
// A client writes a batch of hits under a temporary name and renames it into
//   <served files>/hits/<anything>.hits
// one "<namespace>\t<key>\n" line per hit, <namespace> being the client's
// (as in the index). kilnd reads and deletes each such file when it collects.
// Only kilnd's own account may write there (the directory is private to it).
// A line that does not parse is skipped; a file over kMaxFileBytes is dropped
// unread; temporary files a killed client left are removed after an hour.

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"

namespace kiln::cache {

class HitJournal {
 public:
  static constexpr uint64_t kMaxFileBytes = 16 << 20;
  static constexpr size_t kMaxKeyBytes = 4096;

  explicit HitJournal(std::filesystem::path dir) : dir_(std::move(dir)) {}

  const std::filesystem::path& dir() const { return dir_; }

  // Takes every complete journal file: calls `record(namespace, keys)` once per
  // namespace a file names, then deletes the file. Returns the hits taken.
  uint64_t Collect(
      absl::FunctionRef<void(absl::string_view ns, const std::vector<std::string>& keys)> record);

 private:
  const std::filesystem::path dir_;
  std::mutex collect_mutex_;  // one collector at a time: each file is counted once
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_HIT_JOURNAL_H_
