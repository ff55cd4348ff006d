// The store's cost per entry, independent of how many it holds: eviction finds
// an entry's served files through the index, never by reading a directory,
// and what it counts on disk is what `du` would find.
//
// Reading a directory is counted at the C library: this executable defines
// opendir and fdopendir, which the dynamic linker binds before libc's
// (std::filesystem's directory iterators call one of them), and passes each
// call on. Linux only.

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cache/artifact_store.h"
#include "gtest/gtest.h"
#include "tests/test_dir.h"

namespace {

std::mutex opened_mutex;
std::vector<std::string> opened_directories;  // guarded by opened_mutex

}  // namespace

namespace {

void NoteOpened(std::string path) {
  std::lock_guard lock(opened_mutex);
  opened_directories.push_back(std::move(path));
}

}  // namespace

extern "C" DIR* opendir(const char* name) {
  using OpenDir = DIR* (*)(const char*);
  static const auto real = reinterpret_cast<OpenDir>(dlsym(RTLD_NEXT, "opendir"));
  NoteOpened(name);
  return real(name);
}

// libstdc++'s directory iterators open the directory themselves and call this.
extern "C" DIR* fdopendir(int fd) {
  using FdOpenDir = DIR* (*)(int);
  static const auto real = reinterpret_cast<FdOpenDir>(dlsym(RTLD_NEXT, "fdopendir"));
  std::error_code error;
  NoteOpened(std::filesystem::read_symlink(absl::StrCat("/proc/self/fd/", fd), error).string());
  return real(fd);
}

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;
using ::kiln::testing::TestBytes;
using ::kiln::testing::TestDir;

// The directories read since the last call whose path contains `part`.
std::vector<std::string> TakeOpened(absl::string_view part) {
  std::lock_guard lock(opened_mutex);
  std::vector<std::string> matching;
  for (const std::string& dir : opened_directories) {
    if (absl::StrContains(dir, part)) matching.push_back(dir);
  }
  opened_directories.clear();
  return matching;
}

// What `du` counts under `root`: each file, directory and link's blocks, once.
uint64_t DiskUsage(const fs::path& root) {
  uint64_t total = 0;
  struct stat info;
  if (lstat(root.c_str(), &info) == 0) total += static_cast<uint64_t>(info.st_blocks) * 512;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(root)) {
    if (lstat(entry.path().c_str(), &info) == 0) total += static_cast<uint64_t>(info.st_blocks) * 512;
  }
  return total;
}

class StoreScaleTest : public ::testing::Test {
 protected:
  StoreOptions Options() const {
    StoreOptions options;
    options.data_dir = dir_.path() / "data";
    options.served_namespace_prefix = "local/";
    options.served_copy_grace = absl::ZeroDuration();  // removed with their blob
    options.zstd_level = 0;
    return options;
  }

  // `count` entries of one 1-4 KB blob each, served to a local client as
  // files: a served copy and a link each.
  void FillServed(ArtifactStore& store, int count) {
    const ArtifactStore::AsFiles as_files{"triton-files"};
    for (int i = 0; i < count; ++i) {
      const std::string key = absl::StrCat("entry", i);
      const auto seed = static_cast<uint32_t>(i);
      ASSERT_TRUE(store.Put("local/triton-files", key,
                            {{"kernel.cubin", TestBytes(1024 + 3 * static_cast<size_t>(i) % 3072, seed), ""}})
                      .ok());
      ASSERT_TRUE(store.ServeAsFiles("local/triton-files", key, as_files).ok());
    }
  }

  TestDir dir_;
};

TEST_F(StoreScaleTest, EvictionReadsNoDirectoryOfServedFiles) {
  absl::StatusOr<std::unique_ptr<ArtifactStore>> store = ArtifactStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  FillServed(**store, 600);
  const fs::path served = (*store)->served_files_dir();
  ASSERT_GT(DiskUsage(served / "links"), 0u);
  // The WAL the puts left cut first (an eviction to no less than the store
  // holds does only that), so that half of the rest is half of the entries.
  ASSERT_EQ((*store)->EvictToSize(UINT64_MAX).value_or(1), 0u);
  const uint64_t before = (*store)->DiskBytes();
  TakeOpened("");
  absl::StatusOr<uint64_t> evicted = (*store)->EvictToSize(before / 2);
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_GT(*evicted, 200u);
  // The maintenance thread may size the top of the tree meanwhile; no one
  // may read a directory of served files, index entries or links.
  std::vector<std::string> read;
  for (const std::string& dir : TakeOpened(served.string())) {
    const std::string below = dir.substr(served.string().size());
    if (below.size() > 1 && below != "/index" && below != "/links" && below != "/hits" &&
        !absl::StartsWith(below, "/hits/")) {
      read.push_back(dir);
    }
  }
  EXPECT_EQ(read, std::vector<std::string>{}) << "eviction read directories to find files";
  // And every file of an evicted entry went: 2 per entry left (its served
  // copy and its link; a one-file entry has no index entry), plus directories.
  uint64_t files = 0;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(served)) {
    if (!entry.is_directory() && !absl::StartsWith(entry.path().filename().string(), ".")) ++files;
  }
  EXPECT_EQ(files, 2 * (600 - *evicted));
}

// kilnd asks the store to stop as soon as it is asked to: an eviction under
// way ends after the batch it is in, however much is left to evict, and
// what it evicted and what it kept are both whole.
TEST_F(StoreScaleTest, AStopRequestEndsEvictionAfterItsBatch) {
  absl::StatusOr<std::unique_ptr<ArtifactStore>> store = ArtifactStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  constexpr int kEntries = 6000;
  for (int i = 0; i < kEntries; ++i) {
    ASSERT_TRUE((*store)->Put("local/triton", absl::StrCat("entry", i),
                              {{"kernel.cubin", TestBytes(1024, static_cast<uint32_t>(i)), ""}})
                    .ok());
  }
  std::atomic<bool> evicting{true};
  absl::StatusOr<uint64_t> evicted;
  std::thread eviction([&] {
    evicted = (*store)->EvictToSize(0);
    evicting = false;
  });
  // The first batch done, the stop comes.
  while (evicting.load() && (*store)->Stats()->evicted_entries == 0) std::this_thread::yield();
  (*store)->RequestStop();
  eviction.join();
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  absl::StatusOr<StoreStats> stats = (*store)->Stats();
  EXPECT_GT(stats->entries, 0u) << "the eviction ran to the end despite the stop";
  EXPECT_EQ(stats->entries + *evicted, static_cast<uint64_t>(kEntries));
  // What is left is served whole.
  EXPECT_TRUE((*store)->Lookup("local/triton", absl::StrCat("entry", kEntries - 1)).ok());
}

// The same for a tenant over its cap (max_domain_bytes): its eviction goes a
// batch a transaction and ends at a stop, and the tenant is looked at again
// by the next enforcement rather than forgotten.
TEST_F(StoreScaleTest, AStopRequestEndsATenantsEvictionAfterItsBatch) {
  StoreOptions options = Options();
  options.capped_domain_prefix = "tenant:";
  options.max_domain_bytes = 64 * 1024;
  options.lru_flush_interval = absl::Hours(1);  // no enforcement but the test's
  absl::StatusOr<std::unique_ptr<ArtifactStore>> store = ArtifactStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  constexpr int kEntries = 6000;
  for (int i = 0; i < kEntries; ++i) {
    ASSERT_TRUE((*store)->Put("tenant:alpha/triton", absl::StrCat("entry", i),
                              {{"kernel.cubin", TestBytes(1024, static_cast<uint32_t>(i)), ""}})
                    .ok());
  }
  std::atomic<bool> evicting{true};
  absl::StatusOr<uint64_t> evicted;
  std::thread eviction([&] {
    evicted = (*store)->EnforceDomainCaps();
    evicting = false;
  });
  while (evicting.load() && (*store)->Stats()->evicted_entries == 0) std::this_thread::yield();
  (*store)->RequestStop();
  eviction.join();
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  const uint64_t left = (*store)->Stats()->entries;
  EXPECT_GT(left, 64u) << "the tenant's eviction ran to the end despite the stop";
  EXPECT_EQ(left + *evicted, static_cast<uint64_t>(kEntries));
  EXPECT_TRUE((*store)->Lookup("tenant:alpha/triton", absl::StrCat("entry", kEntries - 1)).ok());
}

TEST_F(StoreScaleTest, DiskBytesIsWhatDuCountsAlsoRightAfterAStart) {
  const fs::path data_dir = Options().data_dir;
  {
    absl::StatusOr<std::unique_ptr<ArtifactStore>> store = ArtifactStore::Open(Options());
    ASSERT_TRUE(store.ok()) << store.status();
    FillServed(**store, 500);
    // Some blobs above the inline threshold: blob files.
    for (uint32_t i = 0; i < 5; ++i) {
      ASSERT_TRUE((*store)->Put("local/triton", absl::StrCat("big", i),
                                {{"kernel.cubin", TestBytes(200 * 1024, 1000 + i), ""}})
                      .ok());
    }
  }
  absl::StatusOr<std::unique_ptr<ArtifactStore>> store = ArtifactStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  const uint64_t counted = (*store)->DiskBytes();
  const uint64_t du = DiskUsage(data_dir);
  // Within 5%, as the cap promises; read before the maintenance thread's
  // first round has measured anything.
  EXPECT_LT(static_cast<double>(counted), 1.05 * static_cast<double>(du)) << counted << " vs du " << du;
  EXPECT_GT(static_cast<double>(counted), 0.95 * static_cast<double>(du)) << counted << " vs du " << du;
}

}  // namespace
}  // namespace kiln::cache
