// Tests of the store's least-recently-used order alone (cache/lru_policy.h):
// its clock, the uses it holds for the index, and how many entries go.

#include "cache/lru_policy.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kiln::cache {
namespace {

TEST(LruPolicyTest, EveryUseIsLaterThanEveryOneBeforeItAcrossARestart) {
  LruPolicy lru;
  lru.StartClockAt(100);  // where the last run left it
  const int64_t stored = lru.Tick();
  EXPECT_EQ(stored, 101);
  lru.RecordUse(7);
  EXPECT_EQ(lru.TakeUses().at(7), 102);
  EXPECT_GT(lru.Tick(), 102);
  EXPECT_EQ(lru.clock(), 103);
}

TEST(LruPolicyTest, AnEntryUsedTwiceIsHeldAtItsLatestUseAndTakenOnce) {
  LruPolicy lru;
  lru.RecordUse(1);
  lru.RecordUse(2);
  lru.RecordUse(1);
  const LruPolicy::Uses uses = lru.TakeUses();
  ASSERT_EQ(uses.size(), 2u);
  EXPECT_GT(uses.at(1), uses.at(2)) << "1 was used after 2";
  EXPECT_TRUE(lru.TakeUses().empty()) << "taken uses are not held again";
}

TEST(LruPolicyTest, UsesFromManyThreadsAreEachHeldAtTheirLatest) {
  LruPolicy lru;
  constexpr int kThreads = 4;
  constexpr int kUsesEach = 5000;
  LruPolicy::Uses taken;
  std::atomic<bool> done{false};
  // The maintenance thread takes uses while lookups record them.
  std::thread taker([&] {
    while (!done.load()) {
      for (const auto& [id, last_use] : lru.TakeUses()) {
        int64_t& kept = taken[id];
        kept = std::max(kept, last_use);
      }
    }
  });
  std::vector<std::thread> lookups;
  for (int t = 0; t < kThreads; ++t) {
    lookups.emplace_back([&lru, t] {
      for (int i = 0; i < kUsesEach; ++i) lru.RecordUse(t * kUsesEach + i % 100);
    });
  }
  for (std::thread& lookup : lookups) lookup.join();
  done = true;
  taker.join();
  for (const auto& [id, last_use] : lru.TakeUses()) {
    int64_t& kept = taken[id];
    kept = std::max(kept, last_use);
  }
  EXPECT_EQ(taken.size(), static_cast<size_t>(kThreads * 100));
  EXPECT_EQ(lru.clock(), kThreads * kUsesEach);
  int64_t latest = 0;
  for (const auto& [id, last_use] : taken) latest = std::max(latest, last_use);
  EXPECT_EQ(latest, lru.clock()) << "the last use is held at the clock's last value";
}

TEST(LruPolicyTest, AsManyEntriesGoAsBringTheSizeToTheTarget) {
  const std::vector<uint64_t> bytes = {100, 200, 300, 400};
  EXPECT_EQ(LruPolicy::EntriesToFree(bytes, 1000, 900), 1u);
  EXPECT_EQ(LruPolicy::EntriesToFree(bytes, 1000, 899), 2u);
  EXPECT_EQ(LruPolicy::EntriesToFree(bytes, 1000, 700), 2u) << "exactly at the target";
  EXPECT_EQ(LruPolicy::EntriesToFree(bytes, 1000, 0), 4u);
}

TEST(LruPolicyTest, NoneGoWithinTheTargetAndAllGoWhenTheyFreeTooLittle) {
  const std::vector<uint64_t> bytes = {100, 200};
  EXPECT_EQ(LruPolicy::EntriesToFree(bytes, 1000, 1000), 0u);
  EXPECT_EQ(LruPolicy::EntriesToFree(bytes, 1000, 5000), 0u);
  EXPECT_EQ(LruPolicy::EntriesToFree(bytes, 10000, 10), 2u);
  EXPECT_EQ(LruPolicy::EntriesToFree({}, 10000, 10), 0u);
  // Entries that free nothing (their blobs shared) still go, one by one,
  // until the batch is spent: the caller measures again after it.
  EXPECT_EQ(LruPolicy::EntriesToFree(std::vector<uint64_t>{0, 0, 0}, 10, 5), 3u);
}

}  // namespace
}  // namespace kiln::cache
