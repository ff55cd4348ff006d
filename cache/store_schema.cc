// The index's schema as SQL, its migrations from versions 1 to 3, and its open.

#include "cache/store_schema.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/fmt_absl.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache::store_internal {
namespace {

constexpr int64_t kSchemaVersion = 4;

// Version 4. Blobs are shared between entries; a blob row is deleted when no
// entry references it any more. A blob row is found by its content's digest
// (deduplicated) unless it is a small one no local client has asked for as a
// file: its `digest` is then a placeholder (PlaceholderKey, blob_rows.h,
// after its id, so new rows append to the index and old ones leave from its
// front) and `content_digest` is the content's. Keyed by content, each of the
// many small blobs a farm's cache takes and evicts would write a random page
// of the digest index (a quarter of eviction's writes at 300k entries);
// those a local client reads as files are keyed by content when served
// (store_served_files.cc), as file blobs always are. Sizes are in bytes; times in unix milliseconds.
// LRU order uses a logical clock rather than wall time, so a clock step or two
// uses within one millisecond cannot reorder it. The served files
// (served_files.h) are recorded: which copies a blob has and what an entry's
// index file and link take, so that eviction removes them without reading a
// directory and the disk they take is known from the first second.
constexpr absl::string_view kSchema = R"sql(
CREATE TABLE blobs (
  id          INTEGER PRIMARY KEY,
  digest      BLOB NOT NULL UNIQUE,   -- SHA-256 of the uncompressed content, or a placeholder
  size        INTEGER NOT NULL,       -- uncompressed
  stored_size INTEGER NOT NULL,       -- as stored, counted against the cap
  codec       INTEGER NOT NULL,       -- 0 raw, 1 zstd
  location    INTEGER NOT NULL,       -- 0 inline in `data`, 1 file blobs/<hh>/<hex>
  data        BLOB,
  content_digest BLOB                 -- SHA-256 of the content where `digest` is a placeholder
);
CREATE TABLE entries (
  id           INTEGER PRIMARY KEY,
  namespace    TEXT NOT NULL,
  key          TEXT NOT NULL,
  created_ms   INTEGER NOT NULL,
  last_use     INTEGER NOT NULL,       -- logical clock: higher = used more recently
  index_namespace  TEXT,                        -- of its served index entry, when it has one
  index_disk_bytes INTEGER NOT NULL DEFAULT 0,  -- its served index file and link
  link_extension   TEXT,                        -- its link's, when it has one
  UNIQUE (namespace, key)
);
CREATE INDEX entries_by_last_use ON entries (last_use);
CREATE TABLE entry_blobs (
  entry_id INTEGER NOT NULL REFERENCES entries (id) ON DELETE CASCADE,
  name     TEXT NOT NULL,
  blob_id  INTEGER NOT NULL REFERENCES blobs (id),
  PRIMARY KEY (entry_id, name)
) WITHOUT ROWID;
CREATE INDEX entry_blobs_by_blob ON entry_blobs (blob_id);
)sql";
// New in version 2, made by a new store and by the migration alike, and at
// every open where missing (as in a store of this version made before
// leftover_files was). A leftover file is a blob file or served copy whose
// removal failed (another process held it open, on Windows): retried until it
// goes. clean_stop_totals holds, between a clean stop and the next open only,
// the store's totals as the stop left them: an open after a clean stop reads
// one row instead of the whole database (seconds at a million entries).
constexpr absl::string_view kVersion2Tables = R"sql(
CREATE TABLE IF NOT EXISTS served_copies (
  blob_id    INTEGER NOT NULL REFERENCES blobs (id) ON DELETE CASCADE,
  extension  TEXT NOT NULL,
  disk_bytes INTEGER NOT NULL,
  PRIMARY KEY (blob_id, extension)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leftover_files (
  path       TEXT PRIMARY KEY,   -- relative to the data directory
  disk_bytes INTEGER NOT NULL
) WITHOUT ROWID;
-- The entries an import stored, until it finishes: an import that fails or
-- is cut short by a stop (then at the next open) takes them back, so that a
-- bundle's entries are stored all or none (store_imports.cc).
CREATE TABLE IF NOT EXISTS imported_entries (
  import_id INTEGER NOT NULL,
  namespace TEXT NOT NULL,
  key       TEXT NOT NULL,
  PRIMARY KEY (import_id, namespace, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS clean_stop_totals (
  id              INTEGER PRIMARY KEY CHECK (id = 1),
  blobs           INTEGER NOT NULL,
  stored_bytes    INTEGER NOT NULL,
  file_blob_bytes INTEGER NOT NULL,
  entries         INTEGER NOT NULL,
  served_bytes    INTEGER NOT NULL,
  use_clock       INTEGER NOT NULL,
  leftover_bytes  INTEGER NOT NULL
);
)sql";

// From version 1, whose served files were not recorded: they are retired
// (moved aside and deleted in the background) and served again on demand.
constexpr absl::string_view kMigrationFrom1 = R"sql(
ALTER TABLE entries ADD COLUMN index_namespace TEXT;
ALTER TABLE entries ADD COLUMN index_disk_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE entries ADD COLUMN link_extension TEXT;
)sql";
// From version 3, whose blobs were all keyed by content.
constexpr absl::string_view kMigrationFrom3 = R"sql(
ALTER TABLE blobs ADD COLUMN content_digest BLOB;
)sql";
// From version 2, whose served files fanned out 256 ways (served_files.cc):
// they are retired like version 1's, and their records with them. The totals
// a clean stop saved count them: the open after this counts the store again.
constexpr absl::string_view kMigrationFrom2 = R"sql(
DELETE FROM served_copies;
UPDATE entries SET index_namespace = NULL, index_disk_bytes = 0, link_extension = NULL
  WHERE index_namespace IS NOT NULL OR index_disk_bytes != 0 OR link_extension IS NOT NULL;
DELETE FROM clean_stop_totals;
)sql";

// The WAL is cut back to this after a checkpoint (SQLite leaves it at its
// largest otherwise): it holds little of the disk the cap bounds.
constexpr int kWalSizeLimit = 1 << 20;
// The writer's page cache (SQLite's default is 2 MiB): the index pages that
// puts and eviction walk (digests, keys, the LRU order) stay in it instead of
// being read again, a system call each, at every visit.
constexpr int kWriterCacheKiB = 64 << 10;

}  // namespace

int WalCheckpointPages(uint64_t max_size_bytes) {
  constexpr uint64_t kPageBytes = 4096;  // SQLite's default page size, the index's
  return static_cast<int>(std::clamp<uint64_t>(max_size_bytes / 32 / kPageBytes,
                                               kMinWalCheckpointPages, kMaxWalCheckpointPages));
}

absl::StatusOr<OpenedIndex> OpenIndex(const std::filesystem::path& path,
                                      absl::Duration busy_timeout,
                                      absl::FunctionRef<void()> retire_served_files) {
  OpenedIndex index;
  ASSIGN_OR_RETURN(index.db, sqlite::Database::Open(path, busy_timeout));
  sqlite::Database& db = *index.db;
  ASSIGN_OR_RETURN(sqlite::Statement version, db.Prepare("PRAGMA user_version"));
  ASSIGN_OR_RETURN(bool has_row, version.Step());
  const int64_t found_version = has_row ? version.ColumnInt(0) : 0;
  version.Reset();
  if (found_version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cache database %s has schema version %d, newer than this kilnd understands (%d); "
        "upgrade kilnd or use another --data-dir",
        path.string(), found_version, kSchemaVersion));
  }
  // Pages that eviction frees go back to the file system (incremental_vacuum
  // after each batch) instead of staying in the file. It takes a VACUUM once
  // the file exists (WAL mode made it): at once for a new database, and once
  // for one made before.
  ASSIGN_OR_RETURN(sqlite::Statement auto_vacuum, db.Prepare("PRAGMA auto_vacuum"));
  ASSIGN_OR_RETURN(has_row, auto_vacuum.Step());
  const bool incremental = has_row && auto_vacuum.ColumnInt(0) == 2;
  auto_vacuum.Reset();
  if (!incremental) {
    RETURN_IF_ERROR(db.Exec("PRAGMA auto_vacuum = INCREMENTAL"));
    if (found_version != 0) {
      spdlog::info("cache: rebuilding {} once, so that evicting gives disk space back",
                   path.string());
    }
    if (absl::Status status = db.Exec("VACUUM"); !status.ok()) {
      spdlog::warn("cache: cannot rebuild the index ({}); freed pages are reused, not given "
                   "back, until it can",
                   status.message());
    }
  }
  RETURN_IF_ERROR(db.Exec(absl::StrCat("PRAGMA journal_size_limit = ", kWalSizeLimit,
                                       "; PRAGMA cache_size = ", -kWriterCacheKiB)));
  if (found_version < kSchemaVersion) {
    ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(db));
    if (found_version == 0) RETURN_IF_ERROR(db.Exec(kSchema));
    if (found_version == 1) RETURN_IF_ERROR(db.Exec(kMigrationFrom1));
    if (found_version == 2) {
      // A version 2 store made before some of its tables were has them first.
      RETURN_IF_ERROR(db.Exec(kVersion2Tables));
      RETURN_IF_ERROR(db.Exec(kMigrationFrom2));
    }
    // A column added: instant, whatever the store holds.
    if (found_version != 0) RETURN_IF_ERROR(db.Exec(kMigrationFrom3));
    RETURN_IF_ERROR(db.Exec(absl::StrCat("PRAGMA user_version = ", kSchemaVersion)));
    RETURN_IF_ERROR(txn.Commit());
    if (found_version == 1 || found_version == 2) retire_served_files();
  }
  RETURN_IF_ERROR(db.Exec(kVersion2Tables));
  index.found_version = found_version;
  return index;
}

}  // namespace kiln::cache::store_internal
