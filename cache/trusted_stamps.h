#ifndef KILN_CACHE_TRUSTED_STAMPS_H_
#define KILN_CACHE_TRUSTED_STAMPS_H_

// Files whose content matched their digest, with the stamp they had then: a
// file whose stamp is still that one needs no hashing. Used for blob files
// and for served files alike.
//
// File systems keep times in coarse ticks, so a second change within the
// tick of the first could keep the stamp (git's "racy" rule): a stamp is
// remembered only for a file that last changed at least `trust_changed_before`
// before it was taken; younger files are hashed on every use.

#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/platform.h"

namespace kiln::cache {

class TrustedStamps {
 public:
  explicit TrustedStamps(absl::Duration trust_changed_before)
      : trust_changed_before_(trust_changed_before) {}

  // True when the file named `key` had `stamp` when its content last matched.
  bool Unchanged(absl::string_view key, const platform::FileStamp& stamp);

  // Remembers that the file named `key` matched its digest with `stamp`,
  // unless it changed too recently for its stamp to be trusted.
  void Remember(absl::string_view key, const platform::FileStamp& stamp);

  void Forget(absl::string_view key);

 private:
  const absl::Duration trust_changed_before_;
  std::mutex mutex_;
  absl::flat_hash_map<std::string, platform::FileStamp> stamps_;  // guarded by mutex_
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_TRUSTED_STAMPS_H_
