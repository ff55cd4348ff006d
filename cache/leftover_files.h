#ifndef KILN_CACHE_LEFTOVER_FILES_H_
#define KILN_CACHE_LEFTOVER_FILES_H_

// Files the store let go of that are not removed yet, counted as leftovers
// (StoreAccounting) until they are:
// - files whose removal failed because another process held them open (on
//   Windows): recorded in the leftover_files table, so that a restart still
//   knows them, and tried again until they go;
// - the served copies of blobs that went, kept for a grace period so that a
//   local client that found them in the served index a moment before can
//   still read them.
// Its statements are prepared on the store's writer connection and run in
// the writer's transactions; the caller holds the writer.
//
// Internal to the artifact store.

#include <cstdint>
#include <deque>
#include <filesystem>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cache/served_files.h"
#include "cache/sqlite.h"
#include "cache/store_accounting.h"

namespace kiln::cache {

class LeftoverFiles {
 public:
  // Whether a file the store let go of is recorded again since, stored or
  // served again under its content-addressed name: it is then in use (and
  // counted where it is recorded now), not to be removed.
  using RecordedAgain = absl::FunctionRef<bool(const std::filesystem::path&)>;

  // Leftover paths are recorded relative to `data_dir`.
  LeftoverFiles(std::filesystem::path data_dir, absl::Duration served_copy_grace,
                StoreAccounting& accounting)
      : data_dir_(std::move(data_dir)), served_copy_grace_(served_copy_grace), accounting_(accounting) {}

  // Prepares the statements on `writer`, which must outlive them.
  absl::Status Prepare(sqlite::Database& writer);

  // Removes `file`; one that stays (held open) is recorded and counted.
  void Remove(const std::filesystem::path& file);
  // A file whose removal failed: recorded, counted, and tried again by
  // RetryRecorded.
  void Record(const ServedFiles::Leftover& leftover);
  // Tries the recorded files again (a thousand at most a call): those that
  // went, or are in use again, are forgotten and no longer counted.
  void RetryRecorded(RecordedAgain recorded_again);

  // A served copy of a blob that went at `since`: counted, and removed by
  // RemoveCopiesPastGrace once its grace has passed.
  void KeepForGrace(ServedFiles::Leftover copy, absl::Time since);
  // Removes the copies whose grace has passed by `now` (`all`: every one, at
  // a stop), except those recorded again.
  void RemoveCopiesPastGrace(absl::Time now, RecordedAgain recorded_again, bool all = false);
  // When the grace of the last copy kept ends; nullopt when none is kept.
  std::optional<absl::Time> LastGraceEnds() const;

 private:
  const std::filesystem::path data_dir_;
  const absl::Duration served_copy_grace_;
  StoreAccounting& accounting_;
  sqlite::Statement record_;
  sqlite::Statement recorded_;
  sqlite::Statement forget_;
  struct CopyInGrace {
    absl::Time since;
    ServedFiles::Leftover copy;
  };
  std::deque<CopyInGrace> copies_in_grace_;  // oldest first
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_LEFTOVER_FILES_H_
