#ifndef KILN_CACHE_STORE_ACCOUNTING_H_
#define KILN_CACHE_STORE_ACCOUNTING_H_

// The artifact store's accounting: what it holds (entries, blob rows, their
// stored bytes) and what its data directory takes on disk, as the size cap
// counts it (StoreOptions::max_size_bytes). Kept as rows and files come and
// go, so that neither stats nor eviction counts rows or reads a directory.
// Also the totals a clean stop saves for the next open (the
// clean_stop_totals table), the space reserve, and the disk-full episodes.
//
// Internal to the artifact store. Thread-safe: the counters are atomic, and
// the store changes them once the transaction that changed its rows commits.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/sqlite.h"

namespace kiln::cache {

class StoreAccounting {
 public:
  // What the store holds, and what the files it recorded take on disk.
  struct Totals {
    uint64_t blobs = 0;
    uint64_t stored_bytes = 0;
    uint64_t file_blob_bytes = 0;  // of blob files, in whole disk blocks
    uint64_t entries = 0;
    uint64_t served_bytes = 0;  // served copies, index files and links
    uint64_t use_clock = 0;     // the LRU's clock (lru_policy.h)
    uint64_t leftover_bytes = 0;
  };
  // The totals a clean stop saved (when `stopped_cleanly`), else counted from
  // the index's records in one pass over each table; either way, the saved
  // row is gone when it returns, so a kill from then on leaves none stale.
  static absl::StatusOr<Totals> ReadTotals(sqlite::Database& db, bool stopped_cleanly);

  // Rows and bytes that a committed transaction added, or took away.
  struct Change {
    uint64_t stored_bytes = 0;
    uint64_t file_blob_bytes = 0;
    uint64_t blobs = 0;
    uint64_t entries = 0;
  };

  explicit StoreAccounting(std::filesystem::path data_dir) : data_dir_(std::move(data_dir)) {}

  // At the open: what ReadTotals found.
  void Restore(const Totals& totals);
  // At a clean stop: the totals for the next open, with the served files'
  // bytes and the LRU's clock, which other parts keep.
  absl::Status SaveTotals(sqlite::Database& db, uint64_t served_bytes, uint64_t use_clock) const;

  void Add(const Change& change);
  // Never below zero: a count that was off stays at zero, not at 2^64.
  void Remove(const Change& change);
  // Files whose removal waits (held open, or served copies in their grace).
  void AddLeftover(uint64_t disk_bytes) { leftover_bytes_ += disk_bytes; }
  void RemoveLeftover(uint64_t disk_bytes);
  // Measures what no record counts: the data directory's own directories
  // (besides blobs/ and files/, whose directories their owners count; the
  // blob directories' entries), logs, the reserve, the lock. `hits_dir`: the
  // served files' hit journal, which is not theirs to count; `retired_dir`
  // (a directory of the data directory's, emptied in the background) is not
  // counted.
  void MeasureUnrecorded(const std::filesystem::path& hits_dir,
                         const std::filesystem::path& retired_dir);

  uint64_t stored_bytes() const { return stored_bytes_.load(); }
  uint64_t entries() const { return entries_.load(); }
  uint64_t blobs() const { return blobs_.load(); }
  uint64_t file_blob_bytes() const { return file_blob_bytes_.load(); }
  uint64_t leftover_bytes() const { return leftover_bytes_.load(); }

  // StoreStats::disk_bytes: what BytesBesideTheIndex counts, and the index's
  // database file and WAL as the file system allocates them.
  uint64_t DiskBytes(uint64_t served_bytes) const;
  // Blob files, served files (`served_bytes`, which ServedFiles counts),
  // unrecorded bytes, leftovers and the index's shared-memory file.
  uint64_t BytesBesideTheIndex(uint64_t served_bytes) const;
  // The store's size as eviction measures it between its batches: the index
  // by its pages as last committed (`index_pages`, a statement selecting
  // them) rather than by its files, which a checkpoint brings to that size
  // only later, and without its WAL, which the checkpoint after the last
  // batch empties. Measuring the files, eviction took each batch's WAL pages
  // for entries still to evict, unless it checkpointed after every batch (a
  // third of its time at a million entries).
  uint64_t EvictionBytes(sqlite::Statement& index_pages, uint64_t served_bytes) const;

  // The space reserve: a file kept in the data directory so that eviction
  // has room to write its transaction when the disk is full; the smaller of
  // 2 MiB and a 64th of the cap.
  static constexpr char kReserveFile[] = "space-reserve";
  void EnsureSpaceReserve(uint64_t max_size_bytes) const;
  // Removes it, for an eviction on a full disk; false when there was none.
  bool GiveUpSpaceReserve() const;

  // A put refused for a full disk: counted, and the episode logged once.
  void NoteDiskFull(const absl::Status& status);
  // A put stored: true when that ended a disk-full episode (the caller makes
  // the reserve again).
  bool NoteStored();
  uint64_t puts_refused_disk_full() const { return puts_refused_disk_full_.load(); }
  std::optional<absl::Time> disk_full_since() const;

 private:
  const std::filesystem::path data_dir_;
  std::atomic<uint64_t> stored_bytes_{0};
  std::atomic<uint64_t> entries_{0};          // rows of entries, as committed
  std::atomic<uint64_t> blobs_{0};            // rows of blobs, as committed
  std::atomic<uint64_t> file_blob_bytes_{0};  // on disk, of blobs stored as files (blobs/)
  std::atomic<uint64_t> unrecorded_bytes_{0};  // MeasureUnrecorded
  std::atomic<uint64_t> leftover_bytes_{0};
  mutable std::mutex disk_full_mutex_;
  std::optional<absl::Time> disk_full_since_;  // guarded by disk_full_mutex_
  std::atomic<uint64_t> puts_refused_disk_full_{0};
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_STORE_ACCOUNTING_H_
