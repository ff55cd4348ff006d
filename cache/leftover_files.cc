#include "cache/leftover_files.h"

#include <string>
#include <utility>
#include <vector>

#include "common/fmt_absl.h"
#include "common/platform.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;

// Removes `path`; false when it is still there (held open by another process).
bool RemoveFile(const fs::path& path) {
  std::error_code error;
  return fs::remove(path, error) || !fs::exists(path, error);
}

}  // namespace

absl::Status LeftoverFiles::Prepare(sqlite::Database& writer) {
  ASSIGN_OR_RETURN(record_, writer.Prepare("INSERT OR REPLACE INTO leftover_files (path, disk_bytes) "
                                           "VALUES (?1, ?2)"));
  ASSIGN_OR_RETURN(recorded_, writer.Prepare("SELECT path, disk_bytes FROM leftover_files LIMIT 1000"));
  ASSIGN_OR_RETURN(forget_, writer.Prepare("DELETE FROM leftover_files WHERE path = ?1"));
  return absl::OkStatus();
}

void LeftoverFiles::Remove(const fs::path& file) {
  if (RemoveFile(file)) return;
  Record({file, platform::AllocatedBytes(file)});
}

void LeftoverFiles::Record(const ServedFiles::Leftover& leftover) {
  spdlog::info("cache: {} is held open by another process; it is deleted once let go",
               leftover.path.string());
  accounting_.AddLeftover(leftover.disk_bytes);
  const std::string relative = leftover.path.lexically_relative(data_dir_).generic_string();
  if (absl::Status status =
          record_.BindText(1, relative).Bind(2, static_cast<int64_t>(leftover.disk_bytes)).Run();
      !status.ok()) {
    // Counted still: a restart no longer knows it, and counts the disk afresh.
    spdlog::warn("cache: {} not recorded for deletion: {}", leftover.path.string(),
                 status.message());
  }
}

void LeftoverFiles::RetryRecorded(RecordedAgain recorded_again) {
  std::vector<std::pair<std::string, uint64_t>> leftovers;
  absl::StatusOr<bool> row;
  while ((row = recorded_.Step()).ok() && *row) {
    leftovers.emplace_back(recorded_.ColumnText(0), static_cast<uint64_t>(recorded_.ColumnInt(1)));
  }
  recorded_.Reset();
  for (const auto& [relative, disk_bytes] : leftovers) {
    const fs::path path = data_dir_ / fs::path(relative);
    if (!recorded_again(path) && !RemoveFile(path)) continue;  // still held
    accounting_.RemoveLeftover(disk_bytes);
    forget_.BindText(1, relative).Run().IgnoreError();
  }
}

void LeftoverFiles::KeepForGrace(ServedFiles::Leftover copy, absl::Time since) {
  accounting_.AddLeftover(copy.disk_bytes);
  copies_in_grace_.push_back({since, std::move(copy)});
}

void LeftoverFiles::RemoveCopiesPastGrace(absl::Time now, RecordedAgain recorded_again, bool all) {
  while (!copies_in_grace_.empty() &&
         (all || now - copies_in_grace_.front().since >= served_copy_grace_)) {
    const ServedFiles::Leftover copy = std::move(copies_in_grace_.front().copy);
    copies_in_grace_.pop_front();
    accounting_.RemoveLeftover(copy.disk_bytes);
    if (recorded_again(copy.path)) continue;
    // One held open (Windows) is tried again as any leftover is.
    if (!RemoveFile(copy.path)) Record(copy);
  }
}

std::optional<absl::Time> LeftoverFiles::LastGraceEnds() const {
  if (copies_in_grace_.empty()) return std::nullopt;
  return copies_in_grace_.back().since + served_copy_grace_;
}

}  // namespace kiln::cache
