#ifndef KILN_CACHE_GROUP_COMMIT_H_
#define KILN_CACHE_GROUP_COMMIT_H_

// Group commit: callers queue items and return once theirs are committed.
// Whoever finds no commit running commits what is queued, at most
// `max_per_commit` items at a time, until its own items are done; the others
// wait for theirs. Items that arrive while a commit runs share the next one,
// so sixteen writers pay for about one commit, not sixteen, and a waiter
// never queues for the committer just to learn it is done. Groups are taken
// in the order items were queued, so a caller's last item is done last.
//
// The commit function runs on one caller's thread at a time, outside this
// type's lock. Thread-safe.

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/types/span.h"

namespace kiln::cache {

template <typename Item>
class GroupCommit {
 public:
  using CommitFunction = std::function<void(const std::vector<Item*>& group)>;

  GroupCommit(size_t max_per_commit, CommitFunction commit)
      : max_per_commit_(max_per_commit), commit_(std::move(commit)) {}

  // Queues `items` (which must stay alive until this returns) and returns
  // once each of them has been in a group passed to the commit function.
  void Commit(absl::Span<Item* const> items) {
    if (items.empty()) return;
    std::unique_lock lock(mutex_);
    queue_.insert(queue_.end(), items.begin(), items.end());
    queued_ += items.size();
    const uint64_t mine_through = queued_;  // the items up to mine, counted since the start
    while (committed_ < mine_through) {
      if (committing_) {
        committed_wakeup_.wait(lock);
        continue;
      }
      committing_ = true;
      const size_t taken = std::min(queue_.size(), max_per_commit_);
      std::vector<Item*> group(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(taken));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(taken));
      lock.unlock();
      commit_(group);
      lock.lock();
      committed_ += taken;
      committing_ = false;
      committed_wakeup_.notify_all();
    }
  }

 private:
  const size_t max_per_commit_;
  const CommitFunction commit_;
  std::mutex mutex_;
  std::deque<Item*> queue_;   // guarded by mutex_
  uint64_t queued_ = 0;       // items ever queued; guarded by mutex_
  uint64_t committed_ = 0;    // items ever committed; guarded by mutex_
  bool committing_ = false;   // guarded by mutex_
  std::condition_variable committed_wakeup_;
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_GROUP_COMMIT_H_
