#ifndef KILN_CACHE_LRU_POLICY_H_
#define KILN_CACHE_LRU_POLICY_H_

// The artifact store's least-recently-used order, apart from SQLite: a
// logical clock that every put and every lookup advances (an entry's
// last_use is the clock's value at its latest use), lookups' uses held here
// until the maintenance thread writes them to the index in one transaction
// (so that a hit never waits for the writer), and how many of the least
// recently used entries go to bring a size down to a target.
//
// Internal to the artifact store; thread-safe.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace kiln::cache {

class LruPolicy {
 public:
  // Uses not yet written to the index: entry id -> the clock at its latest use.
  using Uses = absl::flat_hash_map<int64_t, int64_t>;

  // At the open: the clock where the last run left it, so that every use
  // from now on is later than every one recorded.
  void StartClockAt(int64_t clock) { clock_ = clock; }
  int64_t clock() const { return clock_.load(); }

  // A stored entry's first use: the clock's next value, its last_use.
  int64_t Tick() { return ++clock_; }
  // A lookup's use of `entry_id`, held until TakeUses.
  void RecordUse(int64_t entry_id);
  // The uses recorded since the last call, each entry's latest; none are
  // held after it.
  Uses TakeUses();

  // How many of `candidates`, least recently used first, go to bring `held`
  // bytes down to `target_bytes`, given what each one's going frees at most:
  // none when `held` is within the target already, every one when they free
  // too little.
  static size_t EntriesToFree(absl::Span<const uint64_t> bytes_freed_by_each, uint64_t held,
                              uint64_t target_bytes);

 private:
  std::atomic<int64_t> clock_{0};
  std::mutex uses_mutex_;
  Uses uses_;  // guarded by uses_mutex_
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_LRU_POLICY_H_
