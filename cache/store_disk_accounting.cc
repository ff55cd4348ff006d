// What the artifact store's data directory takes on disk (what the size cap
// bounds): the files the store records, measured once from its records or
// taken from the totals a clean stop saved, and what it does not record,
// measured now and then. Also the space reserve and the disk-full episodes.

#include <algorithm>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cache/artifact_store.h"
#include "cache/artifact_store_internal.h"
#include "cache/disk_usage.h"
#include "cache/sqlite.h"
#include "common/fmt_absl.h"
#include "common/platform.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;
using store_internal::kMaxReserveBytes;
using store_internal::kReserveFile;
using store_internal::kRetiredDir;

}  // namespace

absl::StatusOr<ArtifactStore::Totals> ArtifactStore::ReadTotals(sqlite::Database& db,
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
    // Gone before the first write: a kill from here on leaves no stale totals.
    RETURN_IF_ERROR(db.Exec("DELETE FROM clean_stop_totals"));
    if (stopped_cleanly) return totals;
  }
  // What the store holds and what every file it wrote takes, from its records:
  // exact without reading a directory, in one pass over each table (blobs,
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

absl::Status ArtifactStore::SaveTotalsLocked() {
  ASSIGN_OR_RETURN(
      sqlite::Statement save,
      writer_->db->Prepare("INSERT OR REPLACE INTO clean_stop_totals (id, blobs, stored_bytes, "
                           "file_blob_bytes, entries, served_bytes, use_clock, leftover_bytes) "
                           "VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7)"));
  const auto value = [](uint64_t number) { return static_cast<int64_t>(number); };
  save.Bind(1, value(blob_count_.load()))
      .Bind(2, value(stored_bytes_.load()))
      .Bind(3, value(file_blob_bytes_.load()))
      .Bind(4, value(entry_count_.load()))
      .Bind(5, value(served_files_.file_bytes()))
      .Bind(6, use_clock_.load())
      .Bind(7, value(leftover_bytes_.load()));
  return save.Run();
}

void ArtifactStore::EnsureSpaceReserve() {
  const fs::path reserve = options_.data_dir / kReserveFile;
  const uint64_t size = std::min(kMaxReserveBytes, options_.max_size_bytes / 64);
  if (FileSize(reserve) == size) return;
  std::error_code error;
  fs::remove(reserve, error);
  // Written, not sized: a sparse file would reserve nothing.
  if (!platform::WriteFileDurably(reserve, std::string(size, '\0')).ok()) {
    fs::remove(reserve, error);  // on a full disk: made again once there is room
  }
}

uint64_t ArtifactStore::DiskBytes() const {
  const fs::path db = options_.data_dir / "kiln.db";
  return BytesBesideTheIndex() + platform::AllocatedBytes(db) +
         platform::AllocatedBytes(fs::path(db).concat("-wal"));
}

uint64_t ArtifactStore::BytesBesideTheIndex() const {
  return file_blob_bytes_.load() + served_files_.bytes() + unrecorded_bytes_.load() +
         leftover_bytes_.load() +
         platform::AllocatedBytes(options_.data_dir / "kiln.db-shm");
}

uint64_t ArtifactStore::EvictionBytesLocked() {
  sqlite::Statement& pages = writer_->index_pages;
  absl::StatusOr<bool> row = pages.Step();
  const uint64_t index_bytes = row.ok() && *row ? static_cast<uint64_t>(pages.ColumnInt(0)) : 0;
  pages.Reset();
  if (!row.ok() || index_bytes == 0) return DiskBytes();
  return BytesBesideTheIndex() + index_bytes;
}

void ArtifactStore::MeasureUnrecordedBytes() {
  std::error_code error;
  served_files_.MeasureDirectories();
  uint64_t measured = platform::AllocatedBytes(options_.data_dir);
  const auto add_tree = [&](const fs::path& root) {
    measured += platform::AllocatedBytes(root);
    for (auto it = fs::recursive_directory_iterator(root, error);
         it != fs::recursive_directory_iterator(); it.increment(error)) {
      measured += platform::AllocatedBytes(it->path());
    }
  };
  for (const fs::directory_entry& top : fs::directory_iterator(options_.data_dir, error)) {
    const std::string name = top.path().filename().string();
    if (absl::StartsWith(name, "kiln.db") || name == kRetiredDir) continue;
    if (name == "files") {
      add_tree(served_files_.hits_dir());  // the rest is counted by ServedFiles
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

void ArtifactStore::NoteDiskFull(const absl::Status& status) {
  puts_refused_disk_full_.fetch_add(1);
  std::lock_guard lock(disk_full_mutex_);
  if (disk_full_since_.has_value()) return;
  disk_full_since_ = absl::Now();
  spdlog::error("cache: the disk of {} is full: results are served but not stored until there "
                "is room (free disk space, lower max_cache_size, or run kiln gc); what failed: {}",
                options_.data_dir.string(), status.message());
}

void ArtifactStore::NoteStored() {
  {
    std::lock_guard lock(disk_full_mutex_);
    if (!disk_full_since_.has_value()) return;
    disk_full_since_.reset();
  }
  spdlog::info("cache: there is room on disk again; results are stored again ({} were not)",
               puts_refused_disk_full_.load());
  EnsureSpaceReserve();
}

}  // namespace kiln::cache
