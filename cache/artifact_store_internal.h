#ifndef KILN_CACHE_ARTIFACT_STORE_INTERNAL_H_
#define KILN_CACHE_ARTIFACT_STORE_INTERNAL_H_

// The artifact store's private parts that its files share: the writer's
// connection with its prepared statements and the parts that write through
// it, the served files a lookup wrote, and a blob found corrupt. Included
// only by the store's own files, which divide ArtifactStore's members by job:
//   artifact_store.cc          open and close, lookups and hits, puts, a
//                              corrupt blob's entries dropped, stats
//   store_served_files.cc      blobs served as files, recorded
//   store_imports.cc           imports: kept, replaced or refused; taken back
//   store_maintenance.cc       the maintenance thread, sweeps, verify
// ArtifactStore holds the parts with state of their own: StoreAccounting,
// LruPolicy, BlobStorage, IndexReaders, GroupCommit, EntryRows, BlobRows,
// ImportJournal, LeftoverFiles, EvictionCandidates, ServedFileRecords,
// EntryRemoval, Evictor, MaintenanceSchedule (their headers say what each
// owns; ARCHITECTURE.md has the table of which owns which table).

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cache/artifact_store.h"
#include "cache/blob_rows.h"
#include "cache/blob_storage.h"
#include "cache/entry_removal.h"
#include "cache/entry_rows.h"
#include "cache/eviction_candidates.h"
#include "cache/import_journal.h"
#include "cache/leftover_files.h"
#include "cache/served_file_records.h"
#include "cache/served_files.h"
#include "cache/sqlite.h"
#include "cache/store_schema.h"

namespace kiln::cache {
namespace store_internal {

// Where the unrecorded served files of a version 1 store go to be deleted.
inline constexpr char kRetiredDir[] = "retired";

}  // namespace store_internal

// Served files a lookup wrote, to record in one transaction once it has read.
struct ArtifactStore::ServedWrites {
  std::vector<std::tuple<std::string, std::string, uint64_t>> copies;  // digest, extension, bytes
  // The placeholder keys of the blobs served: their rows are keyed by content
  // first, so that a served copy belongs to the one row of its content.
  std::vector<std::string> to_key_by_content;
  std::optional<ServedFiles::IndexFootprint> index;
  std::string index_namespace;  // the client's, which `index` is keyed by
};

// A blob that failed its integrity check: its row's key, its digest, why.
struct ArtifactStore::BrokenBlob {
  std::string store_key;
  std::string digest;
  std::string reason;
};

// The writer: the one connection that writes the index, which is the handle
// each part is given, and the parts whose statements run on it, inside the
// transactions the store begins (a put's on a savepoint of its own within its
// group's). The parts come after `db`, so their statements are finalized
// before it closes.
struct ArtifactStore::Writer {
  Writer(const StoreOptions& options, StoreAccounting& accounting, const BlobStorage& blobs,
         ServedFiles& served_files)
      : leftover_files(options.data_dir, options.served_copy_grace, accounting),
        removal({.entry_rows = entry_rows,
                 .blob_rows = blob_rows,
                 .served_file_records = served_file_records,
                 .eviction_candidates = eviction_candidates,
                 .leftover_files = leftover_files,
                 .blobs = blobs,
                 .served_files = served_files,
                 .accounting = accounting}) {}
  std::unique_ptr<sqlite::Database> db;
  sqlite::Statement index_pages;  // the database's bytes as last committed
  // A put's savepoint within its group's transaction (CommitGroupLocked).
  sqlite::Statement begin_put;
  sqlite::Statement undo_put;
  sqlite::Statement end_put;
  EntryRows entry_rows;
  BlobRows blob_rows;
  ImportJournal imports;
  LeftoverFiles leftover_files;
  EvictionCandidates eviction_candidates;
  ServedFileRecords served_file_records;
  // Takes entries and blobs out through the parts above (declared before it).
  EntryRemoval removal;
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_ARTIFACT_STORE_INTERNAL_H_
