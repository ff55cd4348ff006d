#include "service/tenant_compile_slots.h"

#include <utility>

namespace kiln::service {

void TenantCompileSlots::Run(const std::string& tenant, std::function<void()> start) {
  {
    std::lock_guard lock(mutex_);
    Queue& queue = tenants_[tenant];
    if (queue.running >= per_tenant_) {
      queue.waiting.push_back(std::move(start));
      return;
    }
    ++queue.running;
  }
  start();
}

void TenantCompileSlots::Done(const std::string& tenant) {
  std::function<void()> next;
  {
    std::lock_guard lock(mutex_);
    auto found = tenants_.find(tenant);
    if (found == tenants_.end()) return;
    Queue& queue = found->second;
    if (queue.waiting.empty()) {
      if (--queue.running == 0) tenants_.erase(found);
      return;
    }
    // The slot passes straight to the next waiter: `running` stays.
    next = std::move(queue.waiting.front());
    queue.waiting.pop_front();
  }
  next();  // outside the lock: starting a compile only schedules it
}

int TenantCompileSlots::waiting() const {
  std::lock_guard lock(mutex_);
  int total = 0;
  for (const auto& [tenant, queue] : tenants_) total += static_cast<int>(queue.waiting.size());
  return total;
}

}  // namespace kiln::service
