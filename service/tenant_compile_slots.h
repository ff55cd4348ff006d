#ifndef KILN_SERVICE_TENANT_COMPILE_SLOTS_H_
#define KILN_SERVICE_TENANT_COMPILE_SLOTS_H_

#include <deque>
#include <functional>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"

namespace kiln::service {

// At most `per_tenant` compiles of one farm tenant run at once; the others
// wait in that tenant's own queue. A tenant that floods the farm then delays
// only itself: another tenant's compile still finds a free worker.
class TenantCompileSlots {
 public:
  explicit TenantCompileSlots(int per_tenant) : per_tenant_(per_tenant) {}

  // Calls `start` now, or once one of the tenant's running compiles is Done.
  // Each started compile must end with exactly one Done(tenant).
  void Run(const std::string& tenant, std::function<void()> start);
  void Done(const std::string& tenant);

  // Compiles waiting for a slot, all tenants together.
  int waiting() const;

 private:
  struct Queue {
    int running = 0;
    std::deque<std::function<void()>> waiting;
  };
  const int per_tenant_;
  mutable std::mutex mutex_;
  absl::flat_hash_map<std::string, Queue> tenants_;
};

}  // namespace kiln::service

#endif  // KILN_SERVICE_TENANT_COMPILE_SLOTS_H_
