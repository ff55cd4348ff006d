#ifndef KILN_CACHE_EVICTOR_H_
#define KILN_CACHE_EVICTOR_H_

// Eviction's loops: the store's least recently used entries go, a batch a
// transaction, until the data directory fits a size; and a capped trust
// domain's own go when it holds more than its cap
// (StoreOptions::max_domain_bytes), so that it cannot evict another's.
// EvictionCandidates says which entries come first, LruPolicy how many of a
// batch go, EntryRemoval takes them. Each batch takes the writer's mutex for
// itself, so that puts interleave, and the loops end at the next batch once a
// stop is requested.
//
// Internal to the artifact store.

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cache/entry_removal.h"
#include "cache/eviction_candidates.h"
#include "cache/maintenance_schedule.h"
#include "cache/served_files.h"
#include "cache/sqlite.h"
#include "cache/store_accounting.h"

namespace kiln::cache {

class Evictor {
 public:
  // What it works on; each must outlive it. The statements and `db` are the
  // writer's, used with `writer_mutex` held.
  struct Parts {
    std::mutex& writer_mutex;
    sqlite::Database& db;
    sqlite::Statement& index_pages;  // the database's bytes as last committed
    EvictionCandidates& candidates;
    EntryRemoval& removal;
    StoreAccounting& accounting;
    const ServedFiles& served_files;
    // Hands over the capped domains that puts went to.
    MaintenanceSchedule& schedule;
    const std::atomic<bool>& stop_requested;
    // Writes the uses lookups recorded to the index's LRU column, so that
    // a batch is chosen by the order lookups left; called with the writer held.
    std::function<absl::Status()> record_uses;
  };
  struct Limits {
    uint64_t max_size_bytes = 0;  // what the reserve is kept for
    uint64_t max_domain_bytes = 0;
  };
  Evictor(Parts parts, Limits limits) : parts_(std::move(parts)), limits_(limits) {}

  // Evicts until the data directory holds at most `target_bytes` on disk
  // (StoreStats::disk_bytes), after removing the files whose holders let go.
  // On a full disk, it gives up the space reserve to do so. Returns how many
  // entries went.
  absl::StatusOr<uint64_t> EvictToSize(uint64_t target_bytes);
  // Evicts the least recently used entries of every capped domain a put went
  // over its cap since the last call, to a tenth below it; the domains a stop
  // or an error left are looked at again on the next call. Returns how many
  // entries went.
  absl::StatusOr<uint64_t> EnforceDomainCaps();

  // Entries evicted since the store opened.
  uint64_t evicted() const { return evicted_.load(); }

 private:
  absl::StatusOr<uint64_t> EvictBatchesToSize(uint64_t target_bytes);
  // One batch of the store's least recently used entries, stopping once the
  // store fits `target_bytes`; with the writer held.
  absl::StatusOr<uint64_t> EvictBatchLocked(uint64_t target_bytes);
  absl::StatusOr<uint64_t> EnforceDomainCap(absl::string_view domain);
  // One batch of `domain`'s, while what it holds (`held`, lowered by what
  // goes) is above `target_bytes`; with the writer held.
  absl::StatusOr<uint64_t> EvictDomainBatchLocked(absl::string_view domain, uint64_t& held,
                                                  uint64_t target_bytes);
  // What eviction measures between its batches (StoreAccounting::EvictionBytes).
  uint64_t EvictionBytesLocked();

  Parts parts_;
  const Limits limits_;
  std::atomic<uint64_t> evicted_{0};
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_EVICTOR_H_
