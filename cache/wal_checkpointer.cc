#include "cache/wal_checkpointer.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>

#include "common/fmt_absl.h"
#include "common/platform.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

// Checkpoints beside the writer before the one that holds it, at most.
constexpr int kUnlockedRounds = 4;
// A WAL this many times the checkpoint's size is checkpointed by the commit
// that finds it so: a bound on the WAL whatever the checkpointer's thread gets.
constexpr int kWalPagesWriterCheckpoints = 8;
// How long the writer is idle before the WAL a checkpoint left is cut.
constexpr std::chrono::seconds kIdleBeforeCut{1};

}  // namespace

absl::StatusOr<std::unique_ptr<WalCheckpointer>> WalCheckpointer::Start(
    const std::filesystem::path& path, absl::Duration busy_timeout, int wal_pages,
    sqlite::Database& writer, std::mutex& writer_mutex) {
  ASSIGN_OR_RETURN(std::unique_ptr<sqlite::Database> db, sqlite::Database::Open(path, busy_timeout));
  std::unique_ptr<WalCheckpointer> checkpointer(
      new WalCheckpointer(std::move(db), wal_pages, writer_mutex));
  writer.OnWalCommit([raw = checkpointer.get(), &writer](int pages) {
    if (pages >= kWalPagesWriterCheckpoints * raw->wal_pages_) {
      // The checkpointer's thread is not keeping up (starved of CPU at its
      // lowered priority): the commit checkpoints, as SQLite's own would.
      if (absl::StatusOr<int> left = writer.CheckpointPassively(); !left.ok()) {
        spdlog::debug("cache: WAL checkpoint: {}", left.status().message());
      }
      return;
    }
    raw->NoteCommit(pages);
  });
  checkpointer->thread_ = std::thread([raw = checkpointer.get()] { raw->Run(); });
  return checkpointer;
}

WalCheckpointer::WalCheckpointer(std::unique_ptr<sqlite::Database> db, int wal_pages,
                                 std::mutex& writer_mutex)
    : db_(std::move(db)), wal_pages_(wal_pages), writer_mutex_(writer_mutex) {}

WalCheckpointer::~WalCheckpointer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wakeup_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void WalCheckpointer::NoteCommit(int wal_pages) {
  {
    std::lock_guard lock(mutex_);
    ++commits_;
    if (wal_pages < wal_pages_) return;
    due_ = true;
  }
  wakeup_.notify_one();
}

void WalCheckpointer::Checkpoint() {
  // A failure (a full disk) leaves the WAL to grow until the next one.
  absl::StatusOr<int> left = db_->CheckpointPassively();
  for (int round = 1; left.ok() && *left >= wal_pages_ && round < kUnlockedRounds; ++round) {
    left = db_->CheckpointPassively();
  }
  if (left.ok() && *left > 0) {
    std::lock_guard writer_lock(writer_mutex_);
    left = db_->CheckpointPassively();
  }
  if (!left.ok()) spdlog::debug("cache: WAL checkpoint: {}", left.status().message());
}

void WalCheckpointer::CutIdleWal() {
  std::lock_guard writer_lock(writer_mutex_);
  // False when readers held it off past the busy timeout: no matter, it is
  // tried again after the next checkpoint.
  if (absl::StatusOr<bool> cut = db_->CheckpointAndTruncate(); !cut.ok()) {
    spdlog::debug("cache: WAL checkpoint: {}", cut.status().message());
  }
}

void WalCheckpointer::Run() {
  // Its copying and syncing yield the CPU to lookups, as eviction's do.
  platform::LowerCurrentThreadPriority();
  std::unique_lock lock(mutex_);
  // Commits counted when last looked at, from the end of a checkpoint until
  // the writer idles and the WAL (copied, but as large as it grew) is cut.
  std::optional<uint64_t> to_cut_after;
  while (true) {
    const auto ready = [this] { return due_ || stopping_; };
    if (!to_cut_after.has_value()) {
      wakeup_.wait(lock, ready);
    } else if (!wakeup_.wait_for(lock, kIdleBeforeCut, ready)) {
      // Commits since start the WAL over (cut to journal_size_limit) but
      // leave what they add; once none came for a while, it is cut here.
      if (commits_ != *to_cut_after) {
        to_cut_after = commits_;
        continue;
      }
      to_cut_after.reset();
      lock.unlock();
      CutIdleWal();
      lock.lock();
      continue;
    }
    if (stopping_) return;
    due_ = false;
    lock.unlock();
    Checkpoint();
    lock.lock();
    to_cut_after = commits_;
  }
}

}  // namespace kiln::cache
