#ifndef KILN_CACHE_SHARED_TIER_H_
#define KILN_CACHE_SHARED_TIER_H_

// A second cache level that a fleet of kilnds shares (Redis), behind each
// kilnd's own store, and the claims that make the fleet run each compile once. It holds only what kilnd derives the keys of itself
// (compile results, launcher modules): their content is a function of the key,
// so every kilnd of the fleet may serve them.
//
// It never fails a request: a lookup it cannot answer is a miss, and an
// outage is logged once and shown in the stats (within seconds, without
// waiting for a request) while kilnd goes on with its own store. While it is
// down no request waits on it; what is stored meanwhile waits in a bounded
// backlog and is written once it is back. Every blob read back is checked
// against its SHA-256 before it is used, and with a fleet secret every entry's
// signature too.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/latency_histogram.h"

namespace kiln::cache {

// {blob name, content}
using NamedContent = std::vector<std::pair<std::string, std::string>>;

struct SharedTierStats {
  std::string state;  // "off", "up", or "down since ...: reason"
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t errors = 0;  // failed calls and values that failed their check
  uint64_t stores = 0;
  uint64_t compiles_awaited = 0;  // another kilnd's compile, waited for instead of run here
  uint64_t backlog = 0;  // entries waiting to be written (an outage's, until Redis is back)
  uint64_t dropped = 0;  // entries dropped from a full backlog, never written
  // What a Fetch cost, round trips and digest checks included: what an L2
  // hit adds to a compile it saves, and what a miss adds to one it does not.
  LatencyHistogram::Summary hit_latency;
  LatencyHistogram::Summary miss_latency;
};

class SharedTier {
 public:
  virtual ~SharedTier() = default;
  // The blobs of (ns, key), each checked against its digest; nullopt on a
  // miss, an outage or a value that fails its check (logged).
  virtual std::optional<NamedContent> Fetch(absl::string_view ns, absl::string_view key) = 0;
  // Stores (ns, key) in the background, once the tier is up (the oldest
  // entries are dropped past the backlog's bounds). Ends this kilnd's claim
  // on it (AwaitTurn) once the entry is written, or at once if it cannot be.
  virtual void Offer(std::string ns, std::string key, NamedContent blobs) = 0;

  // One compile of (ns, key) across the fleet: the first kilnd to ask claims
  // it (a lease in the tier, renewed while it lasts); the others wait,
  // notified when it ends, and then Fetch the result.
  enum class Turn {
    kClaimed,      // this kilnd compiles; Offer or Release ends the claim
    kDone,         // another kilnd's result is in the tier now
    kCompileHere,  // no claim to be had or waited for (tier down, claimant gone
                   // without a result, waited `patience`): compile here
  };
  virtual Turn AwaitTurn(absl::string_view ns, absl::string_view key, absl::Duration patience) = 0;
  // kilnd is stopping: waits in AwaitTurn end now (kCompileHere), as later ones do.
  virtual void StopWaiting() = 0;
  // Ends this kilnd's claim without a result (the compile failed): waiters
  // compile themselves at once and meet the same failure.
  virtual void Release(absl::string_view ns, absl::string_view key) = 0;
  virtual SharedTierStats Stats() = 0;
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_SHARED_TIER_H_
