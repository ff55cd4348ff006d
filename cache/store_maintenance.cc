// The store's upkeep: the maintenance thread (journaled hits, last-use times,
// caps, eviction, leftover files), the sweep of files a killed kilnd left
// unrecorded, a version 1 store's retired served files, and VerifyAll.

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cache/artifact_store.h"
#include "cache/artifact_store_internal.h"
#include "cache/sqlite.h"
#include "cache/wal_checkpointer.h"
#include "common/fmt_absl.h"
#include "common/platform.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;
using store_internal::kRetiredDir;

}  // namespace

bool ArtifactStore::RemoveOrphanFiles() {
  std::error_code error;
  const fs::path blob_root = options_.data_dir / "blobs";
  for (auto it = fs::recursive_directory_iterator(blob_root, error);
       it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (stop_requested_.load()) return false;
    const fs::directory_entry& file = *it;
    if (!file.is_regular_file() || file.path().parent_path().filename() == "tmp") continue;
    const std::string name = file.path().filename().string();
    if (name.size() != 2 * kSha256Size || !std::all_of(name.begin(), name.end(), absl::ascii_isxdigit)) {
      continue;
    }
    const std::string digest = absl::HexStringToBytes(name);
    std::lock_guard lock(writer_mutex_);
    absl::StatusOr<bool> recorded = writer_->blob_rows.IsFileBlob(digest);
    if (recorded.ok() && !*recorded) fs::remove(file.path(), error);
  }
  return served_files_.RemoveOrphans(
      [this](absl::string_view digest, absl::string_view extension) {
        std::lock_guard lock(writer_mutex_);
        absl::StatusOr<bool> recorded = writer_->served_file_records.IsCopyRecorded(digest, extension);
        return !recorded.ok() || *recorded;  // keep what cannot be checked
      },
      [this] { return stop_requested_.load(); });
}

void ArtifactStore::RetireUnrecordedServedFiles() {
  std::error_code error;
  const fs::path retired = options_.data_dir / kRetiredDir;
  fs::create_directories(retired, error);
  const fs::path served = served_files_.dir();
  int moved = 0;
  for (const fs::directory_entry& tree : fs::directory_iterator(served, error)) {
    if (tree.path() == served_files_.hits_dir()) continue;
    // One rename a directory: instant however many files they hold. One that
    // cannot move (a file in it held open, on Windows) is left to the sweep.
    fs::rename(tree.path(), retired / absl::StrCat(moved++, "-", tree.path().filename().string()),
               error);
  }
  spdlog::info("cache: served files of the previous version moved to {} to be deleted; local "
               "clients ask kilnd once per entry until it serves them again",
               retired.string());
}

void ArtifactStore::DeleteRetiredFiles() {
  platform::LowerCurrentThreadPriority();
  std::error_code error;
  const fs::path retired = options_.data_dir / kRetiredDir;
  // Files first, then the directories, deepest first; each step looks for a stop.
  std::vector<fs::path> directories;
  for (auto it = fs::recursive_directory_iterator(retired, error);
       it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (stop_requested_.load()) return;
    if (it->is_directory(error) && !it->is_symlink(error)) {
      directories.push_back(it->path());
    } else {
      fs::remove(it->path(), error);
    }
  }
  for (auto dir = directories.rbegin(); dir != directories.rend(); ++dir) fs::remove(*dir, error);
  fs::remove(retired, error);
}

void ArtifactStore::MeasureUnrecordedBytes() {
  served_files_.MeasureDirectories();
  accounting_.MeasureUnrecorded(served_files_.hits_dir(), options_.data_dir / kRetiredDir);
}

void ArtifactStore::MaintenanceLoop() {
  // Eviction, sweeps and counts yield the CPU to lookups: on a machine of few
  // cores, an eviction beside a stream of lookups otherwise put milliseconds
  // into their p99. (Puts that wait for an eviction batch wait a little longer.)
  // The WAL its commits grow is checkpointed here too, at this priority.
  platform::LowerCurrentThreadPriority();
  const WalCheckpointer::CommitsCheckpointThemselves at_this_priority;
  if (sweep_orphans_) {
    spdlog::info("cache: the last kilnd did not stop cleanly; sweeping files it left unrecorded");
    if (!RemoveOrphanFiles()) return;  // stopped: the next start sweeps again
    sweep_orphans_ = false;
  }
  AbandonUnfinishedImports();
  while (maintenance_schedule_.WaitForNextRound()) {
    MeasureUnrecordedBytes();
    CollectJournaledHits();
    if (absl::StatusOr<uint64_t> evicted = EnforceDomainCaps(); !evicted.ok()) {
      spdlog::error("cache: eviction of a domain over its cap failed: {}",
                    evicted.status().message());
    }
    {
      std::lock_guard writer_lock(writer_mutex_);
      if (absl::Status status = FlushTouches(); !status.ok()) {
        spdlog::warn("cache: cannot record last-use times: {}", status.message());
      }
      writer_->removal.RetryLeftovers();
      writer_->removal.RemoveCopiesPastGrace(/*all=*/false);
    }
    if (DiskBytes() > options_.max_size_bytes) {
      // Evict below the cap, not just to it, so the next put does not evict again.
      const uint64_t target = options_.max_size_bytes / 10 * 9;
      if (absl::StatusOr<uint64_t> evicted = EvictToSize(target); !evicted.ok()) {
        spdlog::error("cache: eviction failed: {}", evicted.status().message());
      }
    }
  }
}

absl::StatusOr<ArtifactStore::VerifyReport> ArtifactStore::VerifyAll() {
  VerifyReport report;
  std::vector<BrokenBlob> broken;
  {
    ASSIGN_OR_RETURN(IndexReaders::Lease reader, readers_.Acquire());
    // One read transaction: blobs dropped meanwhile by eviction are not seen.
    ASSIGN_OR_RETURN(sqlite::Statement all,
                     reader->db->Prepare("SELECT digest, coalesce(content_digest, digest), size, codec, "
                                         "location, data FROM blobs"));
    while (!stop_requested_.load()) {
      ASSIGN_OR_RETURN(bool row, all.Step());
      if (!row) break;
      ++report.blobs_checked;
      const std::string digest(all.ColumnBlob(1));
      absl::StatusOr<std::string> content =
          blobs_.Read(all.ColumnInt(3), static_cast<BlobLocation>(all.ColumnInt(4)),
                      all.ColumnBlob(5), digest, static_cast<uint64_t>(all.ColumnInt(2)),
                      BlobStorage::IntegrityCheck::kHashEverything);
      if (!content.ok()) {
        broken.push_back({std::string(all.ColumnBlob(0)), digest, std::string(content.status().message())});
      }
    }
  }
  for (const BrokenBlob& blob : broken) DropCorruptBlob(blob);
  report.corrupt_blobs = broken.size();
  return report;
}

}  // namespace kiln::cache
