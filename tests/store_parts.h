#ifndef KILN_TESTS_STORE_PARTS_H_
#define KILN_TESTS_STORE_PARTS_H_

// The store's parts that take entries out (cache/entry_removal.h) with those
// it deletes and releases through, as the store's writer holds them, over a
// fresh index (fresh_index.h): what the tests of EntryRemoval and of the
// Evictor work on without the store. The tests write the index's rows
// themselves.

#include <filesystem>

#include "absl/status/status.h"
#include "cache/blob_rows.h"
#include "cache/blob_storage.h"
#include "cache/entry_removal.h"
#include "cache/entry_rows.h"
#include "cache/eviction_candidates.h"
#include "cache/leftover_files.h"
#include "cache/served_file_records.h"
#include "cache/served_files.h"
#include "cache/sqlite.h"
#include "cache/store_accounting.h"
#include "common/status_macros.h"

namespace kiln::testing {

struct StoreParts {
  explicit StoreParts(const std::filesystem::path& data_dir)
      : accounting(data_dir),
        blobs({.data_dir = data_dir}),
        served_files(data_dir / "files", absl::Seconds(2)),
        leftover_files(data_dir, absl::Seconds(2), accounting),
        removal({.entry_rows = entry_rows,
                 .blob_rows = blob_rows,
                 .served_file_records = served_file_records,
                 .eviction_candidates = candidates,
                 .leftover_files = leftover_files,
                 .blobs = blobs,
                 .served_files = served_files,
                 .accounting = accounting}) {}

  // Prepares each part's statements on `db`, which must outlive them.
  absl::Status Prepare(sqlite::Database& db) {
    RETURN_IF_ERROR(blobs.Initialize());
    RETURN_IF_ERROR(entry_rows.Prepare(db));
    RETURN_IF_ERROR(blob_rows.Prepare(db));
    RETURN_IF_ERROR(served_file_records.Prepare(db));
    RETURN_IF_ERROR(candidates.Prepare(db));
    return leftover_files.Prepare(db);
  }

  cache::StoreAccounting accounting;
  cache::BlobStorage blobs;
  cache::ServedFiles served_files;
  cache::EntryRows entry_rows;
  cache::BlobRows blob_rows;
  cache::ServedFileRecords served_file_records;
  cache::EvictionCandidates candidates;
  cache::LeftoverFiles leftover_files;
  cache::EntryRemoval removal;
};

}  // namespace kiln::testing

#endif  // KILN_TESTS_STORE_PARTS_H_
