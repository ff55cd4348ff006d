#include "cache/wal_checkpointer.h"

#include <chrono>
#include <cstdint>
#include <utility>

#include "common/fmt_absl.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

// Checkpoints beside the writer before the one that holds it, at most.
constexpr int kUnlockedRounds = 4;
// A WAL this many times the checkpoint's size is checkpointed by the commit
// that finds it so: a bound on the WAL whatever the checkpointer's thread gets.
constexpr int kWalPagesWriterCheckpoints = 8;
// How long the writer is idle before the WAL is cut to nothing.
constexpr std::chrono::seconds kIdleBeforeCut{1};

thread_local bool commits_checkpoint_themselves = false;

}  // namespace

absl::StatusOr<std::unique_ptr<WalCheckpointer>> WalCheckpointer::Start(
    const std::filesystem::path& path, absl::Duration busy_timeout, int wal_pages,
    sqlite::Database& writer, std::mutex& writer_mutex) {
  ASSIGN_OR_RETURN(std::unique_ptr<sqlite::Database> db, sqlite::Database::Open(path, busy_timeout));
  std::unique_ptr<WalCheckpointer> checkpointer(
      new WalCheckpointer(std::move(db), wal_pages, writer_mutex));
  writer.OnWalCommit([raw = checkpointer.get(), &writer](int pages) {
    if (commits_checkpoint_themselves && pages >= raw->wal_pages_) {
      if (absl::StatusOr<int> left = writer.CheckpointPassively(); !left.ok()) {
        spdlog::debug("cache: WAL checkpoint: {}", left.status().message());
      }
      raw->NoteCommit(0);  // a commit all the same: the WAL is cut once they stop
      return;
    }
    if (pages >= kWalPagesWriterCheckpoints * raw->wal_pages_) {
      // The checkpointer's thread is not keeping up (starved of CPU): the
      // commit checkpoints, as SQLite's own would.
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

WalCheckpointer::CommitsCheckpointThemselves::CommitsCheckpointThemselves() {
  commits_checkpoint_themselves = true;
}

WalCheckpointer::CommitsCheckpointThemselves::~CommitsCheckpointThemselves() {
  commits_checkpoint_themselves = false;
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

bool WalCheckpointer::CutIdleWal() {
  std::lock_guard writer_lock(writer_mutex_);
  // False when readers held it off past the busy timeout: tried again later.
  absl::StatusOr<bool> cut = db_->CheckpointAndTruncate();
  if (!cut.ok()) spdlog::debug("cache: WAL checkpoint: {}", cut.status().message());
  return cut.ok() && *cut;
}

void WalCheckpointer::Run() {
  std::unique_lock lock(mutex_);
  uint64_t commits_at_cut = commits_;  // the WAL was cut (or empty) after this many
  while (true) {
    const auto ready = [this] { return due_ || stopping_; };
    if (commits_ == commits_at_cut) {
      wakeup_.wait_for(lock, kIdleBeforeCut, ready);
    } else {
      // Commits since the last cut: once none comes for a while, the WAL they
      // left (however little: it counts against the cap) is cut to nothing.
      const uint64_t commits_before = commits_;
      if (!wakeup_.wait_for(lock, kIdleBeforeCut, ready) && commits_ == commits_before) {
        lock.unlock();
        const bool cut = CutIdleWal();
        lock.lock();
        if (cut) commits_at_cut = commits_before;
        continue;
      }
    }
    if (stopping_) return;
    if (!due_) continue;
    due_ = false;
    lock.unlock();
    Checkpoint();
    lock.lock();
  }
}

}  // namespace kiln::cache
