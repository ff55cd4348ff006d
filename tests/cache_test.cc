// Tests of the artifact store on real SQLite files in a fresh directory.

#include "cache/artifact_store.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "gtest/gtest.h"
#include "tests/test_dir.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;
using ::kiln::testing::TestBytes;
using ::kiln::testing::TestDir;

class ArtifactStoreTest : public ::testing::Test {
 protected:
  StoreOptions Options() const {
    StoreOptions options;
    options.data_dir = dir_.path() / "data";
    // Served copies of what went are removed with it (the grace has a test).
    options.served_copy_grace = absl::ZeroDuration();
    return options;
  }

  std::unique_ptr<ArtifactStore> OpenStore(StoreOptions options) {
    absl::StatusOr<std::unique_ptr<ArtifactStore>> store = ArtifactStore::Open(std::move(options));
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  // Runs SQL on the database file through a separate connection.
  std::string QueryText(const std::string& sql) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open((dir_.path() / "data" / "kiln.db").c_str(), &db), SQLITE_OK);
    sqlite3_stmt* stmt = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sql;
    std::string result;
    if (sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0) != nullptr) {
      result = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return result;
  }

  void ExecSql(const std::string& sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_.path() / "data" / "kiln.db").c_str(), &db), SQLITE_OK);
    char* error = nullptr;
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK)
        << (error ? error : "");
    sqlite3_free(error);
    sqlite3_close(db);
  }

  std::vector<fs::path> BlobFiles() const {
    std::vector<fs::path> files;
    for (const auto& entry : fs::recursive_directory_iterator(dir_.path() / "data" / "blobs")) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
    return files;
  }

  TestDir dir_;
};

std::vector<BlobInput> KernelBlobs(uint32_t seed) {
  return {
      {"k.cubin", TestBytes(200 * 1024, seed), ""},            // file blob
      {"k.json", TestBytes(300, seed + 1, true), ""},           // inline, compressible
      {"k.ptx", TestBytes(100 * 1024, seed + 2, true), ""},     // compressed below threshold
  };
}

void ExpectEntryMatches(const CacheEntry& entry, const std::vector<BlobInput>& expected) {
  ASSERT_EQ(entry.blobs.size(), expected.size());
  for (const BlobInput& input : expected) {
    auto found = std::find_if(entry.blobs.begin(), entry.blobs.end(),
                              [&](const StoredBlob& blob) { return blob.name == input.name; });
    ASSERT_NE(found, entry.blobs.end()) << input.name;
    ASSERT_TRUE(found->data.has_value()) << input.name;
    EXPECT_EQ(*found->data, input.data) << input.name;
    EXPECT_EQ(found->size, input.data.size());
    EXPECT_EQ(found->digest, DigestBytes(Sha256(input.data)));
  }
}

TEST_F(ArtifactStoreTest, StoresAndReturnsEveryBlob) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store->Put("triton", "key1", KernelBlobs(1)).ok());
  absl::StatusOr<CacheEntry> entry = store->Lookup("triton", "key1");
  ASSERT_TRUE(entry.ok()) << entry.status();
  ExpectEntryMatches(*entry, KernelBlobs(1));
  EXPECT_TRUE(std::is_sorted(entry->blobs.begin(), entry->blobs.end(),
                             [](const auto& a, const auto& b) { return a.name < b.name; }));
  // The same key in another namespace is a different entry.
  EXPECT_TRUE(absl::IsNotFound(store->Lookup("launcher", "key1").status()));
  absl::StatusOr<StoreStats> stats = store->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->hits, 1u);
  EXPECT_EQ(stats->misses, 1u);
  EXPECT_EQ(stats->entries, 1u);
  EXPECT_EQ(stats->blobs, 3u);
}

TEST_F(ArtifactStoreTest, HitsServedByAClientsOwnCopiesAreCountedForStoredKeysOnly) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store->Put("triton", "key1", KernelBlobs(1)).ok());
  absl::StatusOr<uint64_t> recorded = store->RecordHits("triton", {"key1", "gone", "key1"});
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_EQ(*recorded, 2u);
  absl::StatusOr<StoreStats> stats = store->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->hits, 2u);
  EXPECT_EQ(stats->misses, 0u);
  EXPECT_EQ(stats->lookups_by_namespace.at("triton").first, 2u);
}

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST_F(ArtifactStoreTest, HitsClientsJournalBesideServedFilesAreCountedOnceInTheirScope) {
  StoreOptions options = Options();
  options.served_namespace_prefix = "local/";
  options.lru_flush_interval = absl::Hours(1);  // no collection but the test's
  auto store = OpenStore(options);
  ASSERT_TRUE(store->Put("local/triton", "key1", KernelBlobs(1)).ok());
  ASSERT_TRUE(store->Put("other/triton", "key2", KernelBlobs(2)).ok());
  const fs::path hits = dir_.path() / "data" / "files" / "hits";
  ASSERT_TRUE(fs::is_directory(hits));
  // Two clients' batches; lines that do not parse, keys not stored and another
  // scope's key count for nothing.
  WriteText(hits / "a.hits", "triton\tkey1\ntriton\tkey1\ntriton\tgone\nno tab here\n\ttriton\n");
  WriteText(hits / "b.hits", "triton\tkey2\ntriton\tkey1");
  // Not complete yet (a client writes, then renames): left for later.
  WriteText(hits / ".c.tmp", "triton\tkey1\n");
  // Larger than any client writes: dropped unread.
  WriteText(hits / "huge.hits", std::string(HitJournal::kMaxFileBytes + 1, 'x'));
  EXPECT_EQ(store->CollectJournaledHits(), 5u);  // read, stored or not
  absl::StatusOr<StoreStats> stats = store->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->hits, 3u);
  EXPECT_EQ(stats->lookups_by_namespace.at("local/triton").first, 3u);
  EXPECT_EQ(stats->lookups_by_namespace.count("other/triton"), 0u);
  EXPECT_FALSE(fs::exists(hits / "a.hits"));
  EXPECT_FALSE(fs::exists(hits / "b.hits"));
  EXPECT_FALSE(fs::exists(hits / "huge.hits"));
  EXPECT_TRUE(fs::exists(hits / ".c.tmp"));
  // Each file counts once: nothing is left to collect.
  EXPECT_EQ(store->CollectJournaledHits(), 0u);
  EXPECT_EQ(store->Stats()->hits, 3u);
}

TEST_F(ArtifactStoreTest, ATenantOverItsCapLosesItsOwnLeastRecentlyUsedEntriesOnly) {
  StoreOptions options = Options();
  options.zstd_level = 0;
  options.capped_domain_prefix = "tenant:";
  options.max_domain_bytes = 500 * 1024;
  options.lru_flush_interval = absl::Hours(1);  // no enforcement but the test's
  auto store = OpenStore(options);
  auto one_blob = [](uint32_t seed) {
    return std::vector<BlobInput>{{"k.cubin", TestBytes(100 * 1024, seed), ""}};
  };
  // Older than anything alpha puts: a global LRU would evict these first.
  ASSERT_TRUE(store->Put("tenant:beta/triton", "beta", one_blob(1)).ok());
  ASSERT_TRUE(store->Put("local/triton", "mine", one_blob(2)).ok());
  for (uint32_t i = 0; i < 10; ++i) {
    ASSERT_TRUE(store->Put("tenant:alpha/triton", absl::StrCat("alpha-", i), one_blob(10 + i)).ok());
  }
  EXPECT_EQ(store->DomainBytes("tenant:alpha").value_or(0), 10u * 100 * 1024);
  ASSERT_TRUE(store->Lookup("tenant:alpha/triton", "alpha-0").ok());  // used: kept over alpha-1
  absl::StatusOr<uint64_t> evicted = store->EnforceDomainCaps();
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  // Down to 90% of the cap: four entries of 100 KiB, alpha's most recently used.
  EXPECT_EQ(*evicted, 6u);
  EXPECT_EQ(store->DomainBytes("tenant:alpha").value_or(0), 4u * 100 * 1024);
  EXPECT_TRUE(store->Lookup("tenant:alpha/triton", "alpha-0").ok());
  EXPECT_TRUE(store->Lookup("tenant:alpha/triton", "alpha-9").ok());
  EXPECT_TRUE(absl::IsNotFound(store->Lookup("tenant:alpha/triton", "alpha-1").status()));
  EXPECT_TRUE(store->Lookup("tenant:beta/triton", "beta").ok());
  EXPECT_TRUE(store->Lookup("local/triton", "mine").ok());
  // Its blobs went with them; nothing is left to enforce.
  EXPECT_EQ(store->Stats()->stored_bytes, 6u * 100 * 1024);
  EXPECT_EQ(store->EnforceDomainCaps().value_or(99), 0u);
}

TEST_F(ArtifactStoreTest, ManifestReferencesStoredBlobsBesideNewOnes) {
  auto store = OpenStore(Options());
  absl::StatusOr<std::vector<StoredBlob>> stored = store->Put("shared", "result", KernelBlobs(1));
  ASSERT_TRUE(stored.ok());
  ArtifactStore::BlobReferences references;
  for (const StoredBlob& blob : *stored) {
    references.push_back({blob.name, blob.digest, blob.store_key});
    // A small blob is a row of the entry's: its store key, not its content, finds it.
    EXPECT_EQ(blob.store_key.empty(), blob.name == "k.cubin") << blob.name;
    if (!blob.store_key.empty()) {
      EXPECT_TRUE(absl::IsFailedPrecondition(
          store->Put("triton", "by-content", {}, {{blob.name, blob.digest, ""}}).status()));
    }
  }
  const uint64_t blobs_before = store->Stats()->blobs;
  ASSERT_TRUE(store->Put("triton", "alias", {{"k.ttir", "client ttir", ""}}, references).ok());
  EXPECT_EQ(store->Stats()->blobs, blobs_before + 1) << "the alias shares the entry's blobs";
  absl::StatusOr<CacheEntry> alias = store->Lookup("triton", "alias");
  ASSERT_TRUE(alias.ok()) << alias.status();
  EXPECT_EQ(alias->blobs.size(), stored->size() + 1);
  // Read as files, the rows are keyed by content: a reference by their old
  // store keys still finds them, by digest.
  ASSERT_TRUE(store->ServeAsFiles("shared", "result", ArtifactStore::AsFiles{"triton"}).ok());
  ASSERT_TRUE(store->Put("triton", "alias2", {{"k.ttir", "client ttir", ""}}, references).ok());
  EXPECT_EQ(store->Stats()->blobs, blobs_before + 2);
  // The entry is replaced: the aliases keep the blobs they share.
  ASSERT_TRUE(store->Put("shared", "result", KernelBlobs(2)).ok());
  std::vector<BlobInput> expected = KernelBlobs(1);
  expected.push_back({"k.ttir", "client ttir", ""});
  for (const char* key : {"alias", "alias2"}) {
    alias = store->Lookup("triton", key);
    ASSERT_TRUE(alias.ok()) << alias.status();
    ExpectEntryMatches(*alias, expected);
  }
  // A reference to a blob the store does not hold is refused, and nothing is stored.
  EXPECT_TRUE(absl::IsFailedPrecondition(
      store->Put("triton", "bad", {}, {{"k.cubin", std::string(32, 'x'), ""}}).status()));
  EXPECT_TRUE(absl::IsNotFound(store->Lookup("triton", "bad").status()));
}

TEST_F(ArtifactStoreTest, LargeBlobsLiveInShortNamedFilesAndSmallOnesInline) {
  StoreOptions options = Options();
  options.zstd_level = 0;
  auto store = OpenStore(options);
  ASSERT_TRUE(store->Put("triton", "key1", KernelBlobs(1)).ok());
  // Uncompressed: the 200 KiB and 100 KiB blobs reach the 48 KiB threshold.
  const std::vector<fs::path> files = BlobFiles();
  ASSERT_EQ(files.size(), 2u);
  for (const fs::path& file : files) {
    EXPECT_EQ(file.filename().string().size(), 64u);
    EXPECT_LT(fs::relative(file, options.data_dir).string().size(), 80u);
  }
  EXPECT_EQ(QueryText("SELECT count(*) FROM blobs WHERE location = 0 AND data IS NOT NULL"), "1");
}

TEST_F(ArtifactStoreTest, OmitsDataOfBlobsTheCallerHas) {
  auto store = OpenStore(Options());
  std::vector<BlobInput> blobs = KernelBlobs(2);
  ASSERT_TRUE(store->Put("triton", "key", blobs).ok());
  const std::string cubin_digest = DigestBytes(Sha256(blobs[0].data));
  absl::StatusOr<CacheEntry> entry = store->Lookup("triton", "key", {cubin_digest});
  ASSERT_TRUE(entry.ok());
  for (const StoredBlob& blob : entry->blobs) {
    EXPECT_EQ(blob.data.has_value(), blob.digest != cubin_digest) << blob.name;
  }
}

TEST_F(ArtifactStoreTest, ReopenedStoreServesWhatWasCommitted) {
  {
    auto store = OpenStore(Options());
    for (uint32_t i = 0; i < 5; ++i) {
      ASSERT_TRUE(store->Put("triton", absl::StrCat("key", i), KernelBlobs(i)).ok());
    }
  }
  EXPECT_EQ(QueryText("PRAGMA user_version"), "4");
  EXPECT_EQ(QueryText("SELECT count(*) FROM entries"), "5");
  auto store = OpenStore(Options());
  for (uint32_t i = 0; i < 5; ++i) {
    absl::StatusOr<CacheEntry> entry = store->Lookup("triton", absl::StrCat("key", i));
    ASSERT_TRUE(entry.ok()) << entry.status();
    ExpectEntryMatches(*entry, KernelBlobs(i));
  }
  EXPECT_EQ(store->Stats()->stored_bytes,
            std::stoull(QueryText("SELECT sum(stored_size) FROM blobs")));
}

// An open after a clean stop takes the totals that stop saved, not a count
// of the whole database (seconds at a million entries); after any other stop
// it counts, and a saved row it did not take never outlives the open.
TEST_F(ArtifactStoreTest, TotalsSavedByACleanStopAreTakenOnlyAfterOne) {
  const ArtifactStore::AsFiles as_files{"triton"};
  {
    auto store = OpenStore(Options());
    for (uint32_t i = 0; i < 5; ++i) {
      ASSERT_TRUE(store->Put("triton", absl::StrCat("key", i), KernelBlobs(i)).ok());
    }
    ASSERT_TRUE(store->Lookup("triton", "key1", {}, &as_files).ok());  // served files count too
  }
  EXPECT_EQ(QueryText("SELECT entries FROM clean_stop_totals"), "5");
  const auto totals_of = [](ArtifactStore& store) {
    absl::StatusOr<StoreStats> stats = store.Stats();
    EXPECT_TRUE(stats.ok()) << stats.status();
    return std::vector<uint64_t>{stats->entries, stats->blobs, stats->stored_bytes, stats->disk_bytes};
  };
  std::vector<uint64_t> saved;
  {
    auto store = OpenStore(Options());
    saved = totals_of(*store);
    EXPECT_EQ(saved[0], 5u);
    EXPECT_EQ(QueryText("SELECT count(*) FROM clean_stop_totals"), "0");
  }
  // Marked so that a count would tell: taken as saved after a clean stop...
  ExecSql("UPDATE clean_stop_totals SET entries = 7");
  std::vector<uint64_t> marked = saved;
  marked[0] = 7;
  {
    auto store = OpenStore(Options());
    EXPECT_EQ(totals_of(*store), marked);
  }
  // ...and counted after a kill, which leaves no clean-stop mark: the count
  // is what the clean stop saved.
  ExecSql("UPDATE clean_stop_totals SET entries = 7");
  ASSERT_TRUE(fs::remove(dir_.path() / "data" / "clean-stop"));
  auto store = OpenStore(Options());
  EXPECT_EQ(totals_of(*store), saved);
  EXPECT_EQ(QueryText("SELECT count(*) FROM clean_stop_totals"), "0");
}

TEST_F(ArtifactStoreTest, ReplacingAnEntryFreesBlobsNoLongerUsed) {
  StoreOptions options = Options();
  options.zstd_level = 0;
  auto store = OpenStore(options);
  ASSERT_TRUE(store->Put("triton", "key", KernelBlobs(1)).ok());
  ASSERT_TRUE(store->Put("triton", "key", KernelBlobs(7)).ok());
  ExpectEntryMatches(*store->Lookup("triton", "key"), KernelBlobs(7));
  EXPECT_EQ(store->Stats()->blobs, 3u);
  EXPECT_EQ(BlobFiles().size(), 2u);
}

TEST_F(ArtifactStoreTest, IdenticalFileBlobsAreStoredOnceAndSmallOnesOnceServedAsFiles) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store->Put("triton", "a", KernelBlobs(3)).ok());
  ASSERT_TRUE(store->Put("triton", "b", KernelBlobs(3)).ok());
  absl::StatusOr<StoreStats> stats = store->Stats();
  EXPECT_EQ(stats->entries, 2u);
  // The cubin (a file) once; the json and ptx (small) a row per entry, each
  // keyed by a placeholder: no digest index page to write at put or eviction.
  EXPECT_EQ(stats->blobs, 5u);
  EXPECT_EQ(QueryText("SELECT count(*) FROM blobs WHERE length(digest) = 9 AND content_digest IS NOT NULL"), "4");
  const uint64_t stored_bytes = stats->stored_bytes;
  // Served as files, each small blob's rows become one, keyed by content,
  // whose served copy both entries' files name.
  const ArtifactStore::AsFiles as_files{"triton"};
  ASSERT_TRUE(store->ServeAsFiles("triton", "a", as_files).ok());
  EXPECT_EQ(store->Stats()->blobs, 5u);
  ASSERT_TRUE(store->ServeAsFiles("triton", "b", as_files).ok());
  stats = store->Stats();
  EXPECT_EQ(stats->blobs, 3u);
  EXPECT_LT(stats->stored_bytes, stored_bytes);
  EXPECT_EQ(QueryText("SELECT count(*) FROM blobs WHERE content_digest IS NOT NULL"), "0");
  EXPECT_EQ(QueryText("SELECT count(*) FROM blobs"), "3");
  EXPECT_EQ(QueryText("SELECT total(stored_size) FROM blobs"),
            QueryText(absl::StrCat("SELECT ", stats->stored_bytes, ".0")));
  for (const char* key : {"a", "b"}) {
    absl::StatusOr<CacheEntry> entry = store->Lookup("triton", key);
    ASSERT_TRUE(entry.ok()) << entry.status();
    ExpectEntryMatches(*entry, KernelBlobs(3));
  }
  // Entry a goes: b keeps every blob, a's row of nothing is left behind.
  ASSERT_TRUE(store->Put("triton", "a", KernelBlobs(4)).ok());
  absl::StatusOr<CacheEntry> entry = store->Lookup("triton", "b");
  ASSERT_TRUE(entry.ok()) << entry.status();
  ExpectEntryMatches(*entry, KernelBlobs(3));
  EXPECT_EQ(store->Stats()->blobs, 6u);
}

TEST_F(ArtifactStoreTest, RefusesMalformedPuts) {
  auto store = OpenStore(Options());
  EXPECT_TRUE(absl::IsInvalidArgument(store->Put("triton", "k", {}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Put("triton", "k", {{"a", "x", ""}, {"a", "y", ""}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      store->Put("triton", "k", {{"a", "data", DigestBytes(Sha256("other data"))}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Put("", "k", {{"a", "x", ""}}).status()));
  EXPECT_EQ(store->Stats()->entries, 0u);
}

TEST_F(ArtifactStoreTest, ConcurrentWritersAndReadersSeeOnlyCompleteEntries) {
  auto store = OpenStore(Options());
  constexpr int kWriters = 4;
  constexpr int kReaders = 4;
  constexpr int kPutsPerWriter = 40;
  std::atomic<bool> writers_done{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < kPutsPerWriter; ++i) {
        const uint32_t seed = static_cast<uint32_t>(w * 1000 + i);
        if (!store->Put("triton", absl::StrCat("k", seed), KernelBlobs(seed)).ok()) ++failures;
      }
    });
  }
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&, r] {
      uint32_t i = 0;
      while (!writers_done.load()) {
        const uint32_t seed = static_cast<uint32_t>((r + i) % kWriters * 1000 + i % kPutsPerWriter);
        absl::StatusOr<CacheEntry> entry = store->Lookup("triton", absl::StrCat("k", seed));
        if (entry.ok()) {
          // A hit is always the complete, correct entry.
          const std::vector<BlobInput> expected = KernelBlobs(seed);
          if (entry->blobs.size() != expected.size()) ++failures;
          for (size_t b = 0; b < expected.size() && b < entry->blobs.size(); ++b) {
            if (entry->blobs[b].data != expected[b].data) ++failures;
          }
        } else if (!absl::IsNotFound(entry.status())) {
          ++failures;
        }
        ++i;
      }
    });
  }
  for (int w = 0; w < kWriters; ++w) threads[w].join();
  writers_done = true;
  for (size_t t = kWriters; t < threads.size(); ++t) threads[t].join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store->Stats()->entries, static_cast<uint64_t>(kWriters * kPutsPerWriter));
  EXPECT_EQ(QueryText("PRAGMA integrity_check"), "ok");
}

TEST_F(ArtifactStoreTest, PutManyStoresEachEntryOrRefusesItAloneBesideSinglePuts) {
  auto store = OpenStore(Options());
  // More entries than one group commit takes, so the call spans several,
  // while another writer's single puts share them.
  constexpr int kEntries = 1300;
  constexpr int kSinglePuts = 200;
  const auto data_of = [](int i) { return TestBytes(1024 + i % 3000, static_cast<uint32_t>(i)); };
  std::vector<ArtifactStore::EntryInput> entries;
  for (int i = 0; i < kEntries; ++i) {
    entries.push_back({"triton", absl::StrCat("many", i), {{"k.cubin", data_of(i), ""}}});
  }
  entries[7].blobs.push_back({"k.cubin", "again", ""});            // a repeated name
  entries[700].blobs[0].expected_digest = std::string(32, '\x01');  // damaged in transit
  std::thread single_writer([&] {
    for (int i = 0; i < kSinglePuts; ++i) {
      EXPECT_TRUE(store->Put("triton", absl::StrCat("one", i), {{"k.cubin", data_of(-i - 1), ""}}).ok());
    }
  });
  const std::vector<absl::Status> results = store->PutMany(entries);
  single_writer.join();
  ASSERT_EQ(results.size(), static_cast<size_t>(kEntries));
  for (int i = 0; i < kEntries; ++i) {
    absl::StatusOr<CacheEntry> entry = store->Lookup("triton", absl::StrCat("many", i));
    if (i == 7 || i == 700) {
      EXPECT_TRUE(absl::IsInvalidArgument(results[i])) << i << ": " << results[i];
      EXPECT_TRUE(absl::IsNotFound(entry.status())) << i;
      continue;
    }
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i];
    ASSERT_TRUE(entry.ok()) << i << ": " << entry.status();
    ASSERT_EQ(entry->blobs.size(), 1u);
    EXPECT_EQ(entry->blobs[0].data, data_of(i)) << i;
  }
  EXPECT_NE(results[700].message().find("SHA-256"), std::string::npos) << results[700];
  EXPECT_EQ(store->Stats()->entries, static_cast<uint64_t>(kEntries - 2 + kSinglePuts));
  EXPECT_EQ(QueryText("PRAGMA integrity_check"), "ok");

  // A stop refuses what is not committed yet, whole, and says so.
  store->RequestStop();
  const std::vector<absl::Status> after_stop = store->PutMany(
      {{"triton", "late", {{"k.cubin", "late bytes", ""}}}});
  ASSERT_EQ(after_stop.size(), 1u);
  EXPECT_TRUE(absl::IsUnavailable(after_stop[0])) << after_stop[0];
  EXPECT_NE(after_stop[0].message().find("stopping"), std::string::npos) << after_stop[0];
  EXPECT_TRUE(absl::IsNotFound(store->Lookup("triton", "late").status()));
}

TEST_F(ArtifactStoreTest, AnImportKeepsWhatIsStoredAndTakesBackAllItStoredWhenAbandoned) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store->Put("triton", "same", {{"k.cubin", "same bytes", ""}}).ok());
  ASSERT_TRUE(store->Put("triton", "other", {{"k.cubin", "stored bytes", ""}}).ok());
  std::vector<ArtifactStore::EntryInput> entries = {
      {"triton", "same", {{"k.cubin", "same bytes", ""}}},
      {"triton", "other", {{"k.cubin", "imported bytes", ""}}},
      {"triton", "new", {{"k.cubin", "new bytes", ""}}},
  };
  const ArtifactStore::ImportMode import{.id = 7, .replace = false};
  std::vector<ArtifactStore::ImportedAs> how;
  std::vector<absl::Status> results = store->PutMany(entries, &import, &how);
  ASSERT_EQ(results.size(), 3u);
  for (const absl::Status& result : results) EXPECT_TRUE(result.ok()) << result;
  EXPECT_EQ(how, (std::vector<ArtifactStore::ImportedAs>{ArtifactStore::ImportedAs::kUnchanged,
                                                          ArtifactStore::ImportedAs::kConflict,
                                                          ArtifactStore::ImportedAs::kStored}));
  EXPECT_EQ(*store->Lookup("triton", "other")->blobs[0].data, "stored bytes");
  ASSERT_TRUE(store->Lookup("triton", "new").ok());

  // Abandoned: what it stored goes, what was stored before stays.
  absl::StatusOr<uint64_t> removed = store->AbandonImport(7);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 1u);
  EXPECT_TRUE(absl::IsNotFound(store->Lookup("triton", "new").status()));
  EXPECT_EQ(*store->Lookup("triton", "same")->blobs[0].data, "same bytes");
  EXPECT_EQ(*store->Lookup("triton", "other")->blobs[0].data, "stored bytes");
  EXPECT_EQ(store->Stats()->entries, 2u);

  // Asked to replace: the entry with other bytes is replaced; finished, it all stays.
  const ArtifactStore::ImportMode replacing{.id = 8, .replace = true};
  results = store->PutMany(entries, &replacing, &how);
  EXPECT_EQ(how[1], ArtifactStore::ImportedAs::kReplaced);
  ASSERT_TRUE(store->FinishImport(8).ok());
  EXPECT_EQ(*store->Lookup("triton", "other")->blobs[0].data, "imported bytes");
  EXPECT_EQ(store->Stats()->entries, 3u);
  EXPECT_EQ(QueryText("SELECT count(*) FROM imported_entries"), "0");
}

TEST_F(ArtifactStoreTest, AnImportThatAStopCutShortIsTakenBackAtTheNextOpen) {
  {
    auto store = OpenStore(Options());
    ASSERT_TRUE(store->Put("triton", "before", {{"k.cubin", "before", ""}}).ok());
    std::vector<ArtifactStore::EntryInput> entries;
    for (int i = 0; i < 1500; ++i) {  // more than a batch of taking back
      entries.push_back({"triton", absl::StrCat("imported", i), {{"k.cubin", TestBytes(2000, i), ""}}});
    }
    const ArtifactStore::ImportMode import{.id = 9, .replace = false};
    std::vector<ArtifactStore::ImportedAs> how;
    for (const absl::Status& result : store->PutMany(std::move(entries), &import, &how)) {
      ASSERT_TRUE(result.ok()) << result;
    }
    store->RequestStop();  // before the import finished
    absl::StatusOr<uint64_t> removed = store->AbandonImport(9);
    ASSERT_TRUE(removed.ok());
    EXPECT_EQ(*removed, 0u);  // a stop: the next open takes them back
  }
  auto store = OpenStore(Options());
  for (int waited = 0; store->Stats()->entries > 1 && waited < 600; ++waited) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(store->Stats()->entries, 1u);
  EXPECT_TRUE(store->Lookup("triton", "before").ok());
  EXPECT_TRUE(absl::IsNotFound(store->Lookup("triton", "imported0").status()));
  EXPECT_EQ(QueryText("SELECT count(*) FROM imported_entries"), "0");
}

TEST_F(ArtifactStoreTest, TheWalIsCheckpointedBesideTheCommitsAndEndsEmpty) {
  StoreOptions options = Options();
  // A cap whose checkpoints come every 1,024 pages (4 MiB) of WAL.
  options.max_size_bytes = 128 << 20;
  auto store = OpenStore(options);
  // 64 MiB of inline blobs, a commit each, which no commit checkpoints itself
  // (the checkpointer's thread does). How far the WAL grows meanwhile depends
  // on how fast commits come while a checkpoint syncs (a loaded machine's
  // are slow), but it never holds most of what was written.
  constexpr int kPuts = 16000;
  for (int i = 0; i < kPuts; ++i) {
    ASSERT_TRUE(store->Put("triton", absl::StrCat("k", i),
                           {{"k.bin", TestBytes(4096, static_cast<uint32_t>(i)), ""}})
                    .ok());
  }
  const fs::path wal = dir_.path() / "data" / "kiln.db-wal";
  ASSERT_TRUE(fs::exists(wal));
  EXPECT_LT(fs::file_size(wal), 40u << 20) << "the WAL held most of what was written";
  // Once the writer idles, the WAL is cut to nothing.
  for (int i = 0; i < 500 && fs::file_size(wal) > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(fs::file_size(wal), 0u);
  EXPECT_GT(fs::file_size(dir_.path() / "data" / "kiln.db"), 60u << 20)
      << "the database file got what the WAL held";
  EXPECT_EQ(store->Stats()->entries, static_cast<uint64_t>(kPuts));
}

TEST_F(ArtifactStoreTest, EvictionStaysUnderTheCapAndKeepsRecentlyUsedEntries) {
  StoreOptions options = Options();
  options.zstd_level = 0;
  options.max_size_bytes = 1 << 20;
  auto store = OpenStore(options);
  auto entry_blob = [](uint32_t seed) {
    return std::vector<BlobInput>{{"k.cubin", TestBytes(20 * 1024, seed), ""}};
  };
  // Under the cap so far: what eviction takes is decided by the lookups below.
  for (uint32_t i = 0; i < 30; ++i) {
    ASSERT_TRUE(store->Put("triton", absl::StrCat("old", i), entry_blob(i)).ok());
  }
  for (uint32_t i = 0; i < 10; ++i) {
    ASSERT_TRUE(store->Lookup("triton", absl::StrCat("old", i)).ok());
  }
  for (uint32_t i = 0; i < 20; ++i) {
    ASSERT_TRUE(store->Put("triton", absl::StrCat("new", i), entry_blob(100 + i)).ok());
  }
  // 50 x 20 KiB (and the database's pages around them) is over the 1 MiB cap;
  // the background evictor brings what the directory holds on disk under it.
  // One snapshot per look: eviction counts its entries when a pass ends.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  absl::StatusOr<StoreStats> stats = store->Stats();
  while ((stats->disk_bytes > options.max_size_bytes || stats->evicted_entries == 0) &&
         absl::Now() < deadline) {
    std::this_thread::yield();
    stats = store->Stats();
  }
  EXPECT_LE(stats->disk_bytes, options.max_size_bytes);
  EXPECT_GE(stats->disk_bytes, stats->stored_bytes);
  EXPECT_GT(stats->evicted_entries, 0u);
  uint64_t on_disk = 0;
  for (const auto& file : std::filesystem::recursive_directory_iterator(options.data_dir)) {
    if (file.is_regular_file()) on_disk += file.file_size();
  }
  EXPECT_LE(on_disk, options.max_size_bytes + options.max_size_bytes / 10);
  for (uint32_t i = 0; i < 10; ++i) {
    EXPECT_TRUE(store->Lookup("triton", absl::StrCat("old", i)).ok()) << "recently used old" << i;
  }
  for (uint32_t i = 0; i < 20; ++i) {
    EXPECT_TRUE(store->Lookup("triton", absl::StrCat("new", i)).ok()) << "new" << i;
  }
  EXPECT_TRUE(absl::IsNotFound(store->Lookup("triton", "old10").status()));
  // One snapshot: another pass may still be evicting (puts made while the
  // first ran took the store over its cap again).
  EXPECT_EQ(QueryText("SELECT (SELECT count(*) FROM blobs) = (SELECT count(*) FROM entries)"), "1");
}

TEST_F(ArtifactStoreTest, ExplicitEvictionToSizeRemovesFiles) {
  StoreOptions options = Options();
  options.zstd_level = 0;
  auto store = OpenStore(options);
  for (uint32_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(store->Put("triton", absl::StrCat("k", i), KernelBlobs(i)).ok());
  }
  absl::StatusOr<uint64_t> evicted = store->EvictToSize(0);
  ASSERT_TRUE(evicted.ok());
  EXPECT_EQ(*evicted, 4u);
  EXPECT_EQ(store->Stats()->stored_bytes, 0u);
  EXPECT_TRUE(BlobFiles().empty());
}

TEST_F(ArtifactStoreTest, CorruptInlineBlobIsAMissAndTheEntryIsDropped) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store->Put("triton", "key", {{"k.json", "{\"name\": \"k\"}", ""}}).ok());
  ExecSql("UPDATE blobs SET data = CAST('{\"name\": \"x\"}' AS BLOB)");
  EXPECT_TRUE(absl::IsNotFound(store->Lookup("triton", "key").status()));
  EXPECT_EQ(store->Stats()->corrupt_entries_dropped, 1u);
  EXPECT_EQ(QueryText("SELECT count(*) FROM entries"), "0");
  EXPECT_EQ(QueryText("SELECT count(*) FROM blobs"), "0");
  // The key can be stored again.
  ASSERT_TRUE(store->Put("triton", "key", {{"k.json", "{}", ""}}).ok());
  EXPECT_TRUE(store->Lookup("triton", "key").ok());
}

TEST_F(ArtifactStoreTest, CorruptBlobFileIsNeverServed) {
  StoreOptions options = Options();
  options.zstd_level = 0;
  auto store = OpenStore(options);
  ASSERT_TRUE(store->Put("triton", "a", KernelBlobs(5)).ok());
  ASSERT_TRUE(store->Put("triton", "b", KernelBlobs(5)).ok());  // shares the blobs
  const fs::path file = BlobFiles().front();
  {
    std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
    stream.seekp(1000);
    stream.put('\x5a');
  }
  EXPECT_TRUE(absl::IsNotFound(store->Lookup("triton", "a").status()));
  // Every entry using the damaged blob goes with it; its file is deleted.
  EXPECT_TRUE(absl::IsNotFound(store->Lookup("triton", "b").status()));
  EXPECT_EQ(store->Stats()->corrupt_entries_dropped, 2u);
  EXPECT_FALSE(fs::exists(file));
}

TEST_F(ArtifactStoreTest, ABlobFileChangedAfterItWasServedIsNeverServed) {
  // Served once, its content is checked and its file's stamp trusted; a later
  // change, even one that keeps its size and modification time, is caught.
  StoreOptions options = Options();
  options.zstd_level = 0;
  options.trust_files_changed_before = absl::Milliseconds(100);
  auto store = OpenStore(options);
  ASSERT_TRUE(store->Put("triton", "a", KernelBlobs(6)).ok());
  // Old enough to be trusted once checked (file times tick coarsely: a file
  // changed again within its tick could keep its stamp).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(store->Lookup("triton", "a").ok());
  ASSERT_TRUE(store->Lookup("triton", "a").ok());  // trusted now: served without hashing
  const fs::path file = BlobFiles().front();
  const fs::file_time_type modified = fs::last_write_time(file);
  {
    std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
    stream.seekg(1000);
    const char original = static_cast<char>(stream.get());
    stream.seekp(1000);
    stream.put(static_cast<char>(~original));
  }
  fs::last_write_time(file, modified);
  EXPECT_TRUE(absl::IsNotFound(store->Lookup("triton", "a").status()));
  EXPECT_EQ(store->Stats()->corrupt_entries_dropped, 1u);
}

std::vector<fs::path> FilesUnder(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code error;
  for (const auto& entry : fs::recursive_directory_iterator(dir, error)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  return files;
}

std::string FileContent(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The served index entry of (ns, key): <files>/index/<h>/<63 hex>.json.
fs::path ServedIndexPath(const fs::path& data_dir, const std::string& ns, const std::string& key) {
  const std::string hex = DigestHex(DigestBytes(Sha256(ns + std::string(1, '\0') + key)));
  return data_dir / "files" / "index" / hex.substr(0, 1) / (hex.substr(1) + ".json");
}

TEST_F(ArtifactStoreTest, LookupAsFilesServesEachBlobAsAFileAndIndexesTheEntry) {
  auto store = OpenStore(Options());
  const std::vector<BlobInput> blobs = KernelBlobs(11);
  ASSERT_TRUE(store->Put("local/triton", "key", blobs).ok());
  const ArtifactStore::AsFiles as_files{"triton"};
  absl::StatusOr<CacheEntry> entry = store->Lookup("local/triton", "key", {}, &as_files);
  ASSERT_TRUE(entry.ok()) << entry.status();
  ASSERT_EQ(entry->blobs.size(), blobs.size());
  const std::string index = FileContent(ServedIndexPath(dir_.path() / "data", "triton", "key"));
  for (const StoredBlob& blob : entry->blobs) {
    ASSERT_TRUE(blob.file.has_value()) << blob.name;
    EXPECT_FALSE(blob.data.has_value());
    const BlobInput& input = *std::find_if(blobs.begin(), blobs.end(),
                                           [&](const BlobInput& b) { return b.name == blob.name; });
    EXPECT_EQ(FileContent(*blob.file), input.data) << blob.name;
    EXPECT_EQ(blob.file->filename().string(),
              DigestHex(blob.digest) + fs::path(blob.name).extension().string());
    EXPECT_NE(index.find(absl::StrCat("\"", blob.name, "\": [\"", blob.file->string(), "\", ",
                                      input.data.size(), "]")),
              std::string::npos)
        << index;
  }
  EXPECT_EQ(store->Stats()->hits, 1u);
  // Ahead of a lookup (after a local client's compile): nothing is counted.
  ASSERT_TRUE(store->ServeAsFiles("local/triton", "key", as_files).ok());
  EXPECT_EQ(store->Stats()->hits, 1u);
  EXPECT_TRUE(absl::IsNotFound(store->ServeAsFiles("local/triton", "other", as_files)));
}

TEST_F(ArtifactStoreTest, AServedFileChangedOnDiskIsWrittenAgainBeforeItIsServed) {
  StoreOptions options = Options();
  options.trust_files_changed_before = absl::Milliseconds(100);
  auto store = OpenStore(options);
  const std::vector<BlobInput> blobs = KernelBlobs(12);
  ASSERT_TRUE(store->Put("ns", "key", blobs).ok());
  const ArtifactStore::AsFiles as_files;
  const fs::path served = *store->Lookup("ns", "key", {}, &as_files)->blobs.front().file;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(store->Lookup("ns", "key", {}, &as_files).ok());  // its stamp is trusted now
  const std::string original = FileContent(served);
  const fs::file_time_type modified = fs::last_write_time(served);
  {
    std::fstream stream(served, std::ios::in | std::ios::out | std::ios::binary);
    stream.seekp(10);
    stream.put(static_cast<char>(~original[10]));
  }
  fs::last_write_time(served, modified);  // same size, same modification time
  absl::StatusOr<CacheEntry> entry = store->Lookup("ns", "key", {}, &as_files);
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(*entry->blobs.front().file, served);
  EXPECT_EQ(FileContent(served), original);
  EXPECT_EQ(store->Stats()->corrupt_entries_dropped, 0u);  // the stored blob was fine
}

TEST_F(ArtifactStoreTest, ANameThatCannotBeAFileNameComesAsBytes) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store->Put("ns", "key", {{"kernel.cubin:stream", "abc", ""}}).ok());
  const ArtifactStore::AsFiles as_files{"ns"};
  absl::StatusOr<CacheEntry> entry = store->Lookup("ns", "key", {}, &as_files);
  ASSERT_TRUE(entry.ok());
  EXPECT_FALSE(entry->blobs.front().file.has_value());
  EXPECT_EQ(entry->blobs.front().data, "abc");
  // An entry a client could not read whole from files is not indexed.
  EXPECT_FALSE(fs::exists(ServedIndexPath(dir_.path() / "data", "ns", "key")));
}

TEST_F(ArtifactStoreTest, ServedFilesGoWithTheirBlobsAndStaleOnesAtStartup) {
  const fs::path served_dir = dir_.path() / "data" / "files";
  const ArtifactStore::AsFiles as_files{"ns"};
  {
    auto store = OpenStore(Options());
    ASSERT_TRUE(store->Put("ns", "a", KernelBlobs(13)).ok());
    ASSERT_TRUE(store->Put("ns", "b", KernelBlobs(14)).ok());
    ASSERT_TRUE(store->Lookup("ns", "a", {}, &as_files).ok());
    ASSERT_TRUE(store->Lookup("ns", "b", {}, &as_files).ok());
    ASSERT_EQ(FilesUnder(served_dir).size(), 2 * 3 + 2);  // files and index entries
    ASSERT_TRUE(store->Put("ns", "a", KernelBlobs(15)).ok());  // a's old blobs are unused now
    EXPECT_EQ(FilesUnder(served_dir).size(), 3 + 2);
  }
  // What a kilnd killed between commit and cleanup leaves: a served file of a
  // blob no longer stored, an index entry naming it, a half-written file; and
  // no mark of a clean stop.
  ASSERT_TRUE(fs::remove(dir_.path() / "data" / "clean-stop"));
  const std::string gone = DigestHex(DigestBytes(Sha256("gone")));
  fs::create_directories(served_dir / gone.substr(0, 1));
  std::ofstream(served_dir / gone.substr(0, 1) / (gone + ".cubin")) << "gone";
  const fs::path half_written = served_dir / gone.substr(0, 1) / ".7.tmp";
  std::ofstream(half_written) << "half";
  fs::last_write_time(half_written, fs::file_time_type::clock::now() - std::chrono::hours(1));
  // A write of the new kilnd in progress while its sweep runs: it stays.
  const fs::path being_written = served_dir / gone.substr(0, 1) / ".8.tmp";
  std::ofstream(being_written) << "being written";
  const fs::path stale_index = ServedIndexPath(dir_.path() / "data", "ns", "gone");
  fs::create_directories(stale_index.parent_path());
  std::ofstream(stale_index) << "{\"files\": {\"k.cubin\": [\""
                             << (served_dir / gone.substr(0, 1) / (gone + ".cubin")).string()
                             << "\", 4]}}";
  auto store = OpenStore(Options());
  for (int i = 0; i < 100 && fs::exists(stale_index); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the sweep runs in the background
  }
  EXPECT_FALSE(fs::exists(half_written));
  EXPECT_TRUE(fs::remove(being_written)) << "the sweep removed a write in progress";
  EXPECT_EQ(FilesUnder(served_dir).size(), 3 + 1);  // b's files and index entry
  EXPECT_TRUE(fs::exists(ServedIndexPath(dir_.path() / "data", "ns", "b")));
  EXPECT_EQ(store->EvictToSize(0).value_or(0), 2u);
  // b's index entry went with b: it holds disk space the cap counts.
  EXPECT_EQ(FilesUnder(served_dir), std::vector<fs::path>{});
}

// A served copy another process holds open cannot be removed with its blob
// (Windows; tests/wine has the real one). Here it is stood in for by what
// cannot be removed on Linux either: a directory with a file in it, at the
// copy's path. It stays counted and recorded, and goes once it can.
TEST_F(ArtifactStoreTest, AFileThatCannotBeRemovedYetIsRetriedUntilItGoes) {
  StoreOptions options = Options();
  options.lru_flush_interval = absl::Milliseconds(50);
  auto store = OpenStore(options);
  const ArtifactStore::AsFiles as_files{"ns"};
  ASSERT_TRUE(store->Put("ns", "held", {{"k.cubin", "held bytes", ""}}).ok());
  absl::StatusOr<CacheEntry> served = store->Lookup("ns", "held", {}, &as_files);
  ASSERT_TRUE(served.ok() && served->blobs[0].file.has_value());
  const fs::path copy = *served->blobs[0].file;
  fs::remove(copy);
  fs::create_directories(copy);
  std::ofstream(copy / "holder") << "in use";
  ASSERT_EQ(store->EvictToSize(0).value_or(0), 1u);
  EXPECT_TRUE(fs::exists(copy));
  EXPECT_EQ(QueryText("SELECT count(*) FROM leftover_files"), "1");
  EXPECT_GT(std::stoull(QueryText("SELECT disk_bytes FROM leftover_files")), 0u)
      << "what stays is still counted";
  fs::remove(copy / "holder");  // let go
  for (int i = 0; i < 500 && fs::exists(copy); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(fs::exists(copy));
  for (int i = 0; i < 100 && QueryText("SELECT count(*) FROM leftover_files") != "0"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(QueryText("SELECT count(*) FROM leftover_files"), "0");
}

// Fills a store in the test's data dir with two entries served as files (a:
// a kernel's three blobs and its index entry; b: one file and its link), then
// closes it: the data dir an older kilnd's test makes its own from.
void FillTwoEntriesServedAsFiles(const StoreOptions& options, int seed) {
  auto store = ArtifactStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  const ArtifactStore::AsFiles as_files{"ns"};
  ASSERT_TRUE((*store)->Put("ns", "a", KernelBlobs(seed)).ok());
  ASSERT_TRUE((*store)->Put("ns", "b", {{"k.so", "module", ""}}).ok());
  ASSERT_TRUE((*store)->Lookup("ns", "a", {}, &as_files).ok());
  ASSERT_TRUE((*store)->Lookup("ns", "b", {}, &as_files).ok());
}

void ExpectRetiredFilesDeletedInTheBackground(const fs::path& data_dir) {
  for (int i = 0; i < 500 && fs::exists(data_dir / "retired"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(fs::exists(data_dir / "retired"));
}

// The two entries of FillTwoEntriesServedAsFiles served anew and recorded:
// eviction takes every file.
void ExpectServedAnewAndEvictedWhole(ArtifactStore& store, const fs::path& served_dir) {
  const ArtifactStore::AsFiles as_files{"ns"};
  ASSERT_TRUE(store.Lookup("ns", "b", {}, &as_files).ok());
  EXPECT_EQ(FilesUnder(served_dir).size(), 4u + 2u);
  EXPECT_EQ(store.EvictToSize(0).value_or(0), 2u);
  EXPECT_EQ(FilesUnder(served_dir), std::vector<fs::path>{});
}

// A data directory as a version 1 kilnd left it: the same tables without the
// served files' records, files served from it, no clean-stop mark (version 1
// never wrote one).
TEST_F(ArtifactStoreTest, AVersion1DataDirIsMigratedAndItsUnrecordedServedFilesGo) {
  const fs::path data_dir = dir_.path() / "data";
  const fs::path served_dir = data_dir / "files";
  const ArtifactStore::AsFiles as_files{"ns"};
  ASSERT_NO_FATAL_FAILURE(FillTwoEntriesServedAsFiles(Options(), 21));
  ExecSql("DROP TABLE served_copies; DROP TABLE leftover_files; "
          "ALTER TABLE blobs DROP COLUMN content_digest; "
          "ALTER TABLE entries DROP COLUMN index_namespace; "
          "ALTER TABLE entries DROP COLUMN index_disk_bytes; "
          "ALTER TABLE entries DROP COLUMN link_extension; PRAGMA user_version = 1;");
  ASSERT_TRUE(fs::remove(data_dir / "clean-stop"));
  const std::vector<fs::path> version1_files = FilesUnder(served_dir);
  ASSERT_EQ(version1_files.size(), 4u + 2u);  // a: 3 files, an index entry; b: a file, its link

  auto store = OpenStore(Options());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(QueryText("PRAGMA user_version"), "4");
  // Nothing unrecorded is served: the old files are out of the served tree at
  // once (deleted in the background), and the entries are served anew.
  for (const fs::path& file : version1_files) EXPECT_FALSE(fs::exists(file)) << file;
  EXPECT_TRUE(fs::is_directory(served_dir / "hits")) << "where clients journal their hits";
  ExpectRetiredFilesDeletedInTheBackground(data_dir);
  absl::StatusOr<CacheEntry> a = store->Lookup("ns", "a");
  ASSERT_TRUE(a.ok()) << a.status();
  ExpectEntryMatches(*a, KernelBlobs(21));
  ASSERT_TRUE(store->Lookup("ns", "a", {}, &as_files).ok());
  ExpectServedAnewAndEvictedWhole(*store, served_dir);
}

// A data directory as a version 3 kilnd left it: every blob keyed by its
// content. It keeps its rows and served files; new small blobs get placeholders.
TEST_F(ArtifactStoreTest, AVersion3DataDirKeepsItsServedFilesAndNewSmallBlobsGetPlaceholders) {
  const ArtifactStore::AsFiles as_files{"ns"};
  ASSERT_NO_FATAL_FAILURE(FillTwoEntriesServedAsFiles(Options(), 41));
  ASSERT_EQ(QueryText("SELECT count(*) FROM blobs WHERE content_digest IS NOT NULL"), "0");
  ExecSql("ALTER TABLE blobs DROP COLUMN content_digest; PRAGMA user_version = 3");
  const std::string served = QueryText("SELECT count(*) FROM served_copies");
  ASSERT_NE(served, "0");

  auto store = OpenStore(Options());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(QueryText("PRAGMA user_version"), "4");
  EXPECT_EQ(QueryText("SELECT count(*) FROM served_copies"), served);
  absl::StatusOr<CacheEntry> a = store->Lookup("ns", "a");
  ASSERT_TRUE(a.ok()) << a.status();
  ExpectEntryMatches(*a, KernelBlobs(41));
  ASSERT_TRUE(store->Put("ns", "c", KernelBlobs(41)).ok());
  EXPECT_EQ(QueryText("SELECT count(*) FROM blobs WHERE length(digest) = 9"), "2");
  absl::StatusOr<CacheEntry> c = store->Lookup("ns", "c", {}, &as_files);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(QueryText("SELECT count(*) FROM blobs WHERE length(digest) = 9"), "0") << "served: merged into a's";
  EXPECT_EQ(QueryText("SELECT count(*) FROM blobs"), "4");  // a's three, b's module
}

// A data directory as a version 2 kilnd left it at a clean stop: its served
// files fanned out 256 ways (<hh>/), recorded, and counted in the totals it
// saved.
TEST_F(ArtifactStoreTest, AVersion2DataDirIsMigratedAndItsServedFilesAreServedAnewSixteenWays) {
  const fs::path data_dir = dir_.path() / "data";
  const fs::path served_dir = data_dir / "files";
  const ArtifactStore::AsFiles as_files{"ns"};
  ASSERT_NO_FATAL_FAILURE(FillTwoEntriesServedAsFiles(Options(), 31));
  // Version 2's layout: two hex digits of fan-out where this one has one.
  std::vector<fs::path> version2_files;
  for (const fs::path& file : FilesUnder(served_dir)) {
    const fs::path fan_out = file.parent_path();
    const std::string name = fan_out.filename().string() + file.filename().string();
    const bool keyed = fan_out.parent_path() != served_dir;  // index/ or links/
    const fs::path old_dir = fan_out.parent_path() / name.substr(0, 2);
    const fs::path old_path = old_dir / (keyed ? name.substr(2) : name);
    fs::create_directories(old_dir);
    fs::rename(file, old_path);
    version2_files.push_back(old_path);
  }
  ASSERT_EQ(version2_files.size(), 4u + 2u);  // a: 3 files, an index entry; b: a file, its link
  ExecSql("ALTER TABLE blobs DROP COLUMN content_digest; PRAGMA user_version = 2");
  ASSERT_TRUE(fs::exists(data_dir / "clean-stop"));

  auto store = OpenStore(Options());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(QueryText("PRAGMA user_version"), "4");
  for (const fs::path& file : version2_files) EXPECT_FALSE(fs::exists(file)) << file;
  EXPECT_EQ(QueryText("SELECT count(*) FROM served_copies"), "0");
  EXPECT_EQ(QueryText("SELECT count(*) FROM entries WHERE index_namespace IS NOT NULL"), "0");
  ExpectRetiredFilesDeletedInTheBackground(data_dir);
  // Served anew, one hex digit of fan-out, and counted as they are written.
  absl::StatusOr<CacheEntry> a = store->Lookup("ns", "a", {}, &as_files);
  ASSERT_TRUE(a.ok()) << a.status();
  for (const StoredBlob& blob : a->blobs) {
    ASSERT_TRUE(blob.file.has_value()) << blob.name;
    EXPECT_EQ(blob.file->parent_path().filename().string(), DigestHex(blob.digest).substr(0, 1));
  }
  ExpectServedAnewAndEvictedWhole(*store, served_dir);
}

TEST_F(ArtifactStoreTest, AnEvictedEntrysServedFilesStayForAReaderThatFoundItAMomentAgo) {
  StoreOptions options = Options();
  options.served_copy_grace = absl::Seconds(2);
  auto store = OpenStore(options);
  const ArtifactStore::AsFiles as_files{"ns"};
  ASSERT_TRUE(store->Put("ns", "a", KernelBlobs(41)).ok());
  absl::StatusOr<CacheEntry> served = store->Lookup("ns", "a", {}, &as_files);
  ASSERT_TRUE(served.ok()) << served.status();
  const fs::path index = ServedIndexPath(dir_.path() / "data", "ns", "a");
  ASSERT_TRUE(fs::exists(index));
  ASSERT_EQ(store->EvictToSize(0).value_or(0), 1u);
  // No new reader finds the entry; one that found it just before reads its files.
  EXPECT_FALSE(fs::exists(index));
  for (const StoredBlob& blob : served->blobs) {
    ASSERT_TRUE(blob.file.has_value()) << blob.name;
    EXPECT_TRUE(fs::exists(*blob.file)) << *blob.file;
  }
  EXPECT_GE(store->DiskBytes(), 200u * 1024) << "what stays is counted";
  // Then they go, within the maintenance thread's round after the grace.
  for (int i = 0; i < 300 && !FilesUnder(dir_.path() / "data" / "files").empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(FilesUnder(dir_.path() / "data" / "files"), std::vector<fs::path>{});
}

// The writer deletes what the foreign keys would cascade to itself: no row
// may be left naming one that went.
TEST_F(ArtifactStoreTest, ReplacingAndEvictingLeaveNoRowNamingOneThatWent) {
  StoreOptions options = Options();
  options.served_copy_grace = absl::ZeroDuration();
  auto store = OpenStore(options);
  const ArtifactStore::AsFiles as_files{"ns"};
  ASSERT_TRUE(store->Put("ns", "a", KernelBlobs(51)).ok());
  ASSERT_TRUE(store->Put("ns", "b", KernelBlobs(51)).ok());  // the same blobs, shared
  ASSERT_TRUE(store->Lookup("ns", "a", {}, &as_files).ok());  // served copies recorded
  ASSERT_TRUE(store->Put("ns", "a", KernelBlobs(52)).ok());   // replaced: b keeps the old blobs
  const auto dangling = [&] {
    return QueryText("SELECT count(*) FROM pragma_foreign_key_check");
  };
  EXPECT_EQ(dangling(), "0");
  EXPECT_EQ(QueryText("SELECT count(*) FROM entry_blobs"), std::to_string(2 * KernelBlobs(51).size()));
  EXPECT_NE(QueryText("SELECT count(*) FROM served_copies"), "0") << "b's blobs keep a's copies";
  ASSERT_EQ(store->EvictToSize(0).value_or(0), 2u);
  EXPECT_EQ(dangling(), "0");
  for (const char* table : {"entries", "entry_blobs", "blobs", "served_copies"}) {
    EXPECT_EQ(QueryText(absl::StrCat("SELECT count(*) FROM ", table)), "0") << table;
  }
}

TEST_F(ArtifactStoreTest, AnOperatorsEvictionWaitsOutTheGraceAndLeavesNoServedCopy) {
  StoreOptions options = Options();
  options.served_copy_grace = absl::Milliseconds(500);
  options.lru_flush_interval = absl::Hours(1);  // no maintenance round removes them meanwhile
  auto store = OpenStore(options);
  const ArtifactStore::AsFiles as_files{"ns"};
  ASSERT_TRUE(store->Put("ns", "a", KernelBlobs(42)).ok());
  ASSERT_TRUE(store->Lookup("ns", "a", {}, &as_files).ok());
  ASSERT_EQ(store->EvictToSize(0).value_or(0), 1u);
  ASSERT_NE(FilesUnder(dir_.path() / "data" / "files"), std::vector<fs::path>{}) << "in their grace";
  const absl::Time started = absl::Now();
  store->RemoveServedCopiesGone();
  EXPECT_GE(absl::Now() - started, absl::Milliseconds(400)) << "a reader's grace is kept";
  EXPECT_EQ(FilesUnder(dir_.path() / "data" / "files"), std::vector<fs::path>{});
  store->RemoveServedCopiesGone();  // none left: returns at once
}

TEST_F(ArtifactStoreTest, AnEntryOfOneFileIsLinkedByItsKeyUntilItsFileGoes) {
  const std::string name = "__triton_launcher.cpython-311-x86_64-linux-gnu.so";
  const std::string key = "abc/" + name;
  const std::string hex = DigestHex(DigestBytes(Sha256("triton-files" + std::string(1, '\0') + key)));
  const fs::path link = dir_.path() / "data" / "files" / "links" / hex.substr(0, 1) /
                        (hex.substr(1) + ".cpython-311-x86_64-linux-gnu.so");
  const ArtifactStore::AsFiles as_files{"triton-files"};
  {
    auto store = OpenStore(Options());
    ASSERT_TRUE(store->Put("local/triton-files", key, {{name, "module bytes", ""}}).ok());
    ASSERT_TRUE(store->ServeAsFiles("local/triton-files", key, as_files).ok());
#ifdef _WIN32
    if (!fs::is_symlink(link)) GTEST_SKIP() << "this account may not make symbolic links";
#endif
    ASSERT_TRUE(fs::is_symlink(link)) << link;
    EXPECT_EQ(FileContent(link), "module bytes");
    // Served again: the link stays the one there.
    ASSERT_TRUE(store->ServeAsFiles("local/triton-files", key, as_files).ok());
    EXPECT_EQ(FileContent(link), "module bytes");
    ASSERT_EQ(store->EvictToSize(0).value_or(0), 1u);
    // The file and the link went with the entry.
    EXPECT_FALSE(fs::is_symlink(link));
    EXPECT_FALSE(fs::exists(link));
    // A link left dangling by a kilnd killed between the two is swept at the
    // next start (that kilnd did not mark its stop clean).
    ASSERT_TRUE(store->Put("local/triton-files", key, {{name, "module bytes", ""}}).ok());
    ASSERT_TRUE(store->ServeAsFiles("local/triton-files", key, as_files).ok());
    ASSERT_TRUE(fs::is_symlink(link));
    fs::remove(fs::canonical(link));
  }
  ASSERT_TRUE(fs::remove(dir_.path() / "data" / "clean-stop"));
  auto store = OpenStore(Options());
  // The sweep runs in the background: up to 10 s on a loaded machine.
  for (int i = 0; i < 500 && fs::is_symlink(link); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(fs::is_symlink(link));
}

TEST_F(ArtifactStoreTest, VerifyFindsAndDropsEveryCorruptBlob) {
  StoreOptions options = Options();
  options.zstd_level = 0;
  auto store = OpenStore(options);
  ASSERT_TRUE(store->Put("triton", "a", KernelBlobs(8)).ok());
  ASSERT_TRUE(store->Put("triton", "b", {{"k.json", "{}", ""}}).ok());
  ASSERT_TRUE(store->Put("triton", "c", {{"k.json", "[1]", ""}}).ok());
  {
    std::fstream stream(BlobFiles().front(), std::ios::in | std::ios::out | std::ios::binary);
    stream.seekp(10);
    stream.put('\x01');
  }
  // b's blob, a row of its own (a placeholder key), as well as a's file.
  ExecSql("UPDATE blobs SET data = CAST('[]' AS BLOB) WHERE size = 2");
  absl::StatusOr<ArtifactStore::VerifyReport> report = store->VerifyAll();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->blobs_checked, 5u);
  EXPECT_EQ(report->corrupt_blobs, 2u);
  EXPECT_TRUE(absl::IsNotFound(store->Lookup("triton", "a").status()));
  EXPECT_TRUE(absl::IsNotFound(store->Lookup("triton", "b").status()));
  EXPECT_TRUE(store->Lookup("triton", "c").ok());
  EXPECT_EQ(store->VerifyAll()->corrupt_blobs, 0u);
}

TEST_F(ArtifactStoreTest, MissingBlobFileIsAMiss) {
  StoreOptions options = Options();
  options.zstd_level = 0;
  auto store = OpenStore(options);
  ASSERT_TRUE(store->Put("triton", "a", KernelBlobs(6)).ok());
  fs::remove(BlobFiles().front());
  EXPECT_TRUE(absl::IsNotFound(store->Lookup("triton", "a").status()));
  EXPECT_EQ(QueryText("SELECT count(*) FROM entries"), "0");
}

TEST_F(ArtifactStoreTest, RefusesADatabaseFromANewerSchema) {
  { auto store = OpenStore(Options()); }
  ExecSql("PRAGMA user_version = 99");
  absl::StatusOr<std::unique_ptr<ArtifactStore>> store = ArtifactStore::Open(Options());
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status()));
  EXPECT_NE(store.status().message().find("newer"), absl::string_view::npos);
}

TEST_F(ArtifactStoreTest, StartupRemovesFilesTheIndexDoesNotReference) {
  StoreOptions options = Options();
  { auto store = OpenStore(options); }
  ASSERT_TRUE(fs::remove(options.data_dir / "clean-stop"));  // as a killed kilnd leaves it
  const fs::path stray = options.data_dir / "blobs" / "ab" / std::string(64, 'a');
  fs::create_directories(stray.parent_path());
  std::ofstream(stray) << "left by a crash between rename and commit";
  std::ofstream(options.data_dir / "blobs" / "tmp" / "x.tmp") << "partial";
  auto store = OpenStore(options);
  // The sweep runs on the store's maintenance thread at start.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((fs::exists(stray) || !fs::is_empty(options.data_dir / "blobs" / "tmp")) &&
         absl::Now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_FALSE(fs::exists(stray));
  EXPECT_TRUE(fs::is_empty(options.data_dir / "blobs" / "tmp"));
}

// A child process writes entries as fast as it can and reports each committed
// key on a pipe; the parent SIGKILLs it mid-burst. The database must then pass
// integrity_check and serve every key the child reported.
TEST_F(ArtifactStoreTest, SurvivesSigkillDuringAWriteBurst) {
  StoreOptions options = Options();
  { auto store = OpenStore(options); }  // create the schema before forking
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(report[0]);
    absl::StatusOr<std::unique_ptr<ArtifactStore>> store = ArtifactStore::Open(options);
    if (!store.ok()) _exit(3);
    for (uint32_t i = 0;; ++i) {
      if (!(*store)->Put("triton", absl::StrCat("k", i), KernelBlobs(i)).ok()) _exit(4);
      const std::string line = absl::StrCat(i, "\n");
      if (write(report[1], line.data(), line.size()) < 0) _exit(5);
    }
  }
  close(report[1]);
  FILE* reports = fdopen(report[0], "r");
  uint32_t last_committed = 0;
  int reported = 0;
  // Let it get well into the burst, then kill it without warning.
  while (reported < 60 && fscanf(reports, "%u", &last_committed) == 1) ++reported;
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  fclose(reports);
  ASSERT_EQ(reported, 60) << "the writer died on its own";
  ASSERT_TRUE(WIFSIGNALED(status));

  EXPECT_EQ(QueryText("PRAGMA integrity_check"), "ok");
  auto store = OpenStore(options);
  for (uint32_t i = 0; i <= last_committed; ++i) {
    absl::StatusOr<CacheEntry> entry = store->Lookup("triton", absl::StrCat("k", i));
    ASSERT_TRUE(entry.ok()) << "k" << i << ": " << entry.status();
    ExpectEntryMatches(*entry, KernelBlobs(i));
  }
}

}  // namespace
}  // namespace kiln::cache
