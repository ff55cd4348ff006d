#include "cache/maintenance_schedule.h"

namespace kiln::cache {

bool MaintenanceSchedule::WaitForNextRound() {
  std::unique_lock lock(mutex_);
  wakeup_.wait_for(lock, absl::ToChronoMilliseconds(interval_),
                   [this] { return stopping_ || over_cap_; });
  if (stopping_) return false;
  over_cap_ = false;
  return true;
}

void MaintenanceSchedule::NotePuts(const absl::flat_hash_set<absl::string_view>& capped_domains,
                                   bool over_cap) {
  if (capped_domains.empty() && !over_cap) return;
  {
    std::lock_guard lock(mutex_);
    domains_put_to_.insert(capped_domains.begin(), capped_domains.end());
    if (over_cap) over_cap_ = true;
  }
  // Only over_cap makes the round due: a domain waits for the next one.
  if (over_cap) wakeup_.notify_one();
}

absl::flat_hash_set<std::string> MaintenanceSchedule::TakeDomainsPutTo() {
  absl::flat_hash_set<std::string> domains;
  std::lock_guard lock(mutex_);
  domains.swap(domains_put_to_);
  return domains;
}

void MaintenanceSchedule::LookAgainLater(absl::Span<const std::string> domains) {
  std::lock_guard lock(mutex_);
  domains_put_to_.insert(domains.begin(), domains.end());
}

void MaintenanceSchedule::Stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wakeup_.notify_all();
}

}  // namespace kiln::cache
