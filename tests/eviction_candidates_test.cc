// Tests of what eviction chooses from, alone (cache/eviction_candidates.h):
// the least recently used entries of the store and of one trust domain, what
// each frees, and what a domain holds, on a real index (the store's own
// schema) whose rows the tests write themselves.

#include "cache/eviction_candidates.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/fresh_index.h"

namespace kiln::cache {
namespace {

class EvictionCandidatesTest : public ::kiln::testing::FreshIndexTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(FreshIndexTest::SetUp());
    ASSERT_TRUE(candidates_.Prepare(*db_).ok());
  }
  // A blob row of `stored_size` bytes; returns its id.
  int64_t Blob(uint64_t stored_size) {
    const int64_t id = next_blob_id_++;
    Exec(absl::StrCat("INSERT INTO blobs (id, digest, size, stored_size, codec, location) VALUES (",
                      id, ", randomblob(32), ", stored_size, ", ", stored_size, ", 0, 0)"));
    return id;
  }
  // An entry used at `last_use`, naming `blob_ids`; returns its id.
  int64_t Entry(const std::string& ns, const std::string& key, int64_t last_use,
                const std::vector<int64_t>& blob_ids) {
    Exec(absl::StrCat("INSERT INTO entries (namespace, key, created_ms, last_use) VALUES ('", ns,
                      "', '", key, "', 0, ", last_use, ")"));
    const int64_t id = db_->LastInsertId();
    int name = 0;
    for (int64_t blob_id : blob_ids) {
      Exec(absl::StrCat("INSERT INTO entry_blobs (entry_id, name, blob_id) VALUES (", id, ", 'b",
                        name++, "', ", blob_id, ")"));
    }
    return id;
  }
  static std::vector<std::string> Keys(const std::vector<EntryToEvict>& entries) {
    std::vector<std::string> keys;
    for (const EntryToEvict& entry : entries) keys.push_back(entry.names.key);
    return keys;
  }

  EvictionCandidates candidates_;
  int64_t next_blob_id_ = 1;
};

TEST_F(EvictionCandidatesTest, TheLeastRecentlyUsedComeFirstAsManyAsAsked) {
  Entry("local/triton", "used-last", 30, {Blob(10)});
  Entry("local/triton", "used-first", 10, {Blob(10)});
  Entry("tenant:a/triton", "used-between", 20, {Blob(10)});

  absl::StatusOr<std::vector<EntryToEvict>> two = candidates_.LeastRecentlyUsed(2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(Keys(*two), (std::vector<std::string>{"used-first", "used-between"}));
  absl::StatusOr<std::vector<EntryToEvict>> all = candidates_.LeastRecentlyUsed(10);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(Keys(*all), (std::vector<std::string>{"used-first", "used-between", "used-last"}));
}

TEST_F(EvictionCandidatesTest, AnEntryCountsWhatEachOfItsBlobsStoresSharedOnesInFull) {
  const int64_t shared = Blob(1000);
  Entry("local/triton", "a", 1, {shared, Blob(24)});
  Entry("local/triton", "b", 2, {shared});
  Exec("UPDATE entries SET index_disk_bytes = 4096, index_namespace = 'client', "
       "link_extension = '.json' WHERE key = 'a'");

  absl::StatusOr<std::vector<EntryToEvict>> entries = candidates_.LeastRecentlyUsed(10);
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 2u);
  const EntryToEvict& a = (*entries)[0];
  EXPECT_EQ(a.names.ns, "local/triton");
  EXPECT_EQ(a.stored_bytes, 1024u);
  EXPECT_EQ(a.index_disk_bytes, 4096u);
  EXPECT_EQ(a.names.index_namespace, "client");
  EXPECT_EQ(a.names.link_extension, ".json");
  EXPECT_EQ((*entries)[1].stored_bytes, 1000u);
  EXPECT_FALSE((*entries)[1].names.index_namespace.has_value());

  EXPECT_EQ(EvictionCandidates::BytesFreedByEach(*entries, EvictionCandidates::IndexFiles::kCounted),
            (std::vector<uint64_t>{1024 + 4096, 1000}));
  EXPECT_EQ(EvictionCandidates::BytesFreedByEach(*entries, EvictionCandidates::IndexFiles::kNotCounted),
            (std::vector<uint64_t>{1024, 1000}));
}

TEST_F(EvictionCandidatesTest, ADomainsCandidatesAreItsOwnAndNoLongerNamedDomainsOrItsPrefixes) {
  Entry("tenant:a/triton", "a-old", 1, {Blob(10)});
  Entry("tenant:ab/triton", "ab", 0, {Blob(10)});     // a longer domain, not tenant:a's
  Entry("tenant:a0/triton", "a0", 0, {Blob(10)});     // '0' follows '/': the range's end
  Entry("tenant:a.b/triton", "a.b", 0, {Blob(10)});   // '.' precedes '/'
  Entry("tenant:a/inductor", "a-new", 5, {Blob(10)});
  Entry("tenant:", "bare", 0, {Blob(10)});

  absl::StatusOr<std::vector<EntryToEvict>> of_a = candidates_.LeastRecentlyUsedOf("tenant:a", 10);
  ASSERT_TRUE(of_a.ok()) << of_a.status();
  EXPECT_EQ(Keys(*of_a), (std::vector<std::string>{"a-old", "a-new"}));
  absl::StatusOr<std::vector<EntryToEvict>> first = candidates_.LeastRecentlyUsedOf("tenant:a", 1);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(Keys(*first), (std::vector<std::string>{"a-old"}));
}

TEST_F(EvictionCandidatesTest, ADomainHoldsWhatItsEntriesBlobsStoreEachOnceAnEntry) {
  const int64_t shared = Blob(100);
  Entry("tenant:a/triton", "x", 1, {shared, Blob(7)});
  Entry("tenant:a/triton", "y", 2, {shared});
  Entry("tenant:b/triton", "z", 3, {shared, Blob(50)});

  absl::StatusOr<uint64_t> a = candidates_.DomainBytes("tenant:a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, 207u) << "the shared blob counts for each entry of the domain that names it";
  EXPECT_EQ(candidates_.DomainBytes("tenant:b").value_or(0), 150u);
  EXPECT_EQ(candidates_.DomainBytes("tenant:none").value_or(1), 0u);
}

TEST_F(EvictionCandidatesTest, ByIdFindsTheEntriesStillStoredAndPassesOverThoseGone) {
  const int64_t kept = Entry("local/triton", "kept", 1, {Blob(10)});
  const int64_t gone = Entry("local/triton", "gone", 2, {Blob(10)});
  Exec(absl::StrCat("DELETE FROM entries WHERE id = ", gone));

  absl::StatusOr<std::vector<EntryToEvict>> found = candidates_.ById({kept, gone, 999});
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ((*found)[0].id, kept);
  absl::StatusOr<std::vector<EntryToEvict>> none = candidates_.ById({});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace kiln::cache
