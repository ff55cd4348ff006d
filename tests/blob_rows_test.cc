// Tests of the index's blob rows alone (cache/blob_rows.h): keys by content
// or placeholder, keying by content, orphans and their served copies, on a
// fresh index whose entries the tests write themselves.

#include "cache/blob_rows.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/fresh_index.h"

namespace kiln::cache {
namespace {

class BlobRowsTest : public ::kiln::testing::FreshIndexTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(FreshIndexTest::SetUp());
    ASSERT_TRUE(rows_.Prepare(*db_).ok());
  }
  static PreparedBlob Blob(const std::string& digest_byte, BlobLocation location, uint64_t stored_size) {
    PreparedBlob blob;
    blob.name = "kernel.cubin";
    blob.digest = std::string(32, digest_byte[0]);
    blob.size = stored_size;
    blob.stored = std::string(location == BlobLocation::kInline ? stored_size : 0, 'x');
    blob.stored_size = stored_size;
    blob.location = location;
    return blob;
  }
  int64_t Insert(PreparedBlob& blob, bool keyed_by_content) {
    absl::StatusOr<int64_t> id = rows_.Insert(blob, keyed_by_content);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(-1);
  }
  void Name(int64_t entry_id, int64_t blob_id, const std::string& name = "b") {
    Exec(absl::StrCat("INSERT OR IGNORE INTO entries (id, namespace, key, created_ms, last_use) "
                      "VALUES (", entry_id, ", 'local/triton', 'k", entry_id, "', 0, 0)"));
    Exec(absl::StrCat("INSERT INTO entry_blobs (entry_id, name, blob_id) VALUES (", entry_id, ", '",
                      name, "', ", blob_id, ")"));
  }

  BlobRows rows_;
};

TEST_F(BlobRowsTest, AFileBlobIsKeyedByItsContentAndASmallOneByAPlaceholderOfItsId) {
  PreparedBlob file = Blob("f", BlobLocation::kFile, 100000);
  const int64_t file_id = Insert(file, /*keyed_by_content=*/true);
  EXPECT_TRUE(file.store_key.empty());
  EXPECT_EQ(rows_.Find(file.digest).value_or(std::nullopt), file_id);

  PreparedBlob small = Blob("s", BlobLocation::kInline, 10);
  const int64_t small_id = Insert(small, /*keyed_by_content=*/false);
  EXPECT_EQ(small.store_key, PlaceholderKey(small_id));
  EXPECT_EQ(small_id, file_id + 1);
  EXPECT_EQ(rows_.Find(small.store_key).value_or(std::nullopt), small_id);
  EXPECT_FALSE(rows_.Find(small.digest).value_or(0).has_value()) << "not keyed by its content";
  EXPECT_EQ(QueryInt(absl::StrCat("SELECT count(*) FROM blobs WHERE id = ", small_id,
                                  " AND content_digest = X'", absl::BytesToHexString(small.digest), "'")),
            1);

  EXPECT_EQ(rows_.IsFileBlob(file.digest).value_or(false), true);
  EXPECT_EQ(rows_.IsFileBlob(small.digest).value_or(true), false);
}

TEST_F(BlobRowsTest, PlaceholdersAscendWithIdsAndIdsGoOnAfterAReopen) {
  EXPECT_LT(PlaceholderKey(1), PlaceholderKey(2));
  EXPECT_LT(PlaceholderKey(255), PlaceholderKey(256));
  EXPECT_EQ(PlaceholderKey(7).size(), 9u);
  PreparedBlob a = Blob("a", BlobLocation::kInline, 1);
  const int64_t first = Insert(a, false);

  BlobRows next_run;  // the next open's, on the same index
  ASSERT_TRUE(next_run.Prepare(*db_).ok());
  PreparedBlob b = Blob("b", BlobLocation::kInline, 1);
  absl::StatusOr<int64_t> second = next_run.Insert(b, false);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, first + 1);
}

TEST_F(BlobRowsTest, KeyingByContentKeysARowOrFoldsItIntoTheRowOfItsContent) {
  PreparedBlob lone = Blob("l", BlobLocation::kInline, 10);
  const int64_t lone_id = Insert(lone, false);
  BlobRows::Merged merged;
  ASSERT_TRUE(rows_.KeyByContent(lone.store_key, merged).ok());
  EXPECT_EQ(rows_.Find(lone.digest).value_or(std::nullopt), lone_id) << "now keyed by content";
  EXPECT_EQ(merged.rows, 0u);

  // A second row of the same content, named by another entry: folded into the first.
  PreparedBlob twin = Blob("l", BlobLocation::kInline, 10);
  const int64_t twin_id = Insert(twin, false);
  Name(1, twin_id);
  ASSERT_TRUE(rows_.KeyByContent(twin.store_key, merged).ok());
  EXPECT_EQ(merged.rows, 1u);
  EXPECT_EQ(merged.stored_bytes, 10u);
  EXPECT_EQ(QueryInt(absl::StrCat("SELECT count(*) FROM blobs WHERE id = ", twin_id)), 0);
  EXPECT_EQ(QueryInt("SELECT blob_id FROM entry_blobs WHERE entry_id = 1"), lone_id);

  ASSERT_TRUE(rows_.KeyByContent(PlaceholderKey(999), merged).ok()) << "a row that went: nothing";
  EXPECT_EQ(merged.rows, 1u);
}

TEST_F(BlobRowsTest, OnlyRowsNoEntryNamesAreDeletedAsOrphansWithTheirServedCopies) {
  PreparedBlob kept = Blob("k", BlobLocation::kFile, 5000);
  PreparedBlob going = Blob("g", BlobLocation::kFile, 7000);
  const int64_t kept_id = Insert(kept, true);
  const int64_t going_id = Insert(going, true);
  Name(1, kept_id);
  Exec(absl::StrCat("INSERT INTO served_copies (blob_id, extension, disk_bytes) VALUES (", going_id,
                    ", '.cubin', 8192), (", going_id, ", '.json', 4096)"));

  absl::StatusOr<std::vector<BlobRows::Orphan>> orphans = rows_.DeleteOrphans({kept_id, going_id});
  ASSERT_TRUE(orphans.ok()) << orphans.status();
  ASSERT_EQ(orphans->size(), 1u);
  const BlobRows::Orphan& orphan = (*orphans)[0];
  EXPECT_EQ(orphan.id, going_id);
  EXPECT_EQ(orphan.key, going.digest);
  EXPECT_EQ(orphan.stored_size, 7000u);
  EXPECT_EQ(orphan.location, BlobLocation::kFile);
  EXPECT_EQ(orphan.served_copies.size(), 2u);
  EXPECT_FALSE(rows_.Find(going.digest).value_or(0).has_value());
  EXPECT_TRUE(rows_.Find(kept.digest).value_or(std::nullopt).has_value());
  EXPECT_TRUE(rows_.DeleteOrphans({}).value().empty());
}

TEST_F(BlobRowsTest, TheEntriesNamingARowAreFoundByItsKey) {
  PreparedBlob shared = Blob("c", BlobLocation::kFile, 100000);
  const int64_t id = Insert(shared, true);
  Name(1, id);
  Name(2, id);
  absl::StatusOr<BlobRows::Users> users = rows_.EntriesNaming(shared.digest);
  ASSERT_TRUE(users.ok()) << users.status();
  EXPECT_EQ(users->blob_id, id);
  EXPECT_EQ(users->entry_ids.size(), 2u);

  PreparedBlob unnamed = Blob("u", BlobLocation::kInline, 1);
  Insert(unnamed, false);
  absl::StatusOr<BlobRows::Users> none = rows_.EntriesNaming(unnamed.store_key);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->blob_id.has_value());
  EXPECT_TRUE(none->entry_ids.empty());
  EXPECT_FALSE(rows_.EntriesNaming("no such key").value().blob_id.has_value());
}

}  // namespace
}  // namespace kiln::cache
