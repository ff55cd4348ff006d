// OpenRedisTier where hiredis was not found at build time (the Windows build).

#include "cache/redis/redis_tier.h"

namespace kiln::cache {

absl::StatusOr<std::unique_ptr<SharedTier>> OpenRedisTier(const RedisOptions&) {
  return absl::FailedPreconditionError(
      "this kilnd was built without Redis support (libhiredis-dev); unset redis_url or use a "
      "Linux kilnd for the shared cache");
}

}  // namespace kiln::cache
