#ifndef KILN_CACHE_REDIS_REDIS_TIER_H_
#define KILN_CACHE_REDIS_REDIS_TIER_H_

// The fleet's SharedTier on Redis (hiredis). A library of its own, which only
// kilnd's main links: nothing else of the store knows Redis is there.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/shared_tier.h"

namespace kiln::cache {

struct RedisOptions {
  std::string url;     // redis://[:PASSWORD@]HOST[:PORT][/DB]
  std::string prefix;  // every key starts with it: one farm's keys apart from others'
  // The fleet's secret (redis_secret_file): each entry is signed with it
  // (HMAC-SHA256 of its key and listing), and an entry without a valid
  // signature is never served, so whoever can write to Redis without the
  // secret cannot make the fleet serve their bytes. Empty: entries are
  // trusted as any writer left them (only their digests are checked).
  std::string secret;
  // How long a write may wait on Redis, and a lookup: a request waiting for
  // a hung Redis pays lookup_timeout once, and the tier is then down.
  absl::Duration timeout = absl::Seconds(2);
  absl::Duration lookup_timeout = absl::Milliseconds(250);
};

// INVALID_ARGUMENT for a URL that does not parse; FAILED_PRECONDITION in a
// kilnd built without Redis support. Connects on first use, not here.
absl::StatusOr<std::unique_ptr<SharedTier>> OpenRedisTier(const RedisOptions& options);

}  // namespace kiln::cache

#endif  // KILN_CACHE_REDIS_REDIS_TIER_H_
