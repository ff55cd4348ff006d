// Tests of how entries leave the store (cache/entry_removal.h), alone: rows
// deleted in the caller's transaction, and files released only once it
// commits, on a real index (the store's own schema) whose rows the tests
// write themselves, with blob files in a data directory of the test's own.

#include "cache/entry_removal.h"

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/fresh_index.h"
#include "tests/store_parts.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;

class EntryRemovalTest : public ::kiln::testing::FreshIndexTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(FreshIndexTest::SetUp());
    ASSERT_TRUE(parts_.Prepare(*db_).ok());
  }

  // A blob row of `size` stored bytes: in a file (written here) when `in_file`.
  int64_t Blob(uint64_t size, bool in_file) {
    const std::string digest(32, static_cast<char>('a' + next_digest_++));
    Exec(absl::StrCat("INSERT INTO blobs (digest, size, stored_size, codec, location) VALUES (x'",
                      absl::BytesToHexString(digest), "', ", size, ", ", size, ", 0, ",
                      in_file ? 1 : 0, ")"));
    const int64_t id = db_->LastInsertId();
    if (in_file) {
      const fs::path path = parts_.blobs.PathOf(digest);
      fs::create_directories(path.parent_path());
      std::ofstream(path) << std::string(size, 'x');
      files_[id] = path;
    }
    accounting_.Add({.stored_bytes = size, .blobs = 1});
    return id;
  }
  int64_t Entry(const std::string& key, const std::vector<int64_t>& blob_ids) {
    Exec(absl::StrCat("INSERT INTO entries (namespace, key, created_ms, last_use) VALUES "
                      "('local/triton', '", key, "', 0, 0)"));
    const int64_t id = db_->LastInsertId();
    int name = 0;
    for (int64_t blob_id : blob_ids) {
      Exec(absl::StrCat("INSERT INTO entry_blobs (entry_id, name, blob_id) VALUES (", id, ", 'b",
                        name++, "', ", blob_id, ")"));
    }
    accounting_.Add({.entries = 1});
    return id;
  }
  int64_t Count(const std::string& table) { return QueryInt("SELECT count(*) FROM " + table); }

  ::kiln::testing::StoreParts parts_{data_dir()};
  StoreAccounting& accounting_ = parts_.accounting;
  EntryRemoval& removal_ = parts_.removal;
  std::map<int64_t, fs::path> files_;
  int next_digest_ = 0;
};

TEST_F(EntryRemovalTest, AnEntryTakesTheBlobsOnlyItUsedAndLeavesThoseItShared) {
  const int64_t shared = Blob(100, /*in_file=*/false);
  const int64_t own = Blob(200, /*in_file=*/false);
  const int64_t going = Entry("going", {shared, own});
  Entry("staying", {shared});

  FreedBlobs freed;
  ASSERT_TRUE(removal_.DeleteById({going}, freed).ok());
  EXPECT_EQ(freed.entries.size(), 1u);
  EXPECT_EQ(freed.entries[0].key, "going");
  EXPECT_EQ(freed.blob_rows, 1u);
  EXPECT_EQ(freed.bytes, 200u);
  EXPECT_EQ(Count("entries"), 1);
  EXPECT_EQ(QueryInt(absl::StrCat("SELECT count(*) FROM blobs WHERE id = ", shared)), 1);
  EXPECT_EQ(QueryInt(absl::StrCat("SELECT count(*) FROM blobs WHERE id = ", own)), 0);

  removal_.Release(freed);
  EXPECT_EQ(accounting_.entries(), 1u);
  EXPECT_EQ(accounting_.blobs(), 1u);
  EXPECT_EQ(accounting_.stored_bytes(), 100u);
}

TEST_F(EntryRemovalTest, ABlobFileStaysUntilTheTransactionCommitsAndIsReleased) {
  const int64_t blob = Blob(4096, /*in_file=*/true);
  const int64_t entry = Entry("k", {blob});
  const fs::path file = files_[blob];

  {
    // A transaction that fails after the rows went: the file must still be there.
    absl::StatusOr<sqlite::Transaction> txn = sqlite::Transaction::Begin(*db_);
    ASSERT_TRUE(txn.ok());
    FreedBlobs freed;
    ASSERT_TRUE(removal_.DeleteById({entry}, freed).ok());
    ASSERT_EQ(freed.files, std::vector<fs::path>{file});
    EXPECT_TRUE(fs::exists(file));
  }  // rolled back
  EXPECT_EQ(Count("entries"), 1);
  EXPECT_TRUE(fs::exists(file));

  absl::StatusOr<sqlite::Transaction> txn = sqlite::Transaction::Begin(*db_);
  ASSERT_TRUE(txn.ok());
  FreedBlobs freed;
  ASSERT_TRUE(removal_.DeleteById({entry}, freed).ok());
  ASSERT_TRUE(txn->Commit().ok());
  EXPECT_TRUE(fs::exists(file)) << "removed only by Release";
  removal_.Release(freed);
  EXPECT_FALSE(fs::exists(file));
  EXPECT_EQ(Count("blobs"), 0);
  EXPECT_EQ(accounting_.blobs(), 0u);
}

TEST_F(EntryRemovalTest, EntriesGoneAlreadyArePassedOver) {
  const int64_t entry = Entry("k", {Blob(10, /*in_file=*/false)});
  FreedBlobs first;
  ASSERT_TRUE(removal_.DeleteById({entry}, first).ok());
  removal_.Release(first);

  FreedBlobs again;
  ASSERT_TRUE(removal_.DeleteById({entry, entry + 100}, again).ok());
  EXPECT_TRUE(again.entries.empty());
  EXPECT_EQ(again.blob_rows, 0u);
  removal_.Release(again);
  EXPECT_EQ(accounting_.entries(), 0u);
}

TEST_F(EntryRemovalTest, AFreedBlobFileHeldOpenIsALeftoverTriedAgainUntilItGoes) {
  // A directory with a file in it stands in for a file another process holds
  // open (Windows): no remove() takes it, and the part sees only that.
  const int64_t blob = Blob(4096, /*in_file=*/true);
  const fs::path file = files_[blob];
  fs::remove(file);
  fs::create_directories(file);
  std::ofstream(file / "holder") << "x";
  const int64_t entry = Entry("k", {blob});

  FreedBlobs freed;
  ASSERT_TRUE(removal_.DeleteById({entry}, freed).ok());
  removal_.Release(freed);
  EXPECT_TRUE(fs::exists(file));
  EXPECT_EQ(Count("leftover_files"), 1);

  fs::remove(file / "holder");
  removal_.RetryLeftovers();
  EXPECT_FALSE(fs::exists(file));
  EXPECT_EQ(Count("leftover_files"), 0);
  EXPECT_EQ(accounting_.leftover_bytes(), 0u);
}

}  // namespace
}  // namespace kiln::cache
