#include "cache/trusted_stamps.h"

namespace kiln::cache {

bool TrustedStamps::Unchanged(absl::string_view key, const platform::FileStamp& stamp) {
  std::lock_guard lock(mutex_);
  auto found = stamps_.find(key);
  return found != stamps_.end() && found->second == stamp;
}

void TrustedStamps::Remember(absl::string_view key, const platform::FileStamp& stamp) {
  if (platform::ChangeTime(stamp) >= absl::Now() - trust_changed_before_) return;
  std::lock_guard lock(mutex_);
  stamps_[key] = stamp;
}

void TrustedStamps::Forget(absl::string_view key) {
  std::lock_guard lock(mutex_);
  stamps_.erase(key);
}

}  // namespace kiln::cache
