// Tests of the two levels of kilnd's own results (cache/tiered_store.h): a
// real store in a fresh directory, and behind it an in-memory SharedTier that
// stands in for Redis (whose own behaviour test_shared_tier.py tests against
// a real redis-server): what is tested here is the fall-through and the fill.

#include "cache/tiered_store.h"

#include <map>
#include <utility>

#include "common/sha256.h"
#include "gtest/gtest.h"
#include "tests/test_dir.h"

namespace kiln::cache {
namespace {

using ::kiln::testing::TestDir;

// Records what the store asks of the fleet, and answers from a map.
class FakeSharedTier : public SharedTier {
 public:
  std::optional<NamedContent> Fetch(absl::string_view ns, absl::string_view key) override {
    fetches++;
    auto found = entries.find({std::string(ns), std::string(key)});
    if (found == entries.end()) return std::nullopt;
    return found->second;
  }
  void Offer(std::string ns, std::string key, NamedContent blobs) override {
    entries[{std::move(ns), std::move(key)}] = std::move(blobs);
  }
  Turn AwaitTurn(absl::string_view, absl::string_view, absl::Duration) override { return turn; }
  void StopWaiting() override { stopped = true; }
  void Release(absl::string_view ns, absl::string_view key) override {
    released.emplace_back(ns, key);
  }
  SharedTierStats Stats() override { return {.state = "up", .stores = entries.size()}; }

  std::map<std::pair<std::string, std::string>, NamedContent> entries;
  int fetches = 0;
  Turn turn = Turn::kClaimed;
  bool stopped = false;
  std::vector<std::pair<std::string, std::string>> released;
};

class TieredStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.data_dir = dir_.path() / "data";
    absl::StatusOr<std::unique_ptr<ArtifactStore>> store = ArtifactStore::Open(std::move(options));
    ASSERT_TRUE(store.ok()) << store.status();
    local_ = *std::move(store);
  }

  TestDir dir_;
  std::unique_ptr<ArtifactStore> local_;
  FakeSharedTier fleet_;
};

TEST_F(TieredStoreTest, AMissInBothLevelsIsNotFound) {
  TieredStore tiers(*local_, &fleet_);
  EXPECT_TRUE(absl::IsNotFound(tiers.Lookup("kiln.compile", "k").status()));
  EXPECT_EQ(fleet_.fetches, 1);
}

TEST_F(TieredStoreTest, WhatTheFleetHasFillsTheLocalStoreAndIsServedFromItAfter) {
  fleet_.entries[{"kiln.compile", "k"}] = {{"kernel.cubin", "cubin bytes"}, {"kernel.json", "{}"}};
  TieredStore tiers(*local_, &fleet_);

  absl::StatusOr<CacheEntry> first = tiers.Lookup("kiln.compile", "k");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->blobs.size(), 2u);
  EXPECT_EQ(first->blobs[0].name, "kernel.cubin");
  EXPECT_EQ(first->blobs[0].data, "cubin bytes");

  // The local store holds it now, by itself.
  absl::StatusOr<CacheEntry> local = local_->Lookup("kiln.compile", "k");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->blobs[1].data, "{}");
  ASSERT_TRUE(tiers.Lookup("kiln.compile", "k").ok());
  EXPECT_EQ(fleet_.fetches, 1);
}

TEST_F(TieredStoreTest, AFilledEntryLeavesOutTheBlobsTheCallerHas) {
  fleet_.entries[{"kiln.compile", "k"}] = {{"a", "have it"}, {"b", "need it"}};
  TieredStore tiers(*local_, &fleet_);
  absl::StatusOr<CacheEntry> entry = tiers.Lookup("kiln.compile", "k", {DigestBytes(Sha256("have it"))});
  ASSERT_TRUE(entry.ok()) << entry.status();
  EXPECT_FALSE(entry->blobs[0].data.has_value());
  EXPECT_EQ(entry->blobs[1].data, "need it");
}

TEST_F(TieredStoreTest, APutIsStoredLocallyAndOfferedToTheFleet) {
  TieredStore tiers(*local_, &fleet_);
  absl::StatusOr<std::vector<StoredBlob>> manifest =
      tiers.Put("kiln.launchers", "k", {{"m.so", "module bytes"}});
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  ASSERT_EQ(manifest->size(), 1u);
  EXPECT_EQ((*manifest)[0].digest, DigestBytes(Sha256("module bytes")));
  EXPECT_TRUE(local_->Lookup("kiln.launchers", "k").ok());
  const NamedContent offered = fleet_.entries.at({"kiln.launchers", "k"});
  ASSERT_EQ(offered.size(), 1u);
  EXPECT_EQ(offered[0].second, "module bytes");
}

TEST_F(TieredStoreTest, APutTheLocalStoreRefusesIsNotOffered) {
  TieredStore tiers(*local_, &fleet_);
  // Two blobs of one name: the store's INVALID_ARGUMENT.
  absl::StatusOr<std::vector<StoredBlob>> manifest =
      tiers.Put("kiln.compile", "k", {{"a", "1"}, {"a", "2"}});
  EXPECT_TRUE(absl::IsInvalidArgument(manifest.status())) << manifest.status();
  EXPECT_TRUE(fleet_.entries.empty());
}

TEST_F(TieredStoreTest, ClaimsGoToTheFleet) {
  TieredStore tiers(*local_, &fleet_);
  fleet_.turn = SharedTier::Turn::kDone;
  EXPECT_EQ(tiers.AwaitTurn("kiln.compile", "k", absl::Seconds(1)), SharedTier::Turn::kDone);
  tiers.Release("kiln.compile", "k");
  ASSERT_EQ(fleet_.released.size(), 1u);
  EXPECT_EQ(fleet_.released[0].second, "k");
  tiers.StopWaiting();
  EXPECT_TRUE(fleet_.stopped);
  ASSERT_TRUE(tiers.SharedStats().has_value());
  EXPECT_EQ(tiers.SharedStats()->state, "up");
}

TEST_F(TieredStoreTest, WithoutAFleetTheLocalStoreIsAllAndEveryCompileIsHere) {
  TieredStore tiers(*local_, nullptr);
  EXPECT_TRUE(absl::IsNotFound(tiers.Lookup("kiln.compile", "k").status()));
  ASSERT_TRUE(tiers.Put("kiln.compile", "k", {{"a", "1"}}).ok());
  EXPECT_TRUE(tiers.Lookup("kiln.compile", "k").ok());
  EXPECT_EQ(tiers.AwaitTurn("kiln.compile", "k", absl::Seconds(1)),
            SharedTier::Turn::kCompileHere);
  tiers.Release("kiln.compile", "k");  // nothing to end
  EXPECT_FALSE(tiers.SharedStats().has_value());
}

}  // namespace
}  // namespace kiln::cache
