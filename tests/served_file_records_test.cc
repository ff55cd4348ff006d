// Tests of the records of served files alone (cache/served_file_records.h):
// a blob's served copies and an entry's served index, on a real index (the
// store's own schema) whose blob and entry rows the tests write themselves.

#include "cache/served_file_records.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cache/store_schema.h"
#include "gtest/gtest.h"
#include "tests/test_dir.h"

namespace kiln::cache {
namespace {

using ::kiln::testing::TestDir;

class ServedFileRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_.path() / "data");
    absl::StatusOr<store_internal::OpenedIndex> index =
        store_internal::OpenIndex(dir_.path() / "data" / "kiln.db", absl::Seconds(5), [] {});
    ASSERT_TRUE(index.ok()) << index.status();
    db_ = std::move(index->db);
    ASSERT_TRUE(records_.Prepare(*db_).ok());
  }
  void Exec(const std::string& sql) { ASSERT_TRUE(db_->Exec(sql).ok()) << sql; }
  // A blob row keyed by the digest X'<hex>'; returns its id.
  int64_t Blob(const std::string& hex) {
    Exec(absl::StrCat("INSERT INTO blobs (digest, size, stored_size, codec, location) VALUES (X'",
                      hex, "', 1, 1, 0, 0)"));
    return db_->LastInsertId();
  }
  int64_t Count(const std::string& sql) {
    absl::StatusOr<sqlite::Statement> count = db_->Prepare(sql);
    EXPECT_TRUE(count.ok()) << sql;
    EXPECT_TRUE(count->Step().value_or(false));
    return count->ColumnInt(0);
  }
  static std::string Digest(const std::string& hex) { return absl::HexStringToBytes(hex); }

  TestDir dir_;
  std::unique_ptr<sqlite::Database> db_;
  ServedFileRecords records_;  // after db_: its statements go first
};

TEST_F(ServedFileRecordsTest, ACopyOfAStoredBlobIsRecordedOncePerExtension) {
  Blob("aa");
  EXPECT_EQ(records_.RecordCopy(Digest("aa"), ".cubin", 4096).value_or(false), true);
  EXPECT_EQ(records_.RecordCopy(Digest("aa"), ".json", 4096).value_or(false), true);
  EXPECT_EQ(records_.RecordCopy(Digest("aa"), ".cubin", 8192).value_or(false), true)
      << "written again: its record replaced";
  EXPECT_EQ(Count("SELECT count(*) FROM served_copies"), 2);
  EXPECT_EQ(Count("SELECT disk_bytes FROM served_copies WHERE extension = '.cubin'"), 8192);
  EXPECT_EQ(records_.IsCopyRecorded(Digest("aa"), ".cubin").value_or(false), true);
  EXPECT_EQ(records_.IsCopyRecorded(Digest("aa"), ".ptx").value_or(true), false);
}

TEST_F(ServedFileRecordsTest, ACopyOfABlobThatWentIsNotRecordedAndTheCallerIsTold) {
  absl::StatusOr<bool> recorded = records_.RecordCopy(Digest("bb"), ".cubin", 4096);
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_FALSE(*recorded);
  EXPECT_EQ(Count("SELECT count(*) FROM served_copies"), 0);
  EXPECT_EQ(records_.IsCopyRecorded(Digest("bb"), ".cubin").value_or(true), false);
}

TEST_F(ServedFileRecordsTest, TheCopiesOfBlobsThatGoAreForgottenAndNoOthers) {
  const int64_t going = Blob("c1");
  const int64_t staying = Blob("c2");
  ASSERT_TRUE(records_.RecordCopy(Digest("c1"), ".cubin", 1).ok());
  ASSERT_TRUE(records_.RecordCopy(Digest("c1"), ".json", 1).ok());
  ASSERT_TRUE(records_.RecordCopy(Digest("c2"), ".cubin", 1).ok());

  ASSERT_TRUE(records_.ForgetCopiesOf({going}).ok());
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM served_copies WHERE blob_id = ", going)), 0);
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM served_copies WHERE blob_id = ", staying)), 1);
  EXPECT_TRUE(records_.ForgetCopiesOf({}).ok());
}

TEST_F(ServedFileRecordsTest, AnEntrysServedIndexIsRecordedOnItsRowAndNotForAnEntryThatWent) {
  Exec("INSERT INTO entries (namespace, key, created_ms, last_use) VALUES ('local/triton', 'k', 0, 0)");
  absl::StatusOr<bool> recorded =
      records_.RecordIndex("local/triton", "k", {.disk_bytes = 8192, .link_extension = ".json"}, "client");
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_TRUE(*recorded);
  EXPECT_EQ(Count("SELECT index_disk_bytes FROM entries WHERE key = 'k'"), 8192);
  EXPECT_EQ(Count("SELECT count(*) FROM entries WHERE index_namespace = 'client' "
                  "AND link_extension = '.json'"),
            1);

  ASSERT_TRUE(records_.RecordIndex("local/triton", "k", {.disk_bytes = 4096, .link_extension = std::nullopt}, "client").ok());
  EXPECT_EQ(Count("SELECT count(*) FROM entries WHERE link_extension IS NULL"), 1)
      << "an index without a link: none recorded";

  EXPECT_EQ(records_.RecordIndex("local/triton", "gone", {.disk_bytes = 1, .link_extension = std::nullopt}, "client").value_or(true),
            false);
}

}  // namespace
}  // namespace kiln::cache
