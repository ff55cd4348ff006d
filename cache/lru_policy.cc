#include "cache/lru_policy.h"

#include <algorithm>

namespace kiln::cache {

void LruPolicy::RecordUse(int64_t entry_id) {
  std::lock_guard lock(uses_mutex_);
  // Ticked under the lock: a later use of the same entry cannot be
  // overwritten by an earlier one's value.
  uses_[entry_id] = ++clock_;
}

LruPolicy::Uses LruPolicy::TakeUses() {
  Uses taken;
  std::lock_guard lock(uses_mutex_);
  taken.swap(uses_);
  return taken;
}

size_t LruPolicy::EntriesToFree(absl::Span<const uint64_t> bytes_freed_by_each, uint64_t held,
                                uint64_t target_bytes) {
  uint64_t freeing = 0;
  size_t taken = 0;
  while (taken < bytes_freed_by_each.size() && held - std::min(held, freeing) > target_bytes) {
    freeing += bytes_freed_by_each[taken];
    ++taken;
  }
  return taken;
}

}  // namespace kiln::cache
