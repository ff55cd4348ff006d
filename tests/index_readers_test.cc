// Tests of the index's read connections alone (cache/index_readers.h): the
// pool, and what a reader sees of the writer's commits, on a real index (the
// store's own schema) in a fresh directory.

#include "cache/index_readers.h"

#include "gtest/gtest.h"
#include "tests/fresh_index.h"

namespace kiln::cache {
namespace {

// db_ is the writer's connection.
class IndexReadersTest : public ::kiln::testing::FreshIndexTest {
 protected:
  IndexReaders readers_{index_path(), absl::Seconds(5)};
};

TEST_F(IndexReadersTest, ThePoolGrowsToTheLeasesAtOnceAndReusesWhatWasGivenBack) {
  EXPECT_EQ(readers_.idle(), 0u);
  {
    absl::StatusOr<IndexReaders::Lease> a = readers_.Acquire();
    absl::StatusOr<IndexReaders::Lease> b = readers_.Acquire();
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_NE(&**a, &**b) << "two lookups at once: two connections";
    EXPECT_EQ(readers_.idle(), 0u);
  }
  EXPECT_EQ(readers_.idle(), 2u);
  absl::StatusOr<IndexReaders::Lease> again = readers_.Acquire();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(readers_.idle(), 1u) << "an idle one taken, none opened";
}

TEST_F(IndexReadersTest, AReaderFindsWhatTheWriterCommittedAndNothingElse) {
  absl::StatusOr<IndexReaders::Lease> reader = readers_.Acquire();
  ASSERT_TRUE(reader.ok());
  absl::StatusOr<std::optional<int64_t>> missing = (*reader)->FindEntry("local/triton", "k");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->has_value());

  {
    absl::StatusOr<sqlite::Transaction> txn = sqlite::Transaction::Begin(*db_);
    ASSERT_TRUE(txn.ok());
    Exec("INSERT INTO entries (id, namespace, key, created_ms, last_use) "
         "VALUES (42, 'local/triton', 'k', 0, 0)");
    absl::StatusOr<std::optional<int64_t>> uncommitted = (*reader)->FindEntry("local/triton", "k");
    ASSERT_TRUE(uncommitted.ok());
    EXPECT_FALSE(uncommitted->has_value()) << "the writer's transaction is not committed yet";
    ASSERT_TRUE(txn->Commit().ok());
  }
  absl::StatusOr<std::optional<int64_t>> found = (*reader)->FindEntry("local/triton", "k");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, 42);
  EXPECT_FALSE((*reader)->FindEntry("tenant:a/triton", "k").value().has_value())
      << "another namespace's key is another entry";
}

TEST_F(IndexReadersTest, AnEntrysBlobRowsComeInNameOrderWithTheirContentsDigest) {
  Exec("INSERT INTO blobs (id, digest, size, stored_size, codec, location, data, content_digest) "
       "VALUES (1, X'00000000000000000001', 3, 3, 0, 0, 'abc', X'aa'), "
       "(2, X'bb', 1, 1, 0, 0, 'z', NULL)");
  Exec("INSERT INTO entries (id, namespace, key, created_ms, last_use) "
       "VALUES (7, 'local/triton', 'k', 1234, 0)");
  Exec("INSERT INTO entry_blobs (entry_id, name, blob_id) VALUES (7, 'b.json', 2), (7, 'a.cubin', 1)");

  absl::StatusOr<IndexReaders::Lease> reader = readers_.Acquire();
  ASSERT_TRUE(reader.ok());
  sqlite::Statement& rows = (*reader)->entry_blobs;
  rows.BindText(1, "local/triton").BindText(2, "k");
  ASSERT_TRUE(rows.Step().value_or(false));
  EXPECT_EQ(rows.ColumnInt(0), 7);
  EXPECT_EQ(rows.ColumnInt(1), 1234);
  EXPECT_EQ(rows.ColumnText(2), "a.cubin");
  EXPECT_EQ(rows.ColumnBlob(3), "\xaa") << "a placeholder row's content digest";
  EXPECT_EQ(rows.ColumnBlob(7), "abc");
  ASSERT_TRUE(rows.Step().value_or(false));
  EXPECT_EQ(rows.ColumnText(2), "b.json");
  EXPECT_EQ(rows.ColumnBlob(3), "\xbb") << "a row keyed by its content";
  EXPECT_FALSE(rows.Step().value_or(true));
  rows.Reset();
}

TEST_F(IndexReadersTest, AnIndexThatCannotBeOpenedIsAnErrorNotACrash) {
  IndexReaders nowhere(dir_.path() / "no-such-dir" / "kiln.db", absl::Seconds(1));
  absl::StatusOr<IndexReaders::Lease> reader = nowhere.Acquire();
  EXPECT_FALSE(reader.ok());
  EXPECT_EQ(nowhere.idle(), 0u);
}

}  // namespace
}  // namespace kiln::cache
