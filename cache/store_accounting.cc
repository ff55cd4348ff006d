#include "cache/store_accounting.h"

#include <algorithm>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cache/disk_usage.h"
#include "common/fmt_absl.h"
#include "common/platform.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;

// 2 MiB: room for an eviction's transaction (a batch rewrites some hundred
// pages) on a full disk.
constexpr uint64_t kMaxReserveBytes = 2 << 20;

void SubtractAtMost(std::atomic<uint64_t>& counter, uint64_t amount) {
  uint64_t held = counter.load();
  while (!counter.compare_exchange_weak(held, held - std::min(held, amount))) {
  }
}

}  // namespace

absl::StatusOr<StoreAccounting::Totals> StoreAccounting::ReadTotals(sqlite::Database& db,
                                                                    bool stopped_cleanly) {
  Totals totals;
  ASSIGN_OR_RETURN(sqlite::Statement saved,
                   db.Prepare("SELECT blobs, stored_bytes, file_blob_bytes, entries, served_bytes, "
                              "use_clock, leftover_bytes FROM clean_stop_totals"));
  ASSIGN_OR_RETURN(bool has_row, saved.Step());
  // Saved by a stop that wrote clean-stop after them; without it, anything
  // written since may not be in them.
  if (has_row && stopped_cleanly) {
    const auto column = [&saved](int index) { return static_cast<uint64_t>(saved.ColumnInt(index)); };
    totals = {column(0), column(1), column(2), column(3), column(4), column(5), column(6)};
  }
  saved.Reset();
  if (has_row) {
    RETURN_IF_ERROR(db.Exec("DELETE FROM clean_stop_totals"));
    if (stopped_cleanly) return totals;
  }
  // Exact without reading a directory, in one pass over each table (blobs,
  // with its inline data, is most of the database).
  ASSIGN_OR_RETURN(
      sqlite::Statement scan,
      db.Prepare(absl::StrCat(
          "SELECT b.rows, b.stored, b.in_files, e.rows, e.index_bytes, e.last_use, "
          "(SELECT total(disk_bytes) FROM served_copies), "
          "(SELECT total(disk_bytes) FROM leftover_files) FROM "
          "(SELECT count(*) AS rows, total(stored_size) AS stored, "
          "total(CASE WHEN location = 1 THEN (stored_size + ", kDiskBlock - 1, ") / ", kDiskBlock,
          " * ", kDiskBlock, " END) AS in_files FROM blobs) b, "
          "(SELECT count(*) AS rows, total(index_disk_bytes) AS index_bytes, "
          "max(last_use) AS last_use FROM entries) e")));
  ASSIGN_OR_RETURN(has_row, scan.Step());
  if (!has_row) return absl::InternalError("the store's totals query returned no row");
  const auto column = [&scan](int index) { return static_cast<uint64_t>(scan.ColumnInt(index)); };
  totals = {column(0), column(1), column(2), column(3), column(4) + column(6), column(5), column(7)};
  scan.Reset();
  return totals;
}

void StoreAccounting::Restore(const Totals& totals) {
  blobs_ = totals.blobs;
  stored_bytes_ = totals.stored_bytes;
  file_blob_bytes_ = totals.file_blob_bytes;
  entries_ = totals.entries;
  leftover_bytes_ = totals.leftover_bytes;
}

absl::Status StoreAccounting::SaveTotals(sqlite::Database& db, uint64_t served_bytes,
                                         uint64_t use_clock) const {
  ASSIGN_OR_RETURN(
      sqlite::Statement save,
      db.Prepare("INSERT OR REPLACE INTO clean_stop_totals (id, blobs, stored_bytes, "
                 "file_blob_bytes, entries, served_bytes, use_clock, leftover_bytes) "
                 "VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7)"));
  const auto value = [](uint64_t number) { return static_cast<int64_t>(number); };
  save.Bind(1, value(blobs_.load()))
      .Bind(2, value(stored_bytes_.load()))
      .Bind(3, value(file_blob_bytes_.load()))
      .Bind(4, value(entries_.load()))
      .Bind(5, value(served_bytes))
      .Bind(6, value(use_clock))
      .Bind(7, value(leftover_bytes_.load()));
  return save.Run();
}

void StoreAccounting::Add(const Change& change) {
  stored_bytes_ += change.stored_bytes;
  file_blob_bytes_ += change.file_blob_bytes;
  blobs_ += change.blobs;
  entries_ += change.entries;
}

void StoreAccounting::Remove(const Change& change) {
  SubtractAtMost(stored_bytes_, change.stored_bytes);
  SubtractAtMost(file_blob_bytes_, change.file_blob_bytes);
  SubtractAtMost(blobs_, change.blobs);
  SubtractAtMost(entries_, change.entries);
}

void StoreAccounting::RemoveLeftover(uint64_t disk_bytes) {
  SubtractAtMost(leftover_bytes_, disk_bytes);
}

void StoreAccounting::MeasureUnrecorded(const fs::path& hits_dir, const fs::path& retired_dir) {
  std::error_code error;
  uint64_t measured = platform::AllocatedBytes(data_dir_);
  const auto add_tree = [&](const fs::path& root) {
    measured += platform::AllocatedBytes(root);
    for (auto it = fs::recursive_directory_iterator(root, error);
         it != fs::recursive_directory_iterator(); it.increment(error)) {
      measured += platform::AllocatedBytes(it->path());
    }
  };
  for (const fs::directory_entry& top : fs::directory_iterator(data_dir_, error)) {
    const std::string name = top.path().filename().string();
    if (absl::StartsWith(name, "kiln.db") || top.path() == retired_dir) continue;
    if (name == "files") {
      add_tree(hits_dir);  // the rest is counted by ServedFiles
    } else if (name == "blobs") {
      // Its directories; the blob files are counted from their records.
      measured += platform::AllocatedBytes(top.path());
      for (const fs::directory_entry& subdir : fs::directory_iterator(top.path(), error)) {
        measured += platform::AllocatedBytes(subdir.path());
      }
    } else if (top.is_directory(error)) {
      add_tree(top.path());  // logs/
    } else {
      measured += platform::AllocatedBytes(top.path());  // the reserve, the lock, the miss log
    }
  }
  unrecorded_bytes_ = measured;
}

uint64_t StoreAccounting::DiskBytes(uint64_t served_bytes) const {
  const fs::path db = data_dir_ / "kiln.db";
  return BytesBesideTheIndex(served_bytes) + platform::AllocatedBytes(db) +
         platform::AllocatedBytes(fs::path(db).concat("-wal"));
}

uint64_t StoreAccounting::BytesBesideTheIndex(uint64_t served_bytes) const {
  return file_blob_bytes_.load() + served_bytes + unrecorded_bytes_.load() +
         leftover_bytes_.load() + platform::AllocatedBytes(data_dir_ / "kiln.db-shm");
}

uint64_t StoreAccounting::EvictionBytes(sqlite::Statement& index_pages, uint64_t served_bytes) const {
  absl::StatusOr<bool> row = index_pages.Step();
  const uint64_t index_bytes = row.ok() && *row ? static_cast<uint64_t>(index_pages.ColumnInt(0)) : 0;
  index_pages.Reset();
  if (!row.ok() || index_bytes == 0) return DiskBytes(served_bytes);
  return BytesBesideTheIndex(served_bytes) + index_bytes;
}

void StoreAccounting::EnsureSpaceReserve(uint64_t max_size_bytes) const {
  const fs::path reserve = data_dir_ / kReserveFile;
  const uint64_t size = std::min(kMaxReserveBytes, max_size_bytes / 64);
  if (FileSize(reserve) == size) return;
  std::error_code error;
  fs::remove(reserve, error);
  // Written, not sized: a sparse file would reserve nothing.
  if (!platform::WriteFileDurably(reserve, std::string(size, '\0')).ok()) {
    fs::remove(reserve, error);  // on a full disk: made again once there is room
  }
}

bool StoreAccounting::GiveUpSpaceReserve() const {
  std::error_code error;
  return fs::remove(data_dir_ / kReserveFile, error);
}

void StoreAccounting::NoteDiskFull(const absl::Status& status) {
  puts_refused_disk_full_.fetch_add(1);
  std::lock_guard lock(disk_full_mutex_);
  if (disk_full_since_.has_value()) return;
  disk_full_since_ = absl::Now();
  spdlog::error("cache: the disk of {} is full: results are served but not stored until there "
                "is room (free disk space, lower max_cache_size, or run kiln gc); what failed: {}",
                data_dir_.string(), status.message());
}

bool StoreAccounting::NoteStored() {
  {
    std::lock_guard lock(disk_full_mutex_);
    if (!disk_full_since_.has_value()) return false;
    disk_full_since_.reset();
  }
  spdlog::info("cache: there is room on disk again; results are stored again ({} were not)",
               puts_refused_disk_full_.load());
  return true;
}

std::optional<absl::Time> StoreAccounting::disk_full_since() const {
  std::lock_guard lock(disk_full_mutex_);
  return disk_full_since_;
}

}  // namespace kiln::cache
