#ifndef KILN_CACHE_WAL_CHECKPOINTER_H_
#define KILN_CACHE_WAL_CHECKPOINTER_H_

// Checkpoints the index's WAL on a thread and a connection of its own, so that
// no commit waits for most of one. With SQLite's autocheckpoint, the commit
// that takes the WAL past its limit copies the WAL into the database file and
// syncs it while it holds the store's writer: at a million entries that was a
// pause of every put and eviction batch behind it, about once a batch. Here
// checkpoints run beside writers and readers (PASSIVE) until what the writer
// added meanwhile is under the limit (or a few rounds did not get it there),
// and then, holding the writer, the last one copies the rest: a writer that
// never pauses would otherwise keep every checkpoint from finishing, and the
// WAL would grow without bound. Once the writer has been idle for a second
// after any commit, the checkpointer cuts the WAL to nothing: what it holds
// counts against the cap, and small caps have little room for it. A commit
// that finds the WAL at eight times the checkpoint's size (the thread starved
// of CPU) checkpoints it itself, as SQLite would. (At a lowered priority, the
// thread was starved under load, and held the checkpoint lock that this
// commit's checkpoint needs: the WAL grew to hundreds of MB.)

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/sqlite.h"

namespace kiln::cache {

class WalCheckpointer {
 public:
  // Checkpoints the database at `path` (in WAL mode) whenever a commit leaves
  // its WAL at `wal_pages` pages or more; `writer` (the one connection that
  // writes it, whose writes hold `writer_mutex`) reports its commits here from
  // now on.
  static absl::StatusOr<std::unique_ptr<WalCheckpointer>> Start(const std::filesystem::path& path,
                                                                absl::Duration busy_timeout,
                                                                int wal_pages,
                                                                sqlite::Database& writer,
                                                                std::mutex& writer_mutex);
  // Ends the thread after the checkpoint in progress, if any.
  ~WalCheckpointer();

  // While one lives, the commits of the thread that made it checkpoint the
  // WAL they grew themselves, at that thread's priority, as SQLite's own
  // autocheckpoint does; the checkpointer's thread is not woken for them.
  // For a background writer (eviction, at a lowered priority): the
  // checkpointer's thread, at normal priority, would take a core from
  // lookups for work nothing waits for.
  class CommitsCheckpointThemselves {
   public:
    CommitsCheckpointThemselves();
    ~CommitsCheckpointThemselves();
    CommitsCheckpointThemselves(const CommitsCheckpointThemselves&) = delete;
    CommitsCheckpointThemselves& operator=(const CommitsCheckpointThemselves&) = delete;
  };
  WalCheckpointer(const WalCheckpointer&) = delete;
  WalCheckpointer& operator=(const WalCheckpointer&) = delete;

 private:
  WalCheckpointer(std::unique_ptr<sqlite::Database> db, int wal_pages, std::mutex& writer_mutex);
  void NoteCommit(int wal_pages);
  void Run();
  void Checkpoint();
  // Cuts the WAL to nothing, holding the writer; false when readers kept it from it.
  bool CutIdleWal();

  const std::unique_ptr<sqlite::Database> db_;
  const int wal_pages_;
  std::mutex& writer_mutex_;
  std::mutex mutex_;
  std::condition_variable wakeup_;
  bool due_ = false;       // guarded by mutex_
  uint64_t commits_ = 0;   // guarded by mutex_
  bool stopping_ = false;  // guarded by mutex_
  std::thread thread_;
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_WAL_CHECKPOINTER_H_
