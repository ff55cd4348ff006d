#include "cache/hit_journal.h"

#include <chrono>
#include <map>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/platform.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kJournalSuffix = ".hits";
// A client's temporary file stays this long before it counts as abandoned.
constexpr auto kAbandonedAfter = std::chrono::hours(1);

}  // namespace

uint64_t HitJournal::Collect(
    absl::FunctionRef<void(absl::string_view ns, const std::vector<std::string>& keys)> record) {
  std::lock_guard lock(collect_mutex_);
  std::error_code error;
  uint64_t taken = 0;
  const auto now = fs::file_time_type::clock::now();
  for (const fs::directory_entry& file : fs::directory_iterator(dir_, error)) {
    if (!file.is_regular_file(error)) continue;
    const fs::path path = file.path();
    if (!absl::EndsWith(path.filename().string(), kJournalSuffix)) {
      const auto written = file.last_write_time(error);
      if (!error && now - written > kAbandonedAfter) fs::remove(path, error);
      continue;
    }
    const uint64_t size = file.file_size(error);
    if (error || size > kMaxFileBytes) {
      spdlog::warn("cache: dropping hit journal {} ({} bytes, more than a client writes)",
                   path.string(), size);
      fs::remove(path, error);
      continue;
    }
    absl::StatusOr<std::string> content = platform::ReadWholeFile(path);
    // Removed before it is counted: a file that cannot be removed (held open
    // on Windows) waits for the next collection rather than counting twice.
    if (!content.ok() || !fs::remove(path, error)) continue;
    std::map<std::string, std::vector<std::string>, std::less<>> by_namespace;
    for (absl::string_view line : absl::StrSplit(*content, '\n', absl::SkipEmpty())) {
      const std::pair<absl::string_view, absl::string_view> hit =
          absl::StrSplit(line, absl::MaxSplits('\t', 1));
      if (hit.first.empty() || hit.second.empty() || hit.second.size() > kMaxKeyBytes) continue;
      by_namespace[std::string(hit.first)].emplace_back(hit.second);
    }
    for (const auto& [ns, keys] : by_namespace) {
      record(ns, keys);
      taken += keys.size();
    }
  }
  return taken;
}

}  // namespace kiln::cache
