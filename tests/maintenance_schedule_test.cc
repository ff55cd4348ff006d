// Tests of when the store's maintenance runs, alone
// (cache/maintenance_schedule.h): rounds every interval, at once when a put
// goes over the cap, the capped domains puts went to, and a stop that ends
// the wait at once.

#include "cache/maintenance_schedule.h"

#include <algorithm>
#include <thread>

#include "gtest/gtest.h"

namespace kiln::cache {
namespace {

using Domains = absl::flat_hash_set<absl::string_view>;

TEST(MaintenanceScheduleTest, ARoundIsDueEveryInterval) {
  MaintenanceSchedule schedule(absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  EXPECT_TRUE(schedule.WaitForNextRound());
  EXPECT_TRUE(schedule.WaitForNextRound());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(95));
}

TEST(MaintenanceScheduleTest, APutOverTheCapMakesTheNextRoundDueAtOnceOnce) {
  MaintenanceSchedule schedule(absl::Hours(1));
  schedule.NotePuts({}, /*over_cap=*/true);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(schedule.WaitForNextRound());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  // From another thread while the round waits.
  std::thread put([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    schedule.NotePuts({}, /*over_cap=*/true);
  });
  EXPECT_TRUE(schedule.WaitForNextRound());
  put.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "woken by the put, not the hour";
}

TEST(MaintenanceScheduleTest, PutsIntoCappedDomainsAreKeptForTheNextLookButDoNotHurryIt) {
  MaintenanceSchedule schedule(absl::Milliseconds(300));
  schedule.NotePuts(Domains{"tenant:a", "tenant:b"}, /*over_cap=*/false);
  schedule.NotePuts(Domains{"tenant:a"}, /*over_cap=*/false);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(schedule.WaitForNextRound());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250)) << "a domain waits for the round";

  absl::flat_hash_set<std::string> taken = schedule.TakeDomainsPutTo();
  EXPECT_EQ(taken, (absl::flat_hash_set<std::string>{"tenant:a", "tenant:b"}));
  EXPECT_TRUE(schedule.TakeDomainsPutTo().empty()) << "taken once";

  schedule.LookAgainLater({"tenant:b"});
  EXPECT_EQ(schedule.TakeDomainsPutTo(), (absl::flat_hash_set<std::string>{"tenant:b"}));
}

TEST(MaintenanceScheduleTest, AStopEndsTheWaitAtOnceAndEveryWaitAfter) {
  MaintenanceSchedule schedule(absl::Hours(1));
  const absl::Time start = absl::Now();
  std::thread stop([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    schedule.Stop();
  });
  EXPECT_FALSE(schedule.WaitForNextRound());
  stop.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  schedule.NotePuts({}, /*over_cap=*/true);
  EXPECT_FALSE(schedule.WaitForNextRound()) << "stopped, whatever is due";
}

}  // namespace
}  // namespace kiln::cache
