#ifndef KILN_SERVICE_COMPILE_CLAIMS_H_
#define KILN_SERVICE_COMPILE_CLAIMS_H_

// Lets many clients that miss the same key at once run Triton's frontend only
// once: the first miss claims the key and compiles; later misses wait for the
// claimant's result instead of compiling too. Claims are per trust-domain
// namespace and key.

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace kiln::service {

class CompileClaims {
 public:
  // A claim whose holder has not started compiling within `claim_timeout`
  // (it crashed, or gave up) lapses, and its waiters are released.
  explicit CompileClaims(absl::Duration claim_timeout);
  ~CompileClaims();  // releases all
  CompileClaims(const CompileClaims&) = delete;
  CompileClaims& operator=(const CompileClaims&) = delete;

  using Wake = std::function<void()>;

  // True: the caller now holds the claim and should compile. False: another
  // caller holds it; `wake` runs once when that claim is released or lapses.
  bool ClaimOrWait(const std::string& ns, const std::string& key, Wake wake);

  // The holder's compile has started: the claim no longer lapses on its own.
  void MarkCompiling(const std::string& ns, const std::string& key);

  // The key's result is stored, or its compile failed: wakes every waiter.
  void Release(const std::string& ns, const std::string& key);

  // Ends every claim and wakes every waiter; from then on nobody waits (at
  // shutdown, so that no call is left waiting).
  void ReleaseAll();

 private:
  struct Claim {
    absl::Time lapses_at;  // InfiniteFuture once compiling
    std::vector<Wake> waiters;
  };
  void ExpireLoop();

  const absl::Duration claim_timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  absl::flat_hash_map<std::string, Claim> claims_;  // guarded; by ns + '\0' + key
  bool stopping_ = false;                           // guarded
  bool closed_ = false;                             // guarded; set by ReleaseAll
  std::thread expirer_;
};

}  // namespace kiln::service

#endif  // KILN_SERVICE_COMPILE_CLAIMS_H_
