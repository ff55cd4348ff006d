// Tests of the records of served files alone (cache/served_file_records.h):
// a blob's served copies and an entry's served index, on a real index (the
// store's own schema) whose blob and entry rows the tests write themselves.

#include "cache/served_file_records.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/fresh_index.h"

namespace kiln::cache {
namespace {

class ServedFileRecordsTest : public ::kiln::testing::FreshIndexTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(FreshIndexTest::SetUp());
    ASSERT_TRUE(records_.Prepare(*db_).ok());
  }
  // A blob row keyed by the digest X'<hex>'; returns its id.
  int64_t Blob(const std::string& hex) {
    Exec(absl::StrCat("INSERT INTO blobs (digest, size, stored_size, codec, location) VALUES (X'",
                      hex, "', 1, 1, 0, 0)"));
    return db_->LastInsertId();
  }
  static std::string Digest(const std::string& hex) { return absl::HexStringToBytes(hex); }

  ServedFileRecords records_;
};

TEST_F(ServedFileRecordsTest, ACopyOfAStoredBlobIsRecordedOncePerExtension) {
  Blob("aa");
  EXPECT_EQ(records_.RecordCopy(Digest("aa"), ".cubin", 4096).value_or(false), true);
  EXPECT_EQ(records_.RecordCopy(Digest("aa"), ".json", 4096).value_or(false), true);
  EXPECT_EQ(records_.RecordCopy(Digest("aa"), ".cubin", 8192).value_or(false), true)
      << "written again: its record replaced";
  EXPECT_EQ(QueryInt("SELECT count(*) FROM served_copies"), 2);
  EXPECT_EQ(QueryInt("SELECT disk_bytes FROM served_copies WHERE extension = '.cubin'"), 8192);
  EXPECT_EQ(records_.IsCopyRecorded(Digest("aa"), ".cubin").value_or(false), true);
  EXPECT_EQ(records_.IsCopyRecorded(Digest("aa"), ".ptx").value_or(true), false);
}

TEST_F(ServedFileRecordsTest, ACopyOfABlobThatWentIsNotRecordedAndTheCallerIsTold) {
  absl::StatusOr<bool> recorded = records_.RecordCopy(Digest("bb"), ".cubin", 4096);
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_FALSE(*recorded);
  EXPECT_EQ(QueryInt("SELECT count(*) FROM served_copies"), 0);
  EXPECT_EQ(records_.IsCopyRecorded(Digest("bb"), ".cubin").value_or(true), false);
}

TEST_F(ServedFileRecordsTest, TheCopiesOfBlobsThatGoAreForgottenAndNoOthers) {
  const int64_t going = Blob("c1");
  const int64_t staying = Blob("c2");
  ASSERT_TRUE(records_.RecordCopy(Digest("c1"), ".cubin", 1).ok());
  ASSERT_TRUE(records_.RecordCopy(Digest("c1"), ".json", 1).ok());
  ASSERT_TRUE(records_.RecordCopy(Digest("c2"), ".cubin", 1).ok());

  ASSERT_TRUE(records_.ForgetCopiesOf({going}).ok());
  EXPECT_EQ(QueryInt(absl::StrCat("SELECT count(*) FROM served_copies WHERE blob_id = ", going)), 0);
  EXPECT_EQ(QueryInt(absl::StrCat("SELECT count(*) FROM served_copies WHERE blob_id = ", staying)), 1);
  EXPECT_TRUE(records_.ForgetCopiesOf({}).ok());
}

TEST_F(ServedFileRecordsTest, AnEntrysServedIndexIsRecordedOnItsRowAndNotForAnEntryThatWent) {
  Exec("INSERT INTO entries (namespace, key, created_ms, last_use) VALUES ('local/triton', 'k', 0, 0)");
  absl::StatusOr<bool> recorded =
      records_.RecordIndex("local/triton", "k", {.disk_bytes = 8192, .link_extension = ".json"}, "client");
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_TRUE(*recorded);
  EXPECT_EQ(QueryInt("SELECT index_disk_bytes FROM entries WHERE key = 'k'"), 8192);
  EXPECT_EQ(QueryInt("SELECT count(*) FROM entries WHERE index_namespace = 'client' "
                  "AND link_extension = '.json'"),
            1);

  ASSERT_TRUE(records_.RecordIndex("local/triton", "k", {.disk_bytes = 4096, .link_extension = std::nullopt}, "client").ok());
  EXPECT_EQ(QueryInt("SELECT count(*) FROM entries WHERE link_extension IS NULL"), 1)
      << "an index without a link: none recorded";

  EXPECT_EQ(records_.RecordIndex("local/triton", "gone", {.disk_bytes = 1, .link_extension = std::nullopt}, "client").value_or(true),
            false);
}

}  // namespace
}  // namespace kiln::cache
