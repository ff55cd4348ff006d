// Tests of the index's entry rows alone (cache/entry_rows.h): found, made,
// named blobs, touched, listed and deleted, on a fresh index whose blob rows
// the tests write themselves.

#include "cache/entry_rows.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/fresh_index.h"

namespace kiln::cache {
namespace {

class EntryRowsTest : public ::kiln::testing::FreshIndexTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(FreshIndexTest::SetUp());
    ASSERT_TRUE(rows_.Prepare(*db_).ok());
  }
  // A blob row whose digest is 32 octets of `hex_digit` twice; returns its id.
  int64_t Blob(char hex_digit) {
    Exec(absl::StrCat("INSERT INTO blobs (digest, size, stored_size, codec, location) VALUES (X'",
                      std::string(64, hex_digit), "', 1, 1, 0, 0)"));
    return db_->LastInsertId();
  }
  int64_t Insert(const std::string& ns, const std::string& key, int64_t created_ms = 0,
                 int64_t last_use = 0) {
    absl::StatusOr<int64_t> id = rows_.Insert(ns, key, created_ms, last_use, {});
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(-1);
  }

  EntryRows rows_;
};

TEST_F(EntryRowsTest, AnEntryIsFoundByItsNamesWithItsServedIndex) {
  EXPECT_FALSE(rows_.Find("local/triton", "k").value().has_value());
  absl::StatusOr<int64_t> id = rows_.Insert(
      "local/triton", "k", 1000, 5,
      {.disk_bytes = 4096, .link_extension = ".json", .index_namespace = "client"});
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<std::optional<EntryRows::Found>> found = rows_.Find("local/triton", "k");
  ASSERT_TRUE(found.ok() && found->has_value());
  EXPECT_EQ((*found)->id, *id);
  EXPECT_EQ((*found)->served_index.disk_bytes, 4096u);
  EXPECT_EQ((*found)->served_index.link_extension, ".json");
  EXPECT_EQ((*found)->served_index.index_namespace, "client");
  EXPECT_FALSE(rows_.Find("tenant:a/triton", "k").value().has_value());
  EXPECT_FALSE(rows_.Insert("local/triton", "k", 0, 0, {}).ok()) << "one entry of those names";
}

TEST_F(EntryRowsTest, AnEntrysBlobsComeByNameWithTheirContentsDigest) {
  const int64_t entry = Insert("local/triton", "k");
  ASSERT_TRUE(rows_.Name(entry, "a.cubin", Blob('a')).ok());
  ASSERT_TRUE(rows_.Name(entry, "b.json", Blob('b')).ok());
  EXPECT_FALSE(rows_.Name(entry, "a.cubin", Blob('c')).ok()) << "a name once an entry";
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> blobs =
      rows_.Blobs("local/triton", "k");
  ASSERT_TRUE(blobs.ok()) << blobs.status();
  std::sort(blobs->begin(), blobs->end());
  ASSERT_EQ(blobs->size(), 2u);
  EXPECT_EQ((*blobs)[0], std::make_pair(std::string("a.cubin"), std::string(32, '\xaa')));
  EXPECT_EQ((*blobs)[1].first, "b.json");
  EXPECT_TRUE(rows_.Blobs("local/triton", "none").value().empty());
}

TEST_F(EntryRowsTest, DeletedEntriesTakeTheirNamesAndTellTheBlobsTheyNamedOnce) {
  const int64_t shared = Blob('5');
  const int64_t own = Blob('0');
  const int64_t first = Insert("local/triton", "first");
  const int64_t second = Insert("local/triton", "second");
  const int64_t kept = Insert("local/triton", "kept");
  ASSERT_TRUE(rows_.Name(first, "x", shared).ok());
  ASSERT_TRUE(rows_.Name(first, "y", own).ok());
  ASSERT_TRUE(rows_.Name(second, "x", shared).ok());
  ASSERT_TRUE(rows_.Name(kept, "x", shared).ok());

  std::vector<int64_t> named;
  ASSERT_TRUE(rows_.Delete({first, second}, named).ok());
  std::sort(named.begin(), named.end());
  EXPECT_EQ(named, (std::vector<int64_t>{shared, own}));
  EXPECT_FALSE(rows_.Find("local/triton", "first").value().has_value());
  EXPECT_EQ(QueryInt("SELECT count(*) FROM entry_blobs"), 1) << "only the kept entry's name";
  EXPECT_EQ(QueryInt("SELECT count(*) FROM blobs"), 2) << "blob rows are not entry rows'";
  ASSERT_TRUE(rows_.Delete({}, named).ok());
}

TEST_F(EntryRowsTest, ATouchNeverMovesAnEntryBackInTheLruOrder) {
  const int64_t entry = Insert("local/triton", "k", 0, 10);
  ASSERT_TRUE(rows_.Touch(entry, 20).ok());
  EXPECT_EQ(QueryInt("SELECT last_use FROM entries"), 20);
  ASSERT_TRUE(rows_.Touch(entry, 15).ok()) << "a use recorded late";
  EXPECT_EQ(QueryInt("SELECT last_use FROM entries"), 20);
  ASSERT_TRUE(rows_.Touch(999, 30).ok()) << "an entry gone meanwhile: nothing";
}

TEST_F(EntryRowsTest, EntriesAreListedByIdAPageAtATimeWithinARangeAndSinceATime) {
  Insert("tenant:a/triton", "old", 100);
  const int64_t a1 = Insert("tenant:a/triton", "a1", 2000);
  Insert("tenant:b/triton", "b", 2000);
  const int64_t a2 = Insert("tenant:a/inductor", "a2", 3000);
  const int64_t a3 = Insert("tenant:a/triton", "a3", 4000);

  absl::StatusOr<std::vector<EntryRows::Listed>> page =
      rows_.ListAfter("tenant:a/", "tenant:a0", 1000, 0, 2);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].id, a1);
  EXPECT_EQ((*page)[0].key, "a1");
  EXPECT_EQ((*page)[0].created_ms, 2000);
  EXPECT_EQ((*page)[1].id, a2);
  absl::StatusOr<std::vector<EntryRows::Listed>> next =
      rows_.ListAfter("tenant:a/", "tenant:a0", 1000, a2, 2);
  ASSERT_TRUE(next.ok());
  ASSERT_EQ(next->size(), 1u);
  EXPECT_EQ((*next)[0].id, a3);
  EXPECT_TRUE(rows_.ListAfter("tenant:a/", "tenant:a0", 1000, a3, 2).value().empty());
}

}  // namespace
}  // namespace kiln::cache
