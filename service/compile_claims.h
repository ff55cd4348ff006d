#ifndef KILN_SERVICE_COMPILE_CLAIMS_H_
#define KILN_SERVICE_COMPILE_CLAIMS_H_

// Lets many clients that miss the same key at once run Triton's frontend only
// once: the first miss claims the key and compiles; later misses wait for the
// claimant's result instead of compiling too. Claims are per trust-domain
// namespace and key.
//
// One lifetime rule: a claim lasts while its holder is alive and working on
// it. It ends when the key's result is stored or its compile fails (Release),
// when the holder goes away before its compile started (Abandon: its call
// ended, its connection dropped, its process died), and, as the last resort
// for a holder that is alive but stuck, `timeout` after it was taken or last
// renewed (Renew) if no compile has started: a compile the client runs itself
// (an inductor graph) keeps its claim past `timeout` by renewing it, but never
// past `longest_hold` after it was taken. When the same claimant asks again it
// takes its claim over rather than waiting on itself. Whenever a claim ends,
// every waiter is woken to look again: it then finds the result or compiles
// itself.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace kiln::service {

struct ClaimLimits {
  absl::Duration timeout = absl::Seconds(60);
  absl::Duration longest_hold = absl::Minutes(10);
};

class CompileClaims {
 public:
  // Told of a claim that ended with nothing stored and no compile started
  // (abandoned or lapsed), outside the lock: its key's next miss is no
  // eviction (MissLog).
  using Unfinished = std::function<void(const std::string& ns, const std::string& key)>;
  explicit CompileClaims(ClaimLimits limits, Unfinished unfinished = nullptr);
  ~CompileClaims();  // releases all
  CompileClaims(const CompileClaims&) = delete;
  CompileClaims& operator=(const CompileClaims&) = delete;

  // Callbacks run once, never under the claims' lock, on the thread that
  // ended the claim.
  using Wake = std::function<void()>;   // a waiter: the claim it waited on ended
  using Ended = std::function<void()>;  // the holder: its claim ended without it

  enum class Answer { kClaimed, kWaiting, kNoClaim };
  struct Ticket {
    Answer answer;
    uint64_t claim_id = 0;  // identifies a kClaimed claim for Abandon
    // kClaimed: the claim lapses then, unless renewed or compiling by then.
    absl::Duration lapses_in = absl::ZeroDuration();
  };

  // kClaimed: the caller now holds the claim and should compile; `ended` runs
  // if the claim ends other than by the caller's own Abandon. kWaiting: another
  // caller holds it; `wake` runs once when that claim ends. A `claimant` that
  // already holds the key (the same process asking again) takes the claim
  // over, unless its compile has started (MarkCompiling): then it waits for
  // that compile as others do. An empty claimant never matches another. With
  // `may_claim` false a free key answers kNoClaim instead of being claimed.
  Ticket ClaimOrWait(const std::string& ns, const std::string& key, const std::string& claimant,
                     bool may_claim, Ended ended, Wake wake);

  // `claimant`, holding the key, is still working on it: the claim lapses
  // `timeout` from now, but not later than `longest_hold` after it was taken.
  // How long it has left; nullopt when the key is not claimed by `claimant`
  // (any more). Never takes a free key.
  std::optional<absl::Duration> Renew(const std::string& ns, const std::string& key,
                                      const std::string& claimant);

  // The holder's compile has started: from now on only Release ends the claim.
  void MarkCompiling(const std::string& ns, const std::string& key);

  // The key's result is stored, or its compile failed: wakes every waiter.
  void Release(const std::string& ns, const std::string& key);

  // The holder of `claim_id` went away. Ends the claim unless its compile has
  // started (that compile's Release ends it) or the claim is no longer its.
  void Abandon(const std::string& ns, const std::string& key, uint64_t claim_id);

  // Ends every claim and wakes every waiter; from then on nobody waits (at
  // shutdown, so that no call is left waiting).
  void ReleaseAll();

 private:
  struct Claim {
    std::string ns;
    std::string key;
    uint64_t id = 0;
    std::string claimant;
    absl::Time taken_at;   // by this claimant, first
    absl::Time lapses_at;  // InfiniteFuture once compiling
    Ended ended;
    std::vector<Wake> waiters;

    // Its compile has started in kilnd (MarkCompiling): only Release ends it.
    bool compiling() const { return lapses_at == absl::InfiniteFuture(); }
  };
  // Removes the claim and returns what must run outside the lock.
  std::vector<std::function<void()>> EndLocked(
      absl::flat_hash_map<std::string, Claim>::iterator claim, bool tell_holder);
  void ExpireLoop();

  // What runs `unfinished_` for `claim`, outside the lock.
  std::function<void()> TellUnfinished(const Claim& claim) const;

  const ClaimLimits limits_;
  const Unfinished unfinished_;
  std::mutex mutex_;
  std::condition_variable changed_;
  absl::flat_hash_map<std::string, Claim> claims_;  // guarded; by ns + '\0' + key
  uint64_t next_claim_id_ = 1;                      // guarded
  bool stopping_ = false;                           // guarded
  bool closed_ = false;                             // guarded; set by ReleaseAll
  std::thread expirer_;
};

}  // namespace kiln::service

#endif  // KILN_SERVICE_COMPILE_CLAIMS_H_
