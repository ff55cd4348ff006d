// Tests of the store's leftover files alone (cache/leftover_files.h): files
// whose removal failed, recorded and tried again, and served copies kept for
// their grace, on a real index (the store's own schema) in a fresh directory.
//
// A file held open by another process cannot be removed on Windows only; a
// directory with a file in it, which no remove() takes either, stands in for
// one here. The part sees only that the path is still there.

#include "cache/leftover_files.h"

#include <fstream>

#include "gtest/gtest.h"
#include "tests/fresh_index.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;

constexpr absl::Duration kGrace = absl::Seconds(2);

class LeftoverFilesTest : public ::kiln::testing::FreshIndexTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(FreshIndexTest::SetUp());
    ASSERT_TRUE(leftovers_.Prepare(*db_).ok());
  }
  fs::path WriteFile(const std::string& relative) {
    const fs::path path = data_dir() / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << "content";
    return path;
  }
  // A path no remove() takes until Release: a stand-in for a file held open.
  fs::path HeldFile(const std::string& relative) {
    WriteFile(relative + "/holder");
    return data_dir() / relative;
  }
  static void Release(const fs::path& held) { fs::remove(held / "holder"); }
  int64_t RecordedRows() { return QueryInt("SELECT count(*) FROM leftover_files"); }
  static bool NeverRecordedAgain(const fs::path&) { return false; }

  StoreAccounting accounting_{data_dir()};
  LeftoverFiles leftovers_{data_dir(), kGrace, accounting_};
};

TEST_F(LeftoverFilesTest, AFileThatCanBeRemovedGoesAtOnceAndIsNeitherRecordedNorCounted) {
  const fs::path file = WriteFile("blobs/ab/ab01");
  leftovers_.Remove(file);
  EXPECT_FALSE(fs::exists(file));
  EXPECT_EQ(RecordedRows(), 0);
  EXPECT_EQ(accounting_.leftover_bytes(), 0u);
}

TEST_F(LeftoverFilesTest, AHeldFileIsRecordedAndCountedAndTriedAgainUntilItGoes) {
  const fs::path held = HeldFile("blobs/cd/cd02");
  leftovers_.Record({held, 4096});
  EXPECT_EQ(RecordedRows(), 1);
  EXPECT_EQ(accounting_.leftover_bytes(), 4096u);

  leftovers_.RetryRecorded(NeverRecordedAgain);
  EXPECT_TRUE(fs::exists(held)) << "still held";
  EXPECT_EQ(RecordedRows(), 1);
  EXPECT_EQ(accounting_.leftover_bytes(), 4096u);

  Release(held);
  leftovers_.RetryRecorded(NeverRecordedAgain);
  EXPECT_FALSE(fs::exists(held));
  EXPECT_EQ(RecordedRows(), 0);
  EXPECT_EQ(accounting_.leftover_bytes(), 0u);
}

TEST_F(LeftoverFilesTest, ALeftoverRecordedAgainIsForgottenAndKept) {
  const fs::path file = WriteFile("files/e/e03.json");
  leftovers_.Record({file, 100});
  leftovers_.RetryRecorded([&](const fs::path& path) { return path == file; });
  EXPECT_TRUE(fs::exists(file)) << "in use again: not removed";
  EXPECT_EQ(RecordedRows(), 0);
  EXPECT_EQ(accounting_.leftover_bytes(), 0u) << "counted where it is recorded now";
}

TEST_F(LeftoverFilesTest, ARecordedLeftoverIsTriedAgainAfterARestart) {
  const fs::path held = HeldFile("blobs/ef/ef04");
  leftovers_.Record({held, 8192});
  Release(held);

  // The next run's part, on the same index: it knows the file from its row.
  LeftoverFiles next_run(data_dir(), kGrace, accounting_);
  ASSERT_TRUE(next_run.Prepare(*db_).ok());
  next_run.RetryRecorded(NeverRecordedAgain);
  EXPECT_FALSE(fs::exists(held));
  EXPECT_EQ(RecordedRows(), 0);
}

TEST_F(LeftoverFilesTest, AServedCopyStaysThroughItsGraceThenGoes) {
  const fs::path copy = WriteFile("files/a/a05.cubin");
  const absl::Time gone_at = absl::FromUnixSeconds(1000);
  leftovers_.KeepForGrace({copy, 4096}, gone_at);
  EXPECT_EQ(accounting_.leftover_bytes(), 4096u);
  EXPECT_EQ(leftovers_.LastGraceEnds(), gone_at + kGrace);

  leftovers_.RemoveCopiesPastGrace(gone_at + kGrace - absl::Milliseconds(1), NeverRecordedAgain);
  EXPECT_TRUE(fs::exists(copy)) << "a client that just found it may still read it";
  EXPECT_EQ(accounting_.leftover_bytes(), 4096u);

  leftovers_.RemoveCopiesPastGrace(gone_at + kGrace, NeverRecordedAgain);
  EXPECT_FALSE(fs::exists(copy));
  EXPECT_EQ(accounting_.leftover_bytes(), 0u);
  EXPECT_FALSE(leftovers_.LastGraceEnds().has_value());
}

TEST_F(LeftoverFilesTest, CopiesGoOldestFirstAndAtAStopAllGoWhateverTheirGrace) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const fs::path older = WriteFile("files/b/b06.cubin");
  const fs::path newer = WriteFile("files/c/c07.cubin");
  leftovers_.KeepForGrace({older, 10}, t0);
  leftovers_.KeepForGrace({newer, 20}, t0 + absl::Seconds(1));

  leftovers_.RemoveCopiesPastGrace(t0 + kGrace, NeverRecordedAgain);
  EXPECT_FALSE(fs::exists(older));
  EXPECT_TRUE(fs::exists(newer));
  EXPECT_EQ(accounting_.leftover_bytes(), 20u);

  leftovers_.RemoveCopiesPastGrace(t0 + absl::Seconds(1), NeverRecordedAgain, /*all=*/true);
  EXPECT_FALSE(fs::exists(newer));
  EXPECT_EQ(accounting_.leftover_bytes(), 0u);
}

TEST_F(LeftoverFilesTest, ACopyServedAgainDuringItsGraceIsKept) {
  const fs::path copy = WriteFile("files/d/d08.cubin");
  leftovers_.KeepForGrace({copy, 4096}, absl::FromUnixSeconds(1000));
  leftovers_.RemoveCopiesPastGrace(absl::FromUnixSeconds(1010),
                                   [&](const fs::path& path) { return path == copy; });
  EXPECT_TRUE(fs::exists(copy));
  EXPECT_EQ(accounting_.leftover_bytes(), 0u);
  EXPECT_EQ(RecordedRows(), 0);
}

TEST_F(LeftoverFilesTest, ACopyHeldOpenPastItsGraceBecomesARecordedLeftover) {
  const fs::path held = HeldFile("files/f/f09.cubin");
  leftovers_.KeepForGrace({held, 4096}, absl::FromUnixSeconds(1000));
  leftovers_.RemoveCopiesPastGrace(absl::FromUnixSeconds(1010), NeverRecordedAgain);
  EXPECT_TRUE(fs::exists(held));
  EXPECT_EQ(RecordedRows(), 1);
  EXPECT_EQ(accounting_.leftover_bytes(), 4096u) << "counted once, not twice";

  Release(held);
  leftovers_.RetryRecorded(NeverRecordedAgain);
  EXPECT_FALSE(fs::exists(held));
  EXPECT_EQ(accounting_.leftover_bytes(), 0u);
}

}  // namespace
}  // namespace kiln::cache
