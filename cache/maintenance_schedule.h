#ifndef KILN_CACHE_MAINTENANCE_SCHEDULE_H_
#define KILN_CACHE_MAINTENANCE_SCHEDULE_H_

// When the store's maintenance thread runs a round (journaled hits, last-use
// times, leftover files, caps, eviction): every `interval`, or at once when a
// put took the store over its size cap; and which capped trust domains puts
// went to since the last round looked. A stop ends the wait at once.
//
// Internal to the artifact store. Thread-safe.

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace kiln::cache {

class MaintenanceSchedule {
 public:
  explicit MaintenanceSchedule(absl::Duration interval) : interval_(interval) {}

  // Waits until the next round is due: `interval` passed, or a put took the
  // store over its cap. False at a stop.
  bool WaitForNextRound();

  // Puts were stored: into `capped_domains` (which EnforceDomainCaps looks at
  // next), and, when `over_cap`, past the store's cap, which starts the next
  // round at once.
  void NotePuts(const absl::flat_hash_set<absl::string_view>& capped_domains, bool over_cap);
  // The capped domains puts went to since the last call.
  absl::flat_hash_set<std::string> TakeDomainsPutTo();
  // Domains a round did not get to (a stop, an error): the next looks at them.
  void LookAgainLater(absl::Span<const std::string> domains);

  // Ends the wait, now and from now on.
  void Stop();

 private:
  const absl::Duration interval_;
  std::mutex mutex_;
  std::condition_variable wakeup_;
  bool stopping_ = false;                            // guarded by mutex_
  bool over_cap_ = false;                            // guarded by mutex_
  absl::flat_hash_set<std::string> domains_put_to_;  // guarded by mutex_
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_MAINTENANCE_SCHEDULE_H_
