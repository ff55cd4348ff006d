#include "service/compile_claims.h"

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "gtest/gtest.h"

namespace kiln::service {
namespace {

using Answer = CompileClaims::Answer;

// Counts a callback's runs and lets a test wait for one.
class Signal {
 public:
  std::function<void()> Callback() {
    return [this] {
      std::lock_guard lock(mutex_);
      ++count_;
      changed_.notify_all();
    };
  }
  int count() {
    std::lock_guard lock(mutex_);
    return count_;
  }
  bool WaitFor(int count, absl::Duration timeout) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                             [&] { return count_ >= count; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int count_ = 0;
};

TEST(CompileClaimsTest, FirstClaimsLaterOnesWaitAndReleaseWakesAll) {
  CompileClaims claims({absl::Seconds(60)});
  Signal holder, waiters;
  EXPECT_EQ(claims.ClaimOrWait("ns", "k", "a", true, holder.Callback(), nullptr).answer,
            Answer::kClaimed);
  EXPECT_EQ(claims.ClaimOrWait("ns", "k", "b", true, nullptr, waiters.Callback()).answer,
            Answer::kWaiting);
  EXPECT_EQ(claims.ClaimOrWait("ns", "k", "", false, nullptr, waiters.Callback()).answer,
            Answer::kWaiting);
  claims.Release("ns", "k");
  EXPECT_EQ(waiters.count(), 2);
  EXPECT_EQ(holder.count(), 1);  // the holder's call is told its claim ended
  EXPECT_EQ(claims.ClaimOrWait("ns", "k", "b", true, nullptr, nullptr).answer, Answer::kClaimed);
}

TEST(CompileClaimsTest, AbandonReleasesWaitersButNotOnceTheCompileStarted) {
  CompileClaims claims({absl::Seconds(60)});
  Signal holder, waiter;
  const auto ticket = claims.ClaimOrWait("ns", "k", "a", true, holder.Callback(), nullptr);
  claims.ClaimOrWait("ns", "k", "b", true, nullptr, waiter.Callback());
  claims.Abandon("ns", "k", ticket.claim_id + 1);  // not the holder's claim: nothing happens
  EXPECT_EQ(waiter.count(), 0);
  claims.Abandon("ns", "k", ticket.claim_id);
  EXPECT_EQ(waiter.count(), 1);
  EXPECT_EQ(holder.count(), 0);  // the holder abandoned it: nobody tells it

  Signal second;
  const auto compiling = claims.ClaimOrWait("ns", "k2", "a", true, nullptr, nullptr);
  claims.ClaimOrWait("ns", "k2", "b", true, nullptr, second.Callback());
  claims.MarkCompiling("ns", "k2");
  claims.Abandon("ns", "k2", compiling.claim_id);  // the compile goes on in kilnd
  EXPECT_EQ(second.count(), 0);
  claims.Release("ns", "k2");
  EXPECT_EQ(second.count(), 1);
}

TEST(CompileClaimsTest, TheSameClaimantTakesItsClaimOver) {
  CompileClaims claims({absl::Seconds(60)});
  Signal first_holder, waiter;
  const auto first = claims.ClaimOrWait("ns", "k", "me", true, first_holder.Callback(), nullptr);
  claims.ClaimOrWait("ns", "k", "other", true, nullptr, waiter.Callback());
  const auto again = claims.ClaimOrWait("ns", "k", "me", true, nullptr, nullptr);
  EXPECT_EQ(again.answer, Answer::kClaimed);
  EXPECT_NE(again.claim_id, first.claim_id);
  EXPECT_EQ(first_holder.count(), 1);
  EXPECT_EQ(waiter.count(), 0);  // still held, by the new call
  claims.Abandon("ns", "k", first.claim_id);  // the old call's end changes nothing now
  EXPECT_EQ(waiter.count(), 0);
  claims.Abandon("ns", "k", again.claim_id);
  EXPECT_EQ(waiter.count(), 1);
}

TEST(CompileClaimsTest, TheSameClaimantWaitsForItsCompileOnceStarted) {
  // kilnd answers a compile before it is stored: the same process's next
  // lookup of the key must wait for the store, not compile the kernel again.
  CompileClaims claims({absl::Seconds(60)});
  Signal holder, again_woken;
  claims.ClaimOrWait("ns", "k", "me", true, holder.Callback(), nullptr);
  claims.MarkCompiling("ns", "k");
  const auto again = claims.ClaimOrWait("ns", "k", "me", true, nullptr, again_woken.Callback());
  EXPECT_EQ(again.answer, Answer::kWaiting);
  EXPECT_EQ(holder.count(), 0);
  claims.Release("ns", "k");
  EXPECT_EQ(again_woken.count(), 1);
}

TEST(CompileClaimsTest, AnEmptyClaimantNeverMatchesAnother) {
  CompileClaims claims({absl::Seconds(60)});
  claims.ClaimOrWait("ns", "k", "", true, nullptr, nullptr);
  EXPECT_EQ(claims.ClaimOrWait("ns", "k", "", true, nullptr, nullptr).answer, Answer::kWaiting);
}

TEST(CompileClaimsTest, AClaimWithoutACompileLapsesAsTheLastResort) {
  CompileClaims claims({absl::Milliseconds(50)});
  Signal holder, waiter;
  claims.ClaimOrWait("ns", "k", "a", true, holder.Callback(), nullptr);
  claims.ClaimOrWait("ns", "k", "b", true, nullptr, waiter.Callback());
  EXPECT_TRUE(waiter.WaitFor(1, absl::Seconds(10)));
  EXPECT_TRUE(holder.WaitFor(1, absl::Seconds(10)));
}

TEST(CompileClaimsTest, RenewalsKeepAClaimPastItsTimeoutButNotPastTheLongestHold) {
  const ClaimLimits limits{absl::Seconds(1), absl::Seconds(4)};
  CompileClaims claims(limits);
  Signal holder, waiter;
  const absl::Time taken = absl::Now();
  const auto first = claims.ClaimOrWait("ns", "k", "a", true, holder.Callback(), nullptr);
  EXPECT_LE(first.lapses_in, limits.timeout);
  EXPECT_GT(first.lapses_in, absl::ZeroDuration());
  claims.ClaimOrWait("ns", "k", "b", true, nullptr, waiter.Callback());
  EXPECT_FALSE(claims.Renew("ns", "k", "b").has_value());  // not b's claim
  EXPECT_FALSE(claims.Renew("ns", "free", "a").has_value());  // renewing never claims
  EXPECT_EQ(claims.ClaimOrWait("ns", "free", "c", true, nullptr, nullptr).answer, Answer::kClaimed);
  // The holder renews ten times a timeout, for 2.5 timeouts.
  while (absl::Now() - taken < absl::Milliseconds(2500)) {
    absl::SleepFor(absl::Milliseconds(100));
    const std::optional<absl::Duration> left = claims.Renew("ns", "k", "a");
    ASSERT_TRUE(left.has_value());
    EXPECT_LE(*left, limits.timeout);
  }
  EXPECT_EQ(waiter.count(), 0);  // past its timeout, still held, by the same call
  EXPECT_EQ(holder.count(), 0);
  // Renewed on, it lapses at the longest hold after it was taken.
  std::optional<absl::Duration> left = absl::ZeroDuration();
  while (left.has_value() && absl::Now() - taken < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(100));
    left = claims.Renew("ns", "k", "a");
  }
  EXPECT_TRUE(waiter.WaitFor(1, absl::Seconds(10)));
  EXPECT_TRUE(holder.WaitFor(1, absl::Seconds(10)));  // its call is told
  EXPECT_GE(absl::Now() - taken, limits.longest_hold);
  EXPECT_FALSE(claims.Renew("ns", "k", "a").has_value());
}

TEST(CompileClaimsTest, AfterReleaseAllNobodyClaimsOrWaits) {
  CompileClaims claims({absl::Seconds(60)});
  Signal waiter;
  claims.ClaimOrWait("ns", "k", "a", true, nullptr, nullptr);
  claims.ClaimOrWait("ns", "k", "b", true, nullptr, waiter.Callback());
  claims.ReleaseAll();
  EXPECT_EQ(waiter.count(), 1);
  EXPECT_EQ(claims.ClaimOrWait("ns", "k", "a", true, nullptr, nullptr).answer, Answer::kNoClaim);
}

}  // namespace
}  // namespace kiln::service
