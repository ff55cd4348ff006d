// Tests of eviction's loops (cache/evictor.h) over the store's parts without
// the store: a real index (the store's own schema) whose rows the tests
// write themselves, the parts that read and delete them, and the writer's
// mutex and stop flag the store would hand over. What is evicted is read back
// from the index.

#include "cache/evictor.h"

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/fresh_index.h"
#include "tests/store_parts.h"

namespace kiln::cache {
namespace {

class EvictorTest : public ::kiln::testing::FreshIndexTest {
 protected:
  static constexpr uint64_t kDomainCap = 5000;

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(FreshIndexTest::SetUp());
    ASSERT_TRUE(parts_.Prepare(*db_).ok());
    absl::StatusOr<sqlite::Statement> index_pages =
        db_->Prepare("SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()");
    ASSERT_TRUE(index_pages.ok());
    index_pages_ = std::move(*index_pages);
    evictor_ = std::make_unique<Evictor>(
        Evictor::Parts{.writer_mutex = writer_mutex_,
                       .db = *db_,
                       .index_pages = index_pages_,
                       .candidates = parts_.candidates,
                       .removal = parts_.removal,
                       .accounting = accounting_,
                       .served_files = parts_.served_files,
                       .schedule = schedule_,
                       .stop_requested = stop_requested_,
                       .record_uses = [this] {
                         ++uses_recorded_;
                         return before_each_batch_ ? before_each_batch_() : absl::OkStatus();
                       }},
        Evictor::Limits{.max_size_bytes = 64ull << 20, .max_domain_bytes = kDomainCap});
  }

  // An entry of one inline blob of `size` bytes, used at `last_use`.
  void Entry(const std::string& ns, const std::string& key, int64_t last_use, uint64_t size) {
    Exec(absl::StrCat("INSERT INTO blobs (digest, size, stored_size, codec, location, data) VALUES "
                      "(randomblob(32), ",
                      size, ", ", size, ", 0, 0, randomblob(", size, "))"));
    const int64_t blob_id = db_->LastInsertId();
    Exec(absl::StrCat("INSERT INTO entries (namespace, key, created_ms, last_use) VALUES ('", ns,
                      "', '", key, "', 0, ", last_use, ")"));
    Exec(absl::StrCat("INSERT INTO entry_blobs (entry_id, name, blob_id) VALUES (",
                      db_->LastInsertId(), ", 'kernel.cubin', ", blob_id, ")"));
    accounting_.Add({.stored_bytes = size, .blobs = 1, .entries = 1});
  }
  // The keys of `ns` still stored, least recently used first.
  std::vector<std::string> KeysLeft(const std::string& ns) {
    absl::StatusOr<sqlite::Statement> query =
        db_->Prepare("SELECT key FROM entries WHERE namespace = ?1 ORDER BY last_use");
    EXPECT_TRUE(query.ok());
    query->BindText(1, ns);
    std::vector<std::string> keys;
    while (query->Step().value_or(false)) keys.emplace_back(query->ColumnText(0));
    return keys;
  }
  uint64_t EvictionBytes() {
    return accounting_.EvictionBytes(index_pages_, parts_.served_files.bytes());
  }

  ::kiln::testing::StoreParts parts_{data_dir()};
  StoreAccounting& accounting_ = parts_.accounting;
  sqlite::Statement index_pages_;
  MaintenanceSchedule schedule_{absl::Seconds(60)};
  std::mutex writer_mutex_;
  std::atomic<bool> stop_requested_{false};
  int uses_recorded_ = 0;
  std::function<absl::Status()> before_each_batch_;
  std::unique_ptr<Evictor> evictor_;
};

TEST_F(EvictorTest, ADomainOverItsCapLosesItsLeastRecentlyUsedToATenthBelowAndNoOtherDomainLoses) {
  for (int i = 1; i <= 10; ++i) Entry("tenant:a/triton", absl::StrCat("a", i), i, 1000);
  for (int i = 1; i <= 3; ++i) Entry("tenant:b/triton", absl::StrCat("b", i), i, 1000);
  schedule_.NotePuts({"tenant:a"}, /*over_cap=*/false);

  absl::StatusOr<uint64_t> evicted = evictor_->EnforceDomainCaps();
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  // 10,000 bytes held against a cap of 5,000: down to 4,500 at most.
  EXPECT_EQ(*evicted, 6u);
  EXPECT_EQ(KeysLeft("tenant:a/triton"), (std::vector<std::string>{"a7", "a8", "a9", "a10"}));
  EXPECT_EQ(KeysLeft("tenant:b/triton"), (std::vector<std::string>{"b1", "b2", "b3"}));
  EXPECT_EQ(evictor_->evicted(), 6u);
  EXPECT_EQ(QueryInt("SELECT count(*) FROM blobs"), 7) << "the evicted entries' blobs went too";
  EXPECT_EQ(accounting_.entries(), 7u);
  EXPECT_EQ(accounting_.stored_bytes(), 7000u);

  // Looked at once: the next call finds no domain put to.
  evicted = evictor_->EnforceDomainCaps();
  ASSERT_TRUE(evicted.ok());
  EXPECT_EQ(*evicted, 0u);
}

TEST_F(EvictorTest, UsesLookupsRecordedAreWrittenBeforeABatchIsChosen) {
  for (int i = 1; i <= 10; ++i) Entry("tenant:a/triton", absl::StrCat("a", i), i, 1000);
  // A lookup of the least recently used entry, recorded but not yet written.
  before_each_batch_ = [this] {
    return db_->Exec("UPDATE entries SET last_use = 100 WHERE key = 'a1'");
  };
  schedule_.NotePuts({"tenant:a"}, /*over_cap=*/false);

  ASSERT_TRUE(evictor_->EnforceDomainCaps().ok());
  EXPECT_GE(uses_recorded_, 1);
  EXPECT_EQ(KeysLeft("tenant:a/triton"), (std::vector<std::string>{"a8", "a9", "a10", "a1"}));
}

TEST_F(EvictorTest, ADomainAStopCutsShortIsLookedAtAgainOnTheNextCall) {
  for (int i = 1; i <= 10; ++i) Entry("tenant:a/triton", absl::StrCat("a", i), i, 1000);
  schedule_.NotePuts({"tenant:a"}, /*over_cap=*/false);
  stop_requested_ = true;

  absl::StatusOr<uint64_t> evicted = evictor_->EnforceDomainCaps();
  ASSERT_TRUE(evicted.ok());
  EXPECT_EQ(*evicted, 0u);
  EXPECT_EQ(KeysLeft("tenant:a/triton").size(), 10u);
  EXPECT_TRUE(schedule_.TakeDomainsPutTo().contains("tenant:a"));
}

TEST_F(EvictorTest, ToASizeTheLeastRecentlyUsedGoFirstUntilTheStoreFits) {
  Exec("BEGIN");
  for (int i = 1; i <= 200; ++i) Entry("local/triton", absl::StrCat("k", 1000 + i), i, 4000);
  Exec("COMMIT");
  const uint64_t before = EvictionBytes();
  const uint64_t target = before - 400 * 1000;  // about half of the blobs' pages

  absl::StatusOr<uint64_t> evicted = evictor_->EvictToSize(target);
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_LE(EvictionBytes(), target);
  const std::vector<std::string> left = KeysLeft("local/triton");
  EXPECT_EQ(left.size() + *evicted, 200u);
  EXPECT_GT(left.size(), 0u) << "it stops once the store fits";
  // What stays is the most recently used: the keys after the last that went.
  for (size_t i = 0; i < left.size(); ++i) {
    EXPECT_EQ(left[i], absl::StrCat("k", 1000 + 200 - left.size() + 1 + i));
  }
  EXPECT_EQ(evictor_->evicted(), *evicted);
}

TEST_F(EvictorTest, AStopRequestedDuringAnEvictionEndsItAfterTheBatchUnderWay) {
  Exec("BEGIN");  // one commit, not 9,000
  for (int i = 1; i <= 3000; ++i) Entry("local/triton", absl::StrCat("k", i), i, 100);
  Exec("COMMIT");
  // kilnd is asked to stop as the first batch is chosen.
  before_each_batch_ = [this] {
    stop_requested_ = true;
    return absl::OkStatus();
  };

  absl::StatusOr<uint64_t> evicted = evictor_->EvictToSize(0);
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(uses_recorded_, 1);
  EXPECT_GT(*evicted, 0u);
  EXPECT_LT(*evicted, 3000u) << "one batch went, not the whole store";
  EXPECT_EQ(KeysLeft("local/triton").size(), 3000u - *evicted);
}

}  // namespace
}  // namespace kiln::cache
