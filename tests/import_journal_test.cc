// Tests of the import journal alone (cache/import_journal.h) on a real index
// (the store's own schema) in a fresh directory.

#include "cache/import_journal.h"

#include "gtest/gtest.h"
#include "tests/fresh_index.h"

namespace kiln::cache {
namespace {

using Names = std::vector<std::pair<std::string, std::string>>;

class ImportJournalTest : public ::kiln::testing::FreshIndexTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(FreshIndexTest::SetUp());
    ASSERT_TRUE(journal_.Prepare(*db_).ok());
  }

  ImportJournal journal_;  // the fixture's: its statements go before db_ closes
};

TEST_F(ImportJournalTest, AnImportsEntriesComeBackInBatchesOnceEach) {
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(journal_.Journal(1, "tenant:a/triton", "k" + std::to_string(i)).ok());
  }
  ASSERT_TRUE(journal_.Journal(2, "tenant:a/triton", "other").ok());
  ASSERT_TRUE(journal_.Journal(1, "tenant:a/triton", "k0").ok()) << "journaled twice: once";

  Names taken;
  for (int batch = 0; batch < 4; ++batch) {
    absl::StatusOr<Names> names = journal_.TakeBatch(1, 2);
    ASSERT_TRUE(names.ok()) << names.status();
    EXPECT_LE(names->size(), 2u);
    taken.insert(taken.end(), names->begin(), names->end());
  }
  EXPECT_EQ(taken.size(), 5u);
  absl::StatusOr<Names> other = journal_.TakeBatch(2, 10);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(*other, (Names{{"tenant:a/triton", "other"}})) << "another import's stay its own";
}

TEST_F(ImportJournalTest, AFinishedImportLeavesNothingToTakeBack) {
  ASSERT_TRUE(journal_.Journal(3, "local/triton", "a").ok());
  ASSERT_TRUE(journal_.Finish(3).ok());
  absl::StatusOr<Names> names = journal_.TakeBatch(3, 10);
  ASSERT_TRUE(names.ok());
  EXPECT_TRUE(names->empty());
}

TEST_F(ImportJournalTest, TheImportsAnEarlierRunLeftUnfinishedAreFoundOnceAtTheOpen) {
  ASSERT_TRUE(journal_.Journal(7, "local/triton", "a").ok());
  ASSERT_TRUE(journal_.Journal(7, "local/triton", "b").ok());
  ASSERT_TRUE(journal_.Journal(9, "local/triton", "c").ok());
  ASSERT_TRUE(journal_.Journal(8, "local/triton", "d").ok());
  ASSERT_TRUE(journal_.Finish(8).ok());

  // The next run's journal on the same file.
  ImportJournal reopened;
  ASSERT_TRUE(reopened.Prepare(*db_).ok());
  ASSERT_TRUE(reopened.FindUnfinished().ok());
  std::vector<int64_t> unfinished = reopened.TakeUnfinished();
  std::sort(unfinished.begin(), unfinished.end());
  EXPECT_EQ(unfinished, (std::vector<int64_t>{7, 9}));
  EXPECT_TRUE(reopened.TakeUnfinished().empty());
}

TEST_F(ImportJournalTest, WhatATransactionTookBackIsJournaledAgainWhenItRollsBack) {
  ASSERT_TRUE(journal_.Journal(4, "local/triton", "a").ok());
  {
    absl::StatusOr<sqlite::Transaction> txn = sqlite::Transaction::Begin(*db_);
    ASSERT_TRUE(txn.ok());
    absl::StatusOr<Names> names = journal_.TakeBatch(4, 10);
    ASSERT_TRUE(names.ok());
    EXPECT_EQ(names->size(), 1u);
    // Not committed: the entries were not taken back either.
  }
  absl::StatusOr<Names> names = journal_.TakeBatch(4, 10);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names->size(), 1u);
}

}  // namespace
}  // namespace kiln::cache
