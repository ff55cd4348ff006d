// Tests of the store's accounting alone (cache/store_accounting.h): its
// counters, the totals a clean stop saves and the next open reads, the space
// reserve and disk-full episodes, on a real index (the store's own schema)
// in a fresh directory.

#include "cache/store_accounting.h"

#include <fstream>

#include "absl/status/status.h"
#include "cache/disk_usage.h"
#include "gtest/gtest.h"
#include "tests/fresh_index.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;

class StoreAccountingTest : public ::kiln::testing::FreshIndexTest {};

TEST_F(StoreAccountingTest, CountsWhatCommitsAddAndTakeAwayAndNeverGoesBelowZero) {
  StoreAccounting accounting(data_dir());
  accounting.Add({.stored_bytes = 1000, .file_blob_bytes = 8192, .blobs = 3, .entries = 2});
  accounting.Remove({.stored_bytes = 400, .blobs = 1, .entries = 1});
  EXPECT_EQ(accounting.stored_bytes(), 600u);
  EXPECT_EQ(accounting.file_blob_bytes(), 8192u);
  EXPECT_EQ(accounting.blobs(), 2u);
  EXPECT_EQ(accounting.entries(), 1u);
  // A count that was off stays at zero rather than wrapping to 2^64.
  accounting.Remove({.stored_bytes = 5000, .file_blob_bytes = 9000, .blobs = 9, .entries = 9});
  EXPECT_EQ(accounting.stored_bytes(), 0u);
  EXPECT_EQ(accounting.file_blob_bytes(), 0u);
  EXPECT_EQ(accounting.blobs(), 0u);
  EXPECT_EQ(accounting.entries(), 0u);
  accounting.AddLeftover(4096);
  accounting.RemoveLeftover(8192);
  EXPECT_EQ(accounting.leftover_bytes(), 0u);
}

TEST_F(StoreAccountingTest, TheTotalsOfACleanStopAreWhatTheNextOpenReadsOnce) {
  StoreAccounting accounting(data_dir());
  accounting.Add({.stored_bytes = 7, .file_blob_bytes = 4096, .blobs = 5, .entries = 4});
  accounting.AddLeftover(4096);
  ASSERT_TRUE(accounting.SaveTotals(*db_, /*served_bytes=*/12288, /*use_clock=*/42).ok());

  absl::StatusOr<StoreAccounting::Totals> read =
      StoreAccounting::ReadTotals(*db_, /*stopped_cleanly=*/true);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->stored_bytes, 7u);
  EXPECT_EQ(read->file_blob_bytes, 4096u);
  EXPECT_EQ(read->blobs, 5u);
  EXPECT_EQ(read->entries, 4u);
  EXPECT_EQ(read->served_bytes, 12288u);
  EXPECT_EQ(read->use_clock, 42u);
  EXPECT_EQ(read->leftover_bytes, 4096u);

  // Read once: the next open (a kill after this one) counts the records,
  // which are empty here.
  absl::StatusOr<StoreAccounting::Totals> again = StoreAccounting::ReadTotals(*db_, true);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->entries, 0u);
  EXPECT_EQ(again->use_clock, 0u);
}

TEST_F(StoreAccountingTest, WithoutACleanStopTheTotalsAreCountedFromTheRecords) {
  Exec("INSERT INTO blobs (id, digest, size, stored_size, codec, location, data) VALUES "
       "(1, x'01', 10, 10, 0, 0, x'00'), (2, x'02', 5000, 5000, 0, 1, NULL)");
  Exec("INSERT INTO entries (id, namespace, key, created_ms, last_use, index_disk_bytes) VALUES "
       "(1, 'local/triton', 'a', 0, 17, 4096), (2, 'local/triton', 'b', 0, 9, 0)");
  Exec("INSERT INTO served_copies (blob_id, extension, disk_bytes) VALUES (2, '.cubin', 8192)");
  Exec("INSERT INTO leftover_files (path, disk_bytes) VALUES ('blobs/aa/x', 4096)");
  StoreAccounting accounting(data_dir());
  // Saved totals that no clean-stop mark vouches for are dropped, not read.
  ASSERT_TRUE(accounting.SaveTotals(*db_, 1, 1).ok());

  absl::StatusOr<StoreAccounting::Totals> read =
      StoreAccounting::ReadTotals(*db_, /*stopped_cleanly=*/false);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->blobs, 2u);
  EXPECT_EQ(read->stored_bytes, 5010u);
  EXPECT_EQ(read->file_blob_bytes, OnDisk(5000));
  EXPECT_EQ(read->entries, 2u);
  EXPECT_EQ(read->served_bytes, 4096u + 8192u);
  EXPECT_EQ(read->use_clock, 17u);
  EXPECT_EQ(read->leftover_bytes, 4096u);
}

TEST_F(StoreAccountingTest, DiskBytesAreTheCountedFilesAndTheIndexAndWhatNoRecordHolds) {
  StoreAccounting accounting(data_dir());
  const uint64_t index_only = accounting.DiskBytes(0);
  EXPECT_GT(index_only, 0u) << "the index's file counts";
  accounting.Add({.file_blob_bytes = 8192});
  accounting.AddLeftover(4096);
  EXPECT_EQ(accounting.DiskBytes(/*served_bytes=*/12288), index_only + 8192 + 4096 + 12288);

  // What no record counts is measured: a log here.
  fs::create_directories(data_dir() / "logs");
  std::ofstream(data_dir() / "logs" / "kilnd.log") << std::string(10000, 'x');
  accounting.MeasureUnrecorded(data_dir() / "files" / "hits", data_dir() / "retired");
  EXPECT_GE(accounting.DiskBytes(12288), index_only + 8192 + 4096 + 12288 + OnDisk(10000));
}

TEST_F(StoreAccountingTest, TheReserveIsASixtyFourthOfTheCapAtMostTwoMebibytes) {
  StoreAccounting accounting(data_dir());
  const fs::path reserve = data_dir() / StoreAccounting::kReserveFile;
  accounting.EnsureSpaceReserve(64 << 20);
  EXPECT_EQ(FileSize(reserve), 1u << 20);
  accounting.EnsureSpaceReserve(10ull << 30);
  EXPECT_EQ(FileSize(reserve), 2u << 20);
  EXPECT_TRUE(accounting.GiveUpSpaceReserve());
  EXPECT_FALSE(fs::exists(reserve));
  EXPECT_FALSE(accounting.GiveUpSpaceReserve()) << "none left to give up";
}

TEST_F(StoreAccountingTest, ADiskFullEpisodeCountsEachRefusalAndEndsAtTheNextStore) {
  StoreAccounting accounting(data_dir());
  EXPECT_FALSE(accounting.NoteStored()) << "no episode to end";
  accounting.NoteDiskFull(absl::ResourceExhaustedError("no space"));
  const std::optional<absl::Time> since = accounting.disk_full_since();
  ASSERT_TRUE(since.has_value());
  accounting.NoteDiskFull(absl::ResourceExhaustedError("no space"));
  EXPECT_EQ(accounting.disk_full_since(), since) << "one episode";
  EXPECT_EQ(accounting.puts_refused_disk_full(), 2u);
  EXPECT_TRUE(accounting.NoteStored());
  EXPECT_FALSE(accounting.disk_full_since().has_value());
  EXPECT_FALSE(accounting.NoteStored());
  EXPECT_EQ(accounting.puts_refused_disk_full(), 2u) << "counted since the store opened";
}

}  // namespace
}  // namespace kiln::cache
