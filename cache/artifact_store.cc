#include "cache/artifact_store.h"

#include <zstd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "cache/disk_usage.h"
#include "cache/sqlite.h"
#include "common/fmt_absl.h"
#include "common/platform.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;
using platform::FileStamp;
using platform::ReadWholeFile;
using platform::StampOf;

constexpr int64_t kSchemaVersion = 2;

// Version 2. Blobs are shared between entries; a blob row is deleted when no
// entry references it any more. Sizes are in bytes; times in unix milliseconds.
// LRU order uses a logical clock rather than wall time, so a clock step or two
// uses within one millisecond cannot reorder it. The served files
// (served_files.h) are recorded: which copies a blob has and what an entry's
// index file and link take, so that eviction removes them without reading a
// directory and the disk they take is known from the first second.
constexpr absl::string_view kSchema = R"sql(
CREATE TABLE blobs (
  id          INTEGER PRIMARY KEY,
  digest      BLOB NOT NULL UNIQUE,   -- SHA-256 of the uncompressed content
  size        INTEGER NOT NULL,       -- uncompressed
  stored_size INTEGER NOT NULL,       -- as stored, counted against the cap
  codec       INTEGER NOT NULL,       -- 0 raw, 1 zstd
  location    INTEGER NOT NULL,       -- 0 inline in `data`, 1 file blobs/<hh>/<hex>
  data        BLOB
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

enum Codec : int64_t { kRaw = 0, kZstd = 1 };
enum Location : int64_t { kInline = 0, kFile = 1 };

// Compression must save at least this fraction to be worth a decompress on every read.
constexpr double kMinCompressionGain = 0.10;
constexpr size_t kMinCompressibleSize = 256;
// Entries an eviction transaction takes at most: the writer is held about 15 ms
// (16,000 entries/s in-process on the 2-core machine), so puts interleave, and
// the per-batch checkpoint and vacuum are shared by enough entries.
constexpr int kEvictionBatch = 256;
// The space reserve's file in the data directory, and its size: room for an
// eviction's transaction (a batch rewrites some hundred pages) on a full disk,
// at most a 64th of the cap.
constexpr char kReserveFile[] = "space-reserve";
// Written when the store closes cleanly, removed when it opens: missing at an
// open, the last kilnd was killed and may have left files it never recorded.
constexpr char kCleanStopFile[] = "clean-stop";
// Where the unrecorded served files of a version 1 store go to be deleted.
constexpr char kRetiredDir[] = "retired";
constexpr uint64_t kMaxReserveBytes = 2 << 20;
// The WAL is checkpointed every this many pages (SQLite's default is 1000),
// and cut back to kWalSizeLimit after a checkpoint (SQLite leaves it at its
// largest otherwise): it holds little of the disk the cap bounds.
constexpr int kWalCheckpointPages = 256;
constexpr int kWalSizeLimit = 1 << 20;

int64_t NowMillis() { return absl::ToUnixMillis(absl::Now()); }

// "tenant:alpha" of "tenant:alpha/triton": the trust domain a namespace is in.
absl::string_view DomainOf(absl::string_view ns) { return ns.substr(0, ns.find('/')); }

// The namespaces of `domain` as a range [from, to): "<domain>/" up to
// "<domain>0", '0' being the character after '/'.
std::pair<std::string, std::string> DomainRange(absl::string_view domain) {
  return {absl::StrCat(domain, "/"), absl::StrCat(domain, "0")};
}

}  // namespace

// Blob and entry rows a transaction deleted; their files go only after it commits.
struct ArtifactStore::FreedBlobs {
  uint64_t bytes = 0;       // stored (compressed) bytes
  uint64_t file_bytes = 0;  // what the freed blob files take on disk
  uint64_t served_bytes = 0;  // what their served copies and index entries take
  uint64_t blob_rows = 0;
  std::vector<fs::path> files;
  // Deleted entries: their served index entries and links go too.
  struct Entry {
    std::string ns;
    std::string key;
    std::optional<std::string> index_namespace;
    std::optional<std::string> link_extension;
  };
  std::vector<Entry> entries;
  // Freed blobs that have served copies: digest, the copies' extensions.
  std::vector<std::pair<std::string, std::vector<std::string>>> served_copies;
  void Add(FreedBlobs&& other) {
    bytes += other.bytes;
    file_bytes += other.file_bytes;
    served_bytes += other.served_bytes;
    blob_rows += other.blob_rows;
    std::move(other.files.begin(), other.files.end(), std::back_inserter(files));
    std::move(other.entries.begin(), other.entries.end(), std::back_inserter(entries));
    std::move(other.served_copies.begin(), other.served_copies.end(),
              std::back_inserter(served_copies));
  }
};

// Served files a lookup wrote, to record in one transaction once it has read.
struct ArtifactStore::ServedWrites {
  std::vector<std::tuple<std::string, std::string, uint64_t>> copies;  // digest, extension, bytes
  std::optional<ServedFiles::IndexFootprint> index;
  std::string index_namespace;  // the client's, which `index` is keyed by
};

struct ArtifactStore::ReaderConnection {
  std::unique_ptr<sqlite::Database> db;
  sqlite::Statement lookup;
  sqlite::Statement find_entry;
};

struct ArtifactStore::Writer {
  std::unique_ptr<sqlite::Database> db;
  sqlite::Statement find_entry;
  sqlite::Statement delete_entry;
  sqlite::Statement entry_blob_ids;
  sqlite::Statement entry_name;
  sqlite::Statement find_blob;
  sqlite::Statement insert_blob;
  sqlite::Statement insert_entry;
  sqlite::Statement insert_entry_blob;
  sqlite::Statement orphan_blob;
  sqlite::Statement delete_blob;
  sqlite::Statement touch_entry;
  sqlite::Statement least_recently_used;
  sqlite::Statement least_recently_used_in_range;
  sqlite::Statement bytes_in_range;
  sqlite::Statement entry_bytes;
  sqlite::Statement entries_with_blob;
  sqlite::Statement file_blob_exists;
  sqlite::Statement blob_exists;
  sqlite::Statement entries_after;
  sqlite::Statement served_copies_of;
  sqlite::Statement record_served_copy;
  sqlite::Statement record_index;
  sqlite::Statement served_copy_recorded;
  sqlite::Statement record_leftover;
  sqlite::Statement leftovers;
  sqlite::Statement forget_leftover;
};

struct ArtifactStore::PreparedBlob {
  std::string name;
  std::string digest;
  uint64_t size = 0;
  Codec codec = kRaw;
  std::string stored;  // the bytes as stored; empty for file blobs once written
  uint64_t stored_size = 0;
  Location location = kInline;
  fs::path temp_path;  // file blobs: written durably, renamed into place on publish
};

// Returns a reader connection to the pool when the lookup is done.
class ArtifactStore::ReaderLease {
 public:
  ReaderLease(ArtifactStore* store, std::unique_ptr<ReaderConnection> reader)
      : store_(store), reader_(std::move(reader)) {}
  ReaderLease(ReaderLease&&) = default;
  ~ReaderLease() {
    if (reader_) store_->ReleaseReader(std::move(reader_));
  }
  ReaderConnection* operator->() { return reader_.get(); }

 private:
  ArtifactStore* store_;
  std::unique_ptr<ReaderConnection> reader_;
};

ArtifactStore::ArtifactStore(StoreOptions options)
    : options_(std::move(options)),
      trusted_blob_files_(options_.trust_files_changed_before),
      served_files_(options_.data_dir / "files", options_.trust_files_changed_before),
      hit_journal_(served_files_.hits_dir()) {}

void ArtifactStore::RequestStop() {
  stop_requested_ = true;
  {
    std::lock_guard lock(maintenance_mutex_);
    stopping_ = true;
  }
  maintenance_wakeup_.notify_all();
}

ArtifactStore::~ArtifactStore() {
  RequestStop();
  if (maintenance_thread_.joinable()) maintenance_thread_.join();
  if (retired_files_thread_.joinable()) retired_files_thread_.join();
  std::lock_guard lock(writer_mutex_);
  if (writer_) {
    if (absl::Status status = FlushTouches(); !status.ok()) {
      spdlog::warn("cache: last-use times not saved at shutdown: {}", status.message());
    }
    // Every file written is recorded by now: the next start need not sweep,
    // nor count what these totals say.
    if (!sweep_orphans_.load()) {
      absl::Status saved = SaveTotalsLocked();
      if (saved.ok()) saved = platform::WriteFileDurably(options_.data_dir / kCleanStopFile, "");
      if (!saved.ok()) {
        spdlog::warn("cache: cannot mark the stop as clean ({}); the next start sweeps the data "
                     "directory and counts the store again",
                     saved.message());
      }
    }
  }
}

absl::StatusOr<std::unique_ptr<ArtifactStore>> ArtifactStore::Open(StoreOptions options) {
  std::unique_ptr<ArtifactStore> store(new ArtifactStore(std::move(options)));
  RETURN_IF_ERROR(store->Initialize());
  store->maintenance_thread_ = std::thread([raw = store.get()] { raw->MaintenanceLoop(); });
  std::error_code error;
  if (fs::exists(store->options_.data_dir / kRetiredDir, error)) {
    store->retired_files_thread_ = std::thread([raw = store.get()] { raw->DeleteRetiredFiles(); });
  }
  return store;
}

absl::Status ArtifactStore::Initialize() {
  std::error_code error;
  fs::create_directories(options_.data_dir / "blobs" / "tmp", error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot create cache directory %s: %s; choose a writable --data-dir",
        options_.data_dir.string(), error.message()));
  }
  for (const fs::directory_entry& temp :
       fs::directory_iterator(options_.data_dir / "blobs" / "tmp", error)) {
    // Left by a process killed mid-put; the index never referenced them. Swept
    // before the first put can start one of its own.
    fs::remove(temp.path(), error);
  }
  auto writer = std::make_unique<Writer>();
  ASSIGN_OR_RETURN(writer->db,
                   sqlite::Database::Open(options_.data_dir / "kiln.db", options_.busy_timeout));
  sqlite::Database& db = *writer->db;
  ASSIGN_OR_RETURN(sqlite::Statement version, db.Prepare("PRAGMA user_version"));
  ASSIGN_OR_RETURN(bool has_row, version.Step());
  const int64_t found_version = has_row ? version.ColumnInt(0) : 0;
  version.Reset();
  if (found_version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cache database %s has schema version %d, newer than this kilnd understands (%d); "
        "upgrade kilnd or use another --data-dir",
        (options_.data_dir / "kiln.db").string(), found_version, kSchemaVersion));
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
                   (options_.data_dir / "kiln.db").string());
    }
    if (absl::Status status = db.Exec("VACUUM"); !status.ok()) {
      spdlog::warn("cache: cannot rebuild the index ({}); freed pages are reused, not given "
                   "back, until it can",
                   status.message());
    }
  }
  RETURN_IF_ERROR(db.Exec(absl::StrCat("PRAGMA journal_size_limit = ", kWalSizeLimit,
                                       "; PRAGMA wal_autocheckpoint = ", kWalCheckpointPages)));
  if (found_version < kSchemaVersion) {
    ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(db));
    RETURN_IF_ERROR(db.Exec(found_version == 0 ? kSchema : kMigrationFrom1));
    RETURN_IF_ERROR(db.Exec(absl::StrCat("PRAGMA user_version = ", kSchemaVersion)));
    RETURN_IF_ERROR(txn.Commit());
    if (found_version == 1) RetireUnrecordedServedFiles();
  }
  RETURN_IF_ERROR(db.Exec(kVersion2Tables));
  struct StatementSpec {
    sqlite::Statement Writer::*member;
    absl::string_view sql;
  };
  const StatementSpec specs[] = {
      {&Writer::find_entry,
       "SELECT id, index_disk_bytes, link_extension, index_namespace FROM entries "
       "WHERE namespace = ?1 AND key = ?2"},
      {&Writer::delete_entry, "DELETE FROM entries WHERE id = ?1"},
      {&Writer::entry_blob_ids, "SELECT blob_id FROM entry_blobs WHERE entry_id = ?1"},
      {&Writer::entry_name,
       "SELECT namespace, key, index_disk_bytes, link_extension, index_namespace FROM entries "
       "WHERE id = ?1"},
      {&Writer::find_blob, "SELECT id FROM blobs WHERE digest = ?1"},
      {&Writer::insert_blob,
       "INSERT INTO blobs (digest, size, stored_size, codec, location, data) "
       "VALUES (?1, ?2, ?3, ?4, ?5, ?6)"},
      {&Writer::insert_entry,
       "INSERT INTO entries (namespace, key, created_ms, last_use, index_disk_bytes, "
       "link_extension, index_namespace) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"},
      {&Writer::insert_entry_blob,
       "INSERT INTO entry_blobs (entry_id, name, blob_id) VALUES (?1, ?2, ?3)"},
      {&Writer::orphan_blob,
       "SELECT digest, stored_size, location, size FROM blobs WHERE id = ?1 AND NOT EXISTS "
       "(SELECT 1 FROM entry_blobs WHERE blob_id = ?1)"},
      {&Writer::delete_blob, "DELETE FROM blobs WHERE id = ?1"},
      {&Writer::touch_entry,
       "UPDATE entries SET last_use = max(last_use, ?2) WHERE id = ?1"},
      {&Writer::least_recently_used,
       "SELECT id FROM entries ORDER BY last_use LIMIT ?1"},
      // Namespaces in [?1, ?2): one trust domain's (see DomainRange).
      {&Writer::least_recently_used_in_range,
       "SELECT id FROM entries WHERE namespace >= ?1 AND namespace < ?2 ORDER BY last_use "
       "LIMIT ?3"},
      {&Writer::bytes_in_range,
       "SELECT total(b.stored_size) FROM entries e JOIN entry_blobs eb ON eb.entry_id = e.id "
       "JOIN blobs b ON b.id = eb.blob_id WHERE e.namespace >= ?1 AND e.namespace < ?2"},
      {&Writer::entry_bytes,
       "SELECT total(b.stored_size) FROM entry_blobs eb JOIN blobs b ON b.id = eb.blob_id "
       "WHERE eb.entry_id = ?1"},
      {&Writer::entries_with_blob,
       "SELECT b.id, eb.entry_id FROM blobs b LEFT JOIN entry_blobs eb ON eb.blob_id = b.id "
       "WHERE b.digest = ?1"},
      {&Writer::file_blob_exists, "SELECT 1 FROM blobs WHERE digest = ?1 AND location = 1"},
      {&Writer::blob_exists, "SELECT 1 FROM blobs WHERE digest = ?1"},
      // Namespaces in [?1, ?2), created since ?3, after entry ?4.
      {&Writer::entries_after,
       "SELECT id, namespace, key, created_ms FROM entries WHERE namespace >= ?1 AND "
       "namespace < ?2 AND created_ms >= ?3 AND id > ?4 ORDER BY id LIMIT ?5"},
      {&Writer::served_copies_of,
       "SELECT extension, disk_bytes FROM served_copies WHERE blob_id = ?1"},
      // Nothing when the blob went meanwhile: the caller then removes the file.
      {&Writer::record_served_copy,
       "INSERT OR REPLACE INTO served_copies (blob_id, extension, disk_bytes) "
       "SELECT id, ?2, ?3 FROM blobs WHERE digest = ?1"},
      {&Writer::record_index,
       "UPDATE entries SET index_disk_bytes = ?3, link_extension = ?4, index_namespace = ?5 "
       "WHERE namespace = ?1 AND key = ?2"},
      {&Writer::record_leftover,
       "INSERT OR REPLACE INTO leftover_files (path, disk_bytes) VALUES (?1, ?2)"},
      {&Writer::leftovers, "SELECT path, disk_bytes FROM leftover_files LIMIT 1000"},
      {&Writer::forget_leftover, "DELETE FROM leftover_files WHERE path = ?1"},
      {&Writer::served_copy_recorded,
       "SELECT 1 FROM served_copies c JOIN blobs b ON b.id = c.blob_id "
       "WHERE b.digest = ?1 AND c.extension = ?2"},
  };
  for (const StatementSpec& spec : specs) {
    ASSIGN_OR_RETURN(writer.get()->*spec.member, db.Prepare(spec.sql));
  }
  // The files of a kilnd that did not stop cleanly may include some it wrote
  // and never recorded: the maintenance thread sweeps them (RemoveOrphanFiles).
  // A new store has none.
  const bool stopped_cleanly = fs::remove(options_.data_dir / kCleanStopFile, error);
  sweep_orphans_ = found_version != 0 && !stopped_cleanly;
  ASSIGN_OR_RETURN(Totals totals, ReadTotals(db, stopped_cleanly));
  blob_count_ = totals.blobs;
  stored_bytes_ = totals.stored_bytes;
  file_blob_bytes_ = totals.file_blob_bytes;
  entry_count_ = totals.entries;
  use_clock_ = static_cast<int64_t>(totals.use_clock);
  leftover_bytes_ = totals.leftover_bytes;
  writer_ = std::move(writer);
  RETURN_IF_ERROR(served_files_.Initialize(options_.served_file_readers));
  served_files_.AddRecordedBytes(totals.served_bytes);
  EnsureSpaceReserve();
  MeasureUnrecordedBytes();
  return absl::OkStatus();
}

absl::StatusOr<ArtifactStore::Totals> ArtifactStore::ReadTotals(sqlite::Database& db,
                                                               bool stopped_cleanly) {
  Totals totals;
  ASSIGN_OR_RETURN(sqlite::Statement saved,
                   db.Prepare("SELECT blobs, stored_bytes, file_blob_bytes, entries, served_bytes, "
                              "use_clock, leftover_bytes FROM clean_stop_totals"));
  ASSIGN_OR_RETURN(bool has_row, saved.Step());
  // Saved by a stop that wrote clean-stop after them; without it, anything
  // written since may not be in them.
  if (has_row && stopped_cleanly) {
    const auto column = [&saved](int index) { return static_cast<uint64_t>(saved.ColumnInt(index)); };
    totals = {column(0), column(1), column(2), column(3), column(4), column(5), column(6)};
  }
  saved.Reset();
  if (has_row) {
    // Gone before the first write: a kill from here on leaves no stale totals.
    RETURN_IF_ERROR(db.Exec("DELETE FROM clean_stop_totals"));
    if (stopped_cleanly) return totals;
  }
  // What the store holds and what every file it wrote takes, from its records:
  // exact without reading a directory, in one pass over each table (blobs,
  // with its inline data, is most of the database).
  ASSIGN_OR_RETURN(
      sqlite::Statement scan,
      db.Prepare(absl::StrCat(
          "SELECT b.rows, b.stored, b.in_files, e.rows, e.index_bytes, e.last_use, "
          "(SELECT total(disk_bytes) FROM served_copies), "
          "(SELECT total(disk_bytes) FROM leftover_files) FROM "
          "(SELECT count(*) AS rows, total(stored_size) AS stored, "
          "total(CASE WHEN location = 1 THEN (stored_size + ", kDiskBlock - 1, ") / ", kDiskBlock,
          " * ", kDiskBlock, " END) AS in_files FROM blobs) b, "
          "(SELECT count(*) AS rows, total(index_disk_bytes) AS index_bytes, "
          "max(last_use) AS last_use FROM entries) e")));
  ASSIGN_OR_RETURN(has_row, scan.Step());
  if (!has_row) return absl::InternalError("the store's totals query returned no row");
  const auto column = [&scan](int index) { return static_cast<uint64_t>(scan.ColumnInt(index)); };
  totals = {column(0), column(1), column(2), column(3), column(4) + column(6), column(5), column(7)};
  scan.Reset();
  return totals;
}

absl::Status ArtifactStore::SaveTotalsLocked() {
  ASSIGN_OR_RETURN(
      sqlite::Statement save,
      writer_->db->Prepare("INSERT OR REPLACE INTO clean_stop_totals (id, blobs, stored_bytes, "
                           "file_blob_bytes, entries, served_bytes, use_clock, leftover_bytes) "
                           "VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7)"));
  const auto value = [](uint64_t number) { return static_cast<int64_t>(number); };
  save.Bind(1, value(blob_count_.load()))
      .Bind(2, value(stored_bytes_.load()))
      .Bind(3, value(file_blob_bytes_.load()))
      .Bind(4, value(entry_count_.load()))
      .Bind(5, value(served_files_.file_bytes()))
      .Bind(6, use_clock_.load())
      .Bind(7, value(leftover_bytes_.load()));
  return save.Run();
}

void ArtifactStore::EnsureSpaceReserve() {
  const fs::path reserve = options_.data_dir / kReserveFile;
  const uint64_t size = std::min(kMaxReserveBytes, options_.max_size_bytes / 64);
  if (FileSize(reserve) == size) return;
  std::error_code error;
  fs::remove(reserve, error);
  // Written, not sized: a sparse file would reserve nothing.
  if (!platform::WriteFileDurably(reserve, std::string(size, '\0')).ok()) {
    fs::remove(reserve, error);  // on a full disk: made again once there is room
  }
}

uint64_t ArtifactStore::DiskBytes() const {
  const fs::path db = options_.data_dir / "kiln.db";
  return file_blob_bytes_.load() + served_files_.bytes() + unrecorded_bytes_.load() +
         leftover_bytes_.load() +
         platform::AllocatedBytes(db) + platform::AllocatedBytes(fs::path(db).concat("-wal")) +
         platform::AllocatedBytes(fs::path(db).concat("-shm"));
}

void ArtifactStore::MeasureUnrecordedBytes() {
  std::error_code error;
  served_files_.MeasureDirectories();
  uint64_t measured = platform::AllocatedBytes(options_.data_dir);
  const auto add_tree = [&](const fs::path& root) {
    measured += platform::AllocatedBytes(root);
    for (auto it = fs::recursive_directory_iterator(root, error);
         it != fs::recursive_directory_iterator(); it.increment(error)) {
      measured += platform::AllocatedBytes(it->path());
    }
  };
  for (const fs::directory_entry& top : fs::directory_iterator(options_.data_dir, error)) {
    const std::string name = top.path().filename().string();
    if (absl::StartsWith(name, "kiln.db") || name == kRetiredDir) continue;
    if (name == "files") {
      add_tree(served_files_.hits_dir());  // the rest is counted by ServedFiles
    } else if (name == "blobs") {
      // Its directories; the blob files are counted from their records.
      measured += platform::AllocatedBytes(top.path());
      for (const fs::directory_entry& subdir : fs::directory_iterator(top.path(), error)) {
        measured += platform::AllocatedBytes(subdir.path());
      }
    } else if (top.is_directory(error)) {
      add_tree(top.path());  // logs/
    } else {
      measured += platform::AllocatedBytes(top.path());  // the reserve, the lock, the miss log
    }
  }
  unrecorded_bytes_ = measured;
}

void ArtifactStore::NoteDiskFull(const absl::Status& status) {
  puts_refused_disk_full_.fetch_add(1);
  std::lock_guard lock(disk_full_mutex_);
  if (disk_full_since_.has_value()) return;
  disk_full_since_ = absl::Now();
  spdlog::error("cache: the disk of {} is full: results are served but not stored until there "
                "is room (free disk space, lower max_cache_size, or run kiln gc); what failed: {}",
                options_.data_dir.string(), status.message());
}

void ArtifactStore::NoteStored() {
  {
    std::lock_guard lock(disk_full_mutex_);
    if (!disk_full_since_.has_value()) return;
    disk_full_since_.reset();
  }
  spdlog::info("cache: there is room on disk again; results are stored again ({} were not)",
               puts_refused_disk_full_.load());
  EnsureSpaceReserve();
}

absl::StatusOr<std::unique_ptr<ArtifactStore::ReaderConnection>> ArtifactStore::OpenReader() {
  auto reader = std::make_unique<ReaderConnection>();
  ASSIGN_OR_RETURN(reader->db,
                   sqlite::Database::Open(options_.data_dir / "kiln.db", options_.busy_timeout));
  ASSIGN_OR_RETURN(reader->lookup,
                   reader->db->Prepare(
                       "SELECT e.id, e.created_ms, eb.name, b.digest, b.size, b.codec, "
                       "b.location, b.data FROM entries e "
                       "JOIN entry_blobs eb ON eb.entry_id = e.id "
                       "JOIN blobs b ON b.id = eb.blob_id "
                       "WHERE e.namespace = ?1 AND e.key = ?2 ORDER BY eb.name"));
  ASSIGN_OR_RETURN(reader->find_entry,
                   reader->db->Prepare("SELECT id FROM entries WHERE namespace = ?1 AND key = ?2"));
  return reader;
}

absl::StatusOr<ArtifactStore::ReaderLease> ArtifactStore::AcquireReader() {
  {
    std::lock_guard lock(readers_mutex_);
    if (!idle_readers_.empty()) {
      std::unique_ptr<ReaderConnection> reader = std::move(idle_readers_.back());
      idle_readers_.pop_back();
      return ReaderLease(this, std::move(reader));
    }
  }
  // The pool grows to the peak number of concurrent lookups.
  ASSIGN_OR_RETURN(std::unique_ptr<ReaderConnection> reader, OpenReader());
  return ReaderLease(this, std::move(reader));
}

void ArtifactStore::ReleaseReader(std::unique_ptr<ReaderConnection> reader) {
  std::lock_guard lock(readers_mutex_);
  idle_readers_.push_back(std::move(reader));
}

fs::path ArtifactStore::BlobPath(absl::string_view digest) const {
  const std::string hex = DigestHex(digest);
  return options_.data_dir / "blobs" / hex.substr(0, 2) / hex;
}

absl::StatusOr<std::string> ArtifactStore::ReadBlobContent(int64_t codec, int64_t location,
                                                           absl::string_view inline_data,
                                                           absl::string_view digest,
                                                           uint64_t size, IntegrityCheck check) {
  std::string stored;
  std::optional<FileStamp> stamp;  // of a blob file read whole between two equal stamps
  if (location == kFile) {
    const fs::path path = BlobPath(digest);
    ASSIGN_OR_RETURN(const FileStamp before, StampOf(path));
    ASSIGN_OR_RETURN(stored, ReadWholeFile(path));
    ASSIGN_OR_RETURN(const FileStamp after, StampOf(path));
    if (after == before) {
      if (check == IntegrityCheck::kTrustUnchangedFiles &&
          trusted_blob_files_.Unchanged(digest, before)) {
        // Unchanged since its content was checked: no need to hash it again.
        return Decode(codec, std::move(stored), size);
      }
      stamp = before;
    }
  } else {
    stored.assign(inline_data.data(), inline_data.size());
  }
  ASSIGN_OR_RETURN(std::string content, Decode(codec, std::move(stored), size));
  if (content.size() != size || DigestBytes(Sha256(content)) != digest) {
    return absl::DataLossError("content does not match its SHA-256");
  }
  if (stamp.has_value()) trusted_blob_files_.Remember(digest, *stamp);
  return content;
}

absl::StatusOr<std::string> ArtifactStore::Decode(int64_t codec, std::string stored,
                                                  uint64_t size) {
  if (codec != kZstd) return stored;
  std::string content(size, '\0');
  const size_t produced = ZSTD_decompress(content.data(), size, stored.data(), stored.size());
  if (ZSTD_isError(produced) || produced != size) {
    return absl::DataLossError(absl::StrCat("zstd frame does not decode to ", size, " bytes"));
  }
  return content;
}

absl::Status ArtifactStore::ServeAsFile(StoredBlob& blob, int64_t codec, int64_t location,
                                        absl::string_view inline_data, ServedWrites& writes) {
  const std::optional<std::string> extension = ServedFiles::ExtensionOf(blob.name);
  if (extension.has_value()) {
    if (std::optional<fs::path> served = served_files_.Find(blob.digest, *extension)) {
      blob.file = *std::move(served);
      return absl::OkStatus();
    }
  }
  ASSIGN_OR_RETURN(std::string content,
                   ReadBlobContent(codec, location, inline_data, blob.digest, blob.size,
                                   IntegrityCheck::kTrustUnchangedFiles));
  if (extension.has_value()) {
    absl::StatusOr<ServedFiles::Written> published =
        served_files_.Publish(blob.digest, *extension, content);
    if (published.ok()) {
      writes.copies.emplace_back(blob.digest, *extension, published->disk_bytes);
      blob.file = std::move(published->path);
      return absl::OkStatus();
    }
    spdlog::warn("cache: blob {} sent as bytes, not as a file: {}", DigestHex(blob.digest),
                 published.status().message());
  }
  blob.data = std::move(content);
  return absl::OkStatus();
}

absl::StatusOr<ArtifactStore::ReadResult> ArtifactStore::ReadEntry(
    absl::string_view ns, absl::string_view key,
    const absl::flat_hash_set<std::string>& digests_to_skip, const AsFiles* as_files) {
  ReadResult result;
  std::vector<std::pair<std::string, std::string>> broken;  // digest, reason
  ServedWrites writes;
  {
    ASSIGN_OR_RETURN(ReaderLease reader, AcquireReader());
    sqlite::Statement& lookup = reader->lookup;
    lookup.BindText(1, ns).BindText(2, key);
    // One statement is one read transaction: eviction cannot remove a blob
    // between reading the manifest and reading its rows.
    while (true) {
      absl::StatusOr<bool> row = lookup.Step();
      if (!row.ok()) {
        lookup.Reset();
        return row.status();
      }
      if (!*row) break;
      result.entry_id = lookup.ColumnInt(0);
      result.entry.created = absl::FromUnixMillis(lookup.ColumnInt(1));
      StoredBlob blob{std::string(lookup.ColumnText(2)), std::string(lookup.ColumnBlob(3)),
                      static_cast<uint64_t>(lookup.ColumnInt(4)), std::nullopt, std::nullopt};
      if (as_files != nullptr) {
        if (absl::Status served = ServeAsFile(blob, lookup.ColumnInt(5), lookup.ColumnInt(6),
                                              lookup.ColumnBlob(7), writes);
            !served.ok()) {
          broken.emplace_back(blob.digest, std::string(served.message()));
          continue;
        }
      } else if (!digests_to_skip.contains(blob.digest)) {
        absl::StatusOr<std::string> content =
            ReadBlobContent(lookup.ColumnInt(5), lookup.ColumnInt(6), lookup.ColumnBlob(7),
                            blob.digest, blob.size, IntegrityCheck::kTrustUnchangedFiles);
        if (!content.ok()) {
          broken.emplace_back(blob.digest, std::string(content.status().message()));
          continue;
        }
        blob.data = *std::move(content);
      }
      result.entry.blobs.push_back(std::move(blob));
    }
    lookup.Reset();
  }
  if (result.entry_id >= 0 && broken.empty() && as_files != nullptr &&
      !as_files->index_namespace.empty()) {
    writes.index = IndexServedEntry(*as_files, key, result.entry);
    writes.index_namespace = as_files->index_namespace;
  }
  if (!writes.copies.empty() || writes.index.has_value()) RecordServedWrites(ns, key, writes);
  if (result.entry_id < 0) {
    return absl::NotFoundError(absl::StrFormat("no cache entry for %s/%s", ns, key));
  }
  if (!broken.empty()) {
    for (const auto& [digest, reason] : broken) DropCorruptBlob(digest, reason);
    return absl::NotFoundError(
        absl::StrFormat("cache entry %s/%s failed its integrity check and was dropped", ns, key));
  }
  return result;
}

std::optional<ServedFiles::IndexFootprint> ArtifactStore::IndexServedEntry(
    const AsFiles& as_files, absl::string_view key, const CacheEntry& entry) {
  std::vector<ServedFiles::IndexedFile> files;
  for (const StoredBlob& blob : entry.blobs) {
    if (!blob.file.has_value()) return std::nullopt;  // sent as bytes: a client must ask for it
    files.push_back({blob.name, *blob.file, blob.size});
  }
  absl::StatusOr<std::optional<ServedFiles::IndexFootprint>> footprint =
      served_files_.PublishIndex(as_files.index_namespace, key, files);
  if (!footprint.ok()) {
    spdlog::warn("cache: no served index entry for {}/{}: {}", as_files.index_namespace, key,
                 footprint.status().message());
    return std::nullopt;
  }
  return *footprint;
}

void ArtifactStore::RecordServedWrites(absl::string_view ns, absl::string_view key,
                                       const ServedWrites& writes) {
  std::vector<std::pair<std::string, std::string>> unrecorded;  // digest, extension
  bool index_unrecorded = false;
  {
    std::lock_guard lock(writer_mutex_);
    Writer& w = *writer_;
    auto record = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(*w.db));
      for (const auto& [digest, extension, disk_bytes] : writes.copies) {
        RETURN_IF_ERROR(w.record_served_copy.BindBlob(1, digest)
                            .BindText(2, extension)
                            .Bind(3, static_cast<int64_t>(disk_bytes))
                            .Run());
        if (w.db->ChangedRows() == 0) unrecorded.emplace_back(digest, extension);
      }
      if (writes.index.has_value()) {
        w.record_index.BindText(1, ns).BindText(2, key);
        w.record_index.Bind(3, static_cast<int64_t>(writes.index->disk_bytes));
        if (writes.index->link_extension.has_value()) {
          w.record_index.BindText(4, *writes.index->link_extension);
        } else {
          w.record_index.BindNull(4);
        }
        w.record_index.BindText(5, writes.index_namespace);
        RETURN_IF_ERROR(w.record_index.Run());
        index_unrecorded = w.db->ChangedRows() == 0;
      }
      return txn.Commit();
    };
    if (absl::Status status = record(); !status.ok()) {
      // Unrecorded, they would be counted by no one and removed by nothing.
      spdlog::warn("cache: served files of {}/{} not recorded ({}); removing them",
                   ns, key, status.message());
      unrecorded.clear();
      for (const auto& [digest, extension, disk_bytes] : writes.copies) {
        unrecorded.emplace_back(digest, extension);
      }
      index_unrecorded = writes.index.has_value();
    }
  }
  // The blob or entry went while the files were written: they go too.
  for (const auto& [digest, extension] : unrecorded) served_files_.Remove(digest, {extension});
  if (index_unrecorded) {
    served_files_.RemoveIndex(writes.index_namespace, key, writes.index->link_extension);
  }
}

absl::StatusOr<CacheEntry> ArtifactStore::Lookup(
    absl::string_view ns, absl::string_view key,
    const absl::flat_hash_set<std::string>& digests_to_skip, const AsFiles* as_files) {
  absl::StatusOr<ReadResult> read = ReadEntry(ns, key, digests_to_skip, as_files);
  const bool hit = read.ok();
  if (hit || absl::IsNotFound(read.status())) {
    CountLookup(ns, hit);
    (hit ? hits_ : misses_).fetch_add(1, std::memory_order_relaxed);
  }
  if (!hit) return read.status();
  RecordTouch(read->entry_id);
  return std::move(read->entry);
}

absl::Status ArtifactStore::ServeAsFiles(absl::string_view ns, absl::string_view key,
                                         const AsFiles& as_files) {
  return ReadEntry(ns, key, {}, &as_files).status();
}

absl::StatusOr<uint64_t> ArtifactStore::RecordHits(absl::string_view ns,
                                                   const std::vector<std::string>& keys) {
  uint64_t recorded = 0;
  ASSIGN_OR_RETURN(ReaderLease reader, AcquireReader());
  sqlite::Statement& find = reader->find_entry;
  for (const std::string& key : keys) {
    find.BindText(1, ns).BindText(2, key);
    absl::StatusOr<bool> row = find.Step();
    const int64_t entry_id = row.ok() && *row ? find.ColumnInt(0) : -1;
    find.Reset();
    RETURN_IF_ERROR(row.status());
    if (entry_id < 0) continue;  // evicted meanwhile: the client's copy still served it
    RecordTouch(entry_id);
    CountLookup(ns, true);
    hits_.fetch_add(1, std::memory_order_relaxed);
    ++recorded;
  }
  return recorded;
}

uint64_t ArtifactStore::CollectJournaledHits() {
  return hit_journal_.Collect([this](absl::string_view ns, const std::vector<std::string>& keys) {
    const std::string scoped = absl::StrCat(options_.served_namespace_prefix, ns);
    if (absl::StatusOr<uint64_t> recorded = RecordHits(scoped, keys); !recorded.ok()) {
      spdlog::warn("cache: journaled hits in {} not counted: {}", scoped,
                   recorded.status().message());
    }
  });
}

void ArtifactStore::CountLookup(absl::string_view ns, bool hit) {
  std::lock_guard lock(namespace_stats_mutex_);
  auto& [hits, misses] = lookups_by_namespace_[ns];
  ++(hit ? hits : misses);
}

void ArtifactStore::RecordTouch(int64_t entry_id) {
  std::lock_guard lock(touches_mutex_);
  pending_touches_[entry_id] = ++use_clock_;
}

absl::StatusOr<ArtifactStore::PreparedBlob> ArtifactStore::PrepareBlob(BlobInput input) {
  PreparedBlob blob;
  blob.name = std::move(input.name);
  blob.digest = DigestBytes(Sha256(input.data));
  blob.size = input.data.size();
  if (!input.expected_digest.empty() && input.expected_digest != blob.digest) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "blob '%s': data has SHA-256 %s but the request claims %s; the upload was damaged or "
        "the client hashed different bytes",
        blob.name, DigestHex(blob.digest), DigestHex(input.expected_digest)));
  }
  blob.stored = std::move(input.data);
  if (options_.zstd_level > 0 && blob.size >= kMinCompressibleSize) {
    std::string compressed(ZSTD_compressBound(blob.size), '\0');
    const size_t length = ZSTD_compress(compressed.data(), compressed.size(), blob.stored.data(),
                                        blob.stored.size(), options_.zstd_level);
    if (!ZSTD_isError(length) &&
        static_cast<double>(length) <= static_cast<double>(blob.size) * (1 - kMinCompressionGain)) {
      compressed.resize(length);
      blob.stored = std::move(compressed);
      blob.codec = kZstd;
    }
  }
  blob.stored_size = blob.stored.size();
  if (blob.stored_size >= options_.inline_threshold_bytes) {
    blob.location = kFile;
    blob.temp_path = options_.data_dir / "blobs" / "tmp" /
                     absl::StrCat(DigestHex(blob.digest).substr(0, 16), ".",
                                  temp_file_counter_.fetch_add(1), ".tmp");
    RETURN_IF_ERROR(platform::WriteFileDurably(blob.temp_path, blob.stored));
    blob.stored.clear();
  }
  return blob;
}

absl::Status ArtifactStore::PublishBlobFile(const PreparedBlob& blob) {
  const fs::path target = BlobPath(blob.digest);
  std::error_code error;
  fs::create_directories(target.parent_path(), error);  // counted by MeasureUnrecordedBytes
  // Blob files are named for their content: if a reader holds the target open
  // (Windows refuses to replace it), the file there already has these bytes.
  return platform::PublishContentAddressedFile(blob.temp_path, target);
}

absl::StatusOr<std::vector<StoredBlob>> ArtifactStore::Put(absl::string_view ns,
                                                           absl::string_view key,
                                                           std::vector<BlobInput> blobs,
                                                           const NamedDigests& stored) {
  if (ns.empty() || key.empty()) {
    return absl::InvalidArgumentError("a cache entry needs a non-empty namespace and key");
  }
  if (blobs.empty() && stored.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("entry %s/%s has no blobs; send at least one artifact", ns, key));
  }
  absl::flat_hash_set<std::string> names;
  std::vector<absl::string_view> all_names;
  for (const BlobInput& blob : blobs) all_names.push_back(blob.name);
  for (const auto& [name, digest] : stored) all_names.push_back(name);
  for (absl::string_view name : all_names) {
    if (name.empty() || !names.insert(std::string(name)).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "entry %s/%s: blob name '%s' is empty or repeated; every blob needs a unique name", ns,
          key, name));
    }
  }
  std::vector<PreparedBlob> prepared;
  prepared.reserve(blobs.size());
  absl::Status status;
  for (BlobInput& blob : blobs) {
    absl::StatusOr<PreparedBlob> ready = PrepareBlob(std::move(blob));
    if (!ready.ok()) {
      status = ready.status();
      break;
    }
    prepared.push_back(*std::move(ready));
  }
  if (status.ok()) status = CommitInGroup(ns, key, prepared, stored);
  if (absl::IsResourceExhausted(status)) NoteDiskFull(status);
  if (status.ok()) NoteStored();
  std::error_code ignored;
  for (const PreparedBlob& blob : prepared) {
    if (!blob.temp_path.empty()) fs::remove(blob.temp_path, ignored);
  }
  if (!status.ok()) return status;
  std::vector<StoredBlob> manifest;
  for (const PreparedBlob& blob : prepared) {
    manifest.push_back({blob.name, blob.digest, blob.size, std::nullopt, std::nullopt});
  }
  std::sort(manifest.begin(), manifest.end(),
            [](const StoredBlob& a, const StoredBlob& b) { return a.name < b.name; });
  if (!prepared.empty()) puts_.fetch_add(1, std::memory_order_relaxed);
  const absl::string_view domain = DomainOf(ns);
  const bool capped = options_.max_domain_bytes > 0 && !options_.capped_domain_prefix.empty() &&
                      absl::StartsWith(domain, options_.capped_domain_prefix);
  const bool over_cap = DiskBytes() > options_.max_size_bytes;
  if (capped || over_cap) {
    {
      std::lock_guard lock(maintenance_mutex_);
      if (capped) domains_put_to_.emplace(domain);
      if (over_cap) eviction_needed_ = true;
    }
    maintenance_wakeup_.notify_one();
  }
  return manifest;
}

// One put waiting for a group commit: what it stores, and once `done`, how it went.
struct ArtifactStore::QueuedPut {
  absl::string_view ns;
  absl::string_view key;
  const std::vector<PreparedBlob>* prepared = nullptr;
  const NamedDigests* stored = nullptr;
  bool done = false;  // guarded by put_queue_mutex_
  absl::Status result;
  // Within the group's transaction, until it commits.
  uint64_t added_bytes = 0;
  uint64_t added_file_bytes = 0;
  std::vector<fs::path> published_files;  // blob files it moved into place
  std::vector<std::string> inserted_digests;  // of the blob rows it added
  bool new_entry = false;  // not one replaced
  FreedBlobs freed;
};

absl::Status ArtifactStore::CommitInGroup(absl::string_view ns, absl::string_view key,
                                          const std::vector<PreparedBlob>& prepared,
                                          const NamedDigests& stored) {
  QueuedPut mine;
  mine.ns = ns;
  mine.key = key;
  mine.prepared = &prepared;
  mine.stored = &stored;
  {
    std::lock_guard lock(put_queue_mutex_);
    put_queue_.push_back(&mine);
  }
  // Whoever gets the writer commits every put queued by then in one
  // transaction: puts that arrive while a commit runs share the next one, so
  // sixteen writers pay for about one commit, not sixteen.
  std::lock_guard writer_lock(writer_mutex_);
  std::vector<QueuedPut*> group;
  {
    std::lock_guard lock(put_queue_mutex_);
    if (mine.done) return mine.result;  // an earlier holder committed it
    group.swap(put_queue_);
  }
  CommitGroupLocked(group);
  return mine.result;
}

void ArtifactStore::CommitGroupLocked(const std::vector<QueuedPut*>& group) {
  Writer& w = *writer_;
  absl::Status status;
  absl::StatusOr<sqlite::Transaction> txn = sqlite::Transaction::Begin(*w.db);
  if (txn.ok()) {
    for (QueuedPut* put : group) {
      // Each put on a savepoint of its own: one that fails (a `stored` digest
      // evicted meanwhile, a full disk) takes back only itself.
      put->result = w.db->Exec("SAVEPOINT put");
      if (put->result.ok()) put->result = PutInTransactionLocked(*put);
      if (put->result.ok()) {
        put->result = w.db->Exec("RELEASE put");
      } else {
        w.db->Exec("ROLLBACK TO put; RELEASE put").IgnoreError();
        RemovePublishedFiles(*put);
      }
    }
    status = txn->Commit();
  } else {
    status = txn.status();
  }
  // A blob one put of the group freed and a later one stored again has its
  // file in place under the same name: it stays.
  absl::flat_hash_set<std::string> stored_again;
  for (QueuedPut* put : group) {
    if (!status.ok() && put->result.ok()) {
      put->result = status;
      RemovePublishedFiles(*put);
    }
    if (put->result.ok()) {
      stored_again.insert(put->inserted_digests.begin(), put->inserted_digests.end());
    }
  }
  for (QueuedPut* put : group) {
    if (!put->result.ok()) continue;
    stored_bytes_ += put->added_bytes;
    file_blob_bytes_ += put->added_file_bytes;
    blob_count_ += put->inserted_digests.size();
    if (put->new_entry) ++entry_count_;
    std::erase_if(put->freed.files, [&](const fs::path& file) {
      return stored_again.contains(absl::HexStringToBytes(file.filename().string()));
    });
    ReleaseFreedBlobs(put->freed);
  }
  {
    std::lock_guard lock(put_queue_mutex_);
    for (QueuedPut* put : group) put->done = true;
  }
}

void ArtifactStore::RemovePublishedFiles(const QueuedPut& put) {
  // Moved into place for blob rows that were taken back: no row names them.
  std::error_code error;
  for (const fs::path& file : put.published_files) fs::remove(file, error);
}

absl::Status ArtifactStore::PutInTransactionLocked(QueuedPut& put) {
  Writer& w = *writer_;
  std::vector<int64_t> replaced_blob_ids;
  ASSIGN_OR_RETURN(const int64_t entry_id, ReplaceEntryLocked(put.ns, put.key, replaced_blob_ids,
                                                              put.new_entry));
  for (const PreparedBlob& blob : *put.prepared) {
    w.find_blob.BindBlob(1, blob.digest);
    ASSIGN_OR_RETURN(bool known, w.find_blob.Step());
    int64_t blob_id = known ? w.find_blob.ColumnInt(0) : -1;
    w.find_blob.Reset();
    if (!known) {
      if (blob.location == kFile) {
        RETURN_IF_ERROR(PublishBlobFile(blob));
        put.published_files.push_back(BlobPath(blob.digest));
      }
      w.insert_blob.BindBlob(1, blob.digest)
          .Bind(2, static_cast<int64_t>(blob.size))
          .Bind(3, static_cast<int64_t>(blob.stored_size))
          .Bind(4, blob.codec)
          .Bind(5, blob.location);
      if (blob.location == kInline) {
        w.insert_blob.BindBlob(6, blob.stored);
      } else {
        w.insert_blob.BindNull(6);
      }
      RETURN_IF_ERROR(w.insert_blob.Run());
      blob_id = w.db->LastInsertId();
      put.inserted_digests.push_back(blob.digest);
      put.added_bytes += blob.stored_size;
      if (blob.location == kFile) put.added_file_bytes += OnDisk(blob.stored_size);
    }
    RETURN_IF_ERROR(
        w.insert_entry_blob.Bind(1, entry_id).BindText(2, blob.name).Bind(3, blob_id).Run());
  }
  for (const auto& [name, digest] : *put.stored) {
    w.find_blob.BindBlob(1, digest);
    ASSIGN_OR_RETURN(bool known, w.find_blob.Step());
    const int64_t blob_id = known ? w.find_blob.ColumnInt(0) : -1;
    w.find_blob.Reset();
    if (!known) {
      return absl::FailedPreconditionError(
          absl::StrFormat("blob %s of '%s' is no longer stored", DigestHex(digest), name));
    }
    RETURN_IF_ERROR(
        w.insert_entry_blob.Bind(1, entry_id).BindText(2, name).Bind(3, blob_id).Run());
  }
  ASSIGN_OR_RETURN(put.freed, DeleteOrphanBlobsLocked(replaced_blob_ids));
  return absl::OkStatus();
}

absl::Status ArtifactStore::DeleteEntryLocked(int64_t entry_id,
                                              std::vector<int64_t>& freed_candidates) {
  Writer& w = *writer_;
  w.entry_blob_ids.Bind(1, entry_id);
  while (true) {
    absl::StatusOr<bool> row = w.entry_blob_ids.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    freed_candidates.push_back(w.entry_blob_ids.ColumnInt(0));
  }
  w.entry_blob_ids.Reset();
  return w.delete_entry.Bind(1, entry_id).Run();
}

absl::StatusOr<int64_t> ArtifactStore::ReplaceEntryLocked(absl::string_view ns,
                                                         absl::string_view key,
                                                         std::vector<int64_t>& replaced_blob_ids,
                                                         bool& is_new) {
  Writer& w = *writer_;
  w.find_entry.BindText(1, ns).BindText(2, key);
  ASSIGN_OR_RETURN(bool exists, w.find_entry.Step());
  const int64_t old_entry = exists ? w.find_entry.ColumnInt(0) : -1;
  is_new = !exists;
  // The served index file and link of (ns, key) stay where they are (a lookup
  // as files rewrites the index): the new entry owns them.
  const int64_t index_disk_bytes = exists ? w.find_entry.ColumnInt(1) : 0;
  std::optional<std::string> link_extension;
  if (exists && !w.find_entry.ColumnIsNull(2)) link_extension = std::string(w.find_entry.ColumnText(2));
  std::optional<std::string> index_namespace;
  if (exists && !w.find_entry.ColumnIsNull(3)) index_namespace = std::string(w.find_entry.ColumnText(3));
  w.find_entry.Reset();
  if (exists) {
    RETURN_IF_ERROR(DeleteEntryLocked(old_entry, replaced_blob_ids));
  }
  w.insert_entry.BindText(1, ns).BindText(2, key).Bind(3, NowMillis()).Bind(4, ++use_clock_);
  w.insert_entry.Bind(5, index_disk_bytes);
  if (link_extension.has_value()) {
    w.insert_entry.BindText(6, *link_extension);
  } else {
    w.insert_entry.BindNull(6);
  }
  if (index_namespace.has_value()) {
    w.insert_entry.BindText(7, *index_namespace);
  } else {
    w.insert_entry.BindNull(7);
  }
  RETURN_IF_ERROR(w.insert_entry.Run());
  return w.db->LastInsertId();
}

absl::StatusOr<ArtifactStore::FreedBlobs> ArtifactStore::DeleteOrphanBlobsLocked(
    const std::vector<int64_t>& candidate_ids) {
  Writer& w = *writer_;
  FreedBlobs freed;
  for (int64_t blob_id : candidate_ids) {
    w.orphan_blob.Bind(1, blob_id);
    ASSIGN_OR_RETURN(bool orphaned, w.orphan_blob.Step());
    std::string digest;
    if (orphaned) {
      const auto stored_size = static_cast<uint64_t>(w.orphan_blob.ColumnInt(1));
      freed.bytes += stored_size;
      digest = std::string(w.orphan_blob.ColumnBlob(0));
      if (w.orphan_blob.ColumnInt(2) == kFile) {
        freed.file_bytes += OnDisk(stored_size);
        freed.files.push_back(BlobPath(digest));
      }
    }
    w.orphan_blob.Reset();
    if (!orphaned) continue;
    // Its served copies, from their records: deleting the blob row deletes them.
    std::vector<std::string> extensions;
    w.served_copies_of.Bind(1, blob_id);
    absl::StatusOr<bool> copy;
    while ((copy = w.served_copies_of.Step()).ok() && *copy) {
      extensions.emplace_back(w.served_copies_of.ColumnText(0));
      freed.served_bytes += static_cast<uint64_t>(w.served_copies_of.ColumnInt(1));
    }
    w.served_copies_of.Reset();
    RETURN_IF_ERROR(copy.status());
    if (!extensions.empty()) freed.served_copies.emplace_back(digest, std::move(extensions));
    RETURN_IF_ERROR(w.delete_blob.Bind(1, blob_id).Run());
    ++freed.blob_rows;
  }
  return freed;
}

void ArtifactStore::ReleaseFreedBlobs(const FreedBlobs& freed) {
  stored_bytes_ -= std::min<uint64_t>(freed.bytes, stored_bytes_.load());
  blob_count_ -= std::min<uint64_t>(freed.blob_rows, blob_count_.load());
  entry_count_ -= std::min<uint64_t>(freed.entries.size(), entry_count_.load());
  file_blob_bytes_ -= std::min<uint64_t>(freed.file_bytes, file_blob_bytes_.load());
  std::vector<ServedFiles::Leftover> leftovers;
  for (const fs::path& file : freed.files) {
    std::error_code error;
    // A file another process holds open (Windows) stays behind: it is
    // recorded and retried until its holder lets go.
    if (!fs::remove(file, error) && fs::exists(file, error)) {
      leftovers.push_back({file, platform::AllocatedBytes(file)});
    }
  }
  for (const auto& [digest, extensions] : freed.served_copies) {
    served_files_.Remove(digest, extensions, &leftovers);
  }
  for (const FreedBlobs::Entry& entry : freed.entries) {
    if (entry.index_namespace.has_value()) {
      served_files_.RemoveIndex(*entry.index_namespace, entry.key, entry.link_extension);
    }
  }
  for (const ServedFiles::Leftover& leftover : leftovers) RecordLeftoverLocked(leftover);
}

void ArtifactStore::RecordLeftoverLocked(const ServedFiles::Leftover& leftover) {
  spdlog::info("cache: {} is held open by another process; it is deleted once let go",
               leftover.path.string());
  leftover_bytes_ += leftover.disk_bytes;
  const std::string relative = leftover.path.lexically_relative(options_.data_dir).generic_string();
  if (absl::Status status = writer_->record_leftover.BindText(1, relative)
                                .Bind(2, static_cast<int64_t>(leftover.disk_bytes))
                                .Run();
      !status.ok()) {
    spdlog::warn("cache: {} not recorded for deletion: {}", leftover.path.string(),
                 status.message());
  }
}

void ArtifactStore::RemoveLeftoversLocked() {
  Writer& w = *writer_;
  std::vector<std::pair<std::string, uint64_t>> leftovers;
  absl::StatusOr<bool> row;
  while ((row = w.leftovers.Step()).ok() && *row) {
    leftovers.emplace_back(w.leftovers.ColumnText(0), static_cast<uint64_t>(w.leftovers.ColumnInt(1)));
  }
  w.leftovers.Reset();
  for (const auto& [relative, disk_bytes] : leftovers) {
    const fs::path path = options_.data_dir / fs::path(relative);
    // Stored or served again since under the same name (content-addressed):
    // the file is in use again, and counted where it is recorded now.
    const std::string name = path.filename().string();
    const std::string hex = name.substr(0, 2 * kSha256Size);
    bool in_use = false;
    if (hex.size() == 2 * kSha256Size && std::all_of(hex.begin(), hex.end(), absl::ascii_isxdigit)) {
      const std::string digest = absl::HexStringToBytes(hex);
      sqlite::Statement& recorded =
          name.size() == hex.size() ? w.file_blob_exists : w.served_copy_recorded;
      recorded.BindBlob(1, digest);
      if (name.size() != hex.size()) recorded.BindText(2, absl::string_view(name).substr(hex.size()));
      absl::StatusOr<bool> found = recorded.Step();
      recorded.Reset();
      in_use = found.ok() && *found;
    }
    std::error_code error;
    if (!in_use && !fs::remove(path, error) && fs::exists(path, error)) continue;  // still held
    leftover_bytes_ -= std::min(disk_bytes, leftover_bytes_.load());
    w.forget_leftover.BindText(1, relative).Run().IgnoreError();
  }
}

void ArtifactStore::DropCorruptBlob(absl::string_view digest, absl::string_view reason) {
  spdlog::error("cache: blob {} failed its integrity check ({}); dropping every entry that uses it",
                DigestHex(digest), reason);
  std::lock_guard lock(writer_mutex_);
  Writer& w = *writer_;
  auto drop = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(*w.db));
    std::vector<int64_t> blob_ids;
    std::vector<int64_t> entry_ids;
    w.entries_with_blob.BindBlob(1, digest);
    while (true) {
      ASSIGN_OR_RETURN(bool row, w.entries_with_blob.Step());
      if (!row) break;
      blob_ids.push_back(w.entries_with_blob.ColumnInt(0));
      if (!w.entries_with_blob.ColumnIsNull(1)) entry_ids.push_back(w.entries_with_blob.ColumnInt(1));
    }
    w.entries_with_blob.Reset();
    // Each entry goes as an evicted one does (its other blobs, its served index
    // entry); then the blob itself, which no entry uses any more.
    FreedBlobs freed;
    for (int64_t entry_id : entry_ids) RETURN_IF_ERROR(EvictEntryLocked(entry_id, freed));
    ASSIGN_OR_RETURN(FreedBlobs blob_freed, DeleteOrphanBlobsLocked(blob_ids));
    freed.Add(std::move(blob_freed));
    RETURN_IF_ERROR(txn.Commit());
    corrupt_entries_dropped_ += entry_ids.size();
    ReleaseFreedBlobs(freed);
    return absl::OkStatus();
  };
  if (absl::Status status = drop(); !status.ok()) {
    spdlog::error("cache: could not drop entries of corrupt blob {}: {}", DigestHex(digest),
                  status.message());
  }
}

absl::Status ArtifactStore::FlushTouches() {
  absl::flat_hash_map<int64_t, int64_t> touches;
  {
    std::lock_guard lock(touches_mutex_);
    touches.swap(pending_touches_);
  }
  if (touches.empty()) return absl::OkStatus();
  Writer& w = *writer_;
  ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(*w.db));
  for (const auto& [entry_id, last_use] : touches) {
    RETURN_IF_ERROR(w.touch_entry.Bind(1, entry_id).Bind(2, last_use).Run());
  }
  return txn.Commit();
}

absl::Status ArtifactStore::EvictEntryLocked(int64_t entry_id, FreedBlobs& freed) {
  Writer& w = *writer_;
  w.entry_name.Bind(1, entry_id);
  ASSIGN_OR_RETURN(bool named, w.entry_name.Step());
  if (named) {
    FreedBlobs::Entry entry{std::string(w.entry_name.ColumnText(0)),
                            std::string(w.entry_name.ColumnText(1)), std::nullopt, std::nullopt};
    if (!w.entry_name.ColumnIsNull(3)) entry.link_extension = std::string(w.entry_name.ColumnText(3));
    if (!w.entry_name.ColumnIsNull(4)) entry.index_namespace = std::string(w.entry_name.ColumnText(4));
    freed.served_bytes += static_cast<uint64_t>(w.entry_name.ColumnInt(2));
    freed.entries.push_back(std::move(entry));
  }
  w.entry_name.Reset();
  std::vector<int64_t> blob_ids;
  RETURN_IF_ERROR(DeleteEntryLocked(entry_id, blob_ids));
  ASSIGN_OR_RETURN(FreedBlobs entry_freed, DeleteOrphanBlobsLocked(blob_ids));
  freed.Add(std::move(entry_freed));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ArtifactStore::EvictBatchLocked(uint64_t target_bytes) {
  Writer& w = *writer_;
  ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(*w.db));
  std::vector<int64_t> candidates;
  w.least_recently_used.Bind(1, kEvictionBatch);
  while (true) {
    ASSIGN_OR_RETURN(bool row, w.least_recently_used.Step());
    if (!row) break;
    candidates.push_back(w.least_recently_used.ColumnInt(0));
  }
  w.least_recently_used.Reset();
  FreedBlobs freed;
  uint64_t evicted = 0;
  const uint64_t on_disk = DiskBytes();
  // Entry by entry, so eviction stops as soon as the store should fit the
  // target: each blob frees what it stored and its served copy. The caller
  // measures again after the batch.
  for (int64_t entry_id : candidates) {
    const uint64_t freeing = freed.bytes + freed.served_bytes;
    if (on_disk - std::min(on_disk, freeing) <= target_bytes) break;
    RETURN_IF_ERROR(EvictEntryLocked(entry_id, freed));
    ++evicted;
  }
  RETURN_IF_ERROR(txn.Commit());
  ReleaseFreedBlobs(freed);
  evicted_entries_ += evicted;
  // The pages of inline blobs go back to the file system. Not a failure of
  // the eviction when it cannot (a full disk): the next batch tries again.
  if (absl::Status status = w.db->Exec("PRAGMA incremental_vacuum"); !status.ok()) {
    spdlog::debug("cache: incremental_vacuum: {}", status.message());
  }
  return evicted;
}

absl::StatusOr<std::vector<ArtifactStore::ListedEntry>> ArtifactStore::ListEntries(
    absl::string_view ns_prefix, absl::Time since, int64_t after_id, size_t limit) {
  std::lock_guard lock(writer_mutex_);
  // Every namespace with the prefix sorts in [prefix, prefix + U+FFFF-ish):
  // namespaces are printable ASCII, so "\x7f" ends the range.
  const std::string from(ns_prefix);
  const std::string to = absl::StrCat(ns_prefix, "\x7f");
  sqlite::Statement& page = writer_->entries_after;
  page.BindText(1, from).BindText(2, to).Bind(3, absl::ToUnixMillis(since)).Bind(4, after_id);
  page.Bind(5, static_cast<int64_t>(limit));
  std::vector<ListedEntry> entries;
  absl::StatusOr<bool> row;
  while ((row = page.Step()).ok() && *row) {
    entries.push_back({page.ColumnInt(0), std::string(page.ColumnText(1)),
                       std::string(page.ColumnText(2)), absl::FromUnixMillis(page.ColumnInt(3))});
  }
  page.Reset();
  RETURN_IF_ERROR(row.status());
  return entries;
}

absl::StatusOr<uint64_t> ArtifactStore::DomainBytes(absl::string_view domain) {
  std::lock_guard lock(writer_mutex_);
  return DomainBytesLocked(domain);
}

absl::StatusOr<uint64_t> ArtifactStore::DomainBytesLocked(absl::string_view domain) {
  const auto [from, to] = DomainRange(domain);
  sqlite::Statement& bytes = writer_->bytes_in_range;
  bytes.BindText(1, from).BindText(2, to);
  absl::StatusOr<bool> row = bytes.Step();
  const uint64_t total = row.ok() && *row ? static_cast<uint64_t>(bytes.ColumnInt(0)) : 0;
  bytes.Reset();
  RETURN_IF_ERROR(row.status());
  return total;
}

absl::StatusOr<uint64_t> ArtifactStore::EnforceDomainCaps() {
  absl::flat_hash_set<std::string> domains;
  {
    std::lock_guard lock(maintenance_mutex_);
    domains.swap(domains_put_to_);
  }
  uint64_t evicted = 0;
  for (const std::string& domain : domains) {
    std::lock_guard lock(writer_mutex_);
    RETURN_IF_ERROR(FlushTouches());  // the LRU order as lookups left it
    ASSIGN_OR_RETURN(uint64_t held, DomainBytesLocked(domain));
    if (held <= options_.max_domain_bytes) continue;
    // Below the cap, not just to it, so the next put does not evict again.
    ASSIGN_OR_RETURN(uint64_t went,
                     EvictDomainLocked(domain, held, options_.max_domain_bytes / 10 * 9));
    spdlog::info("cache: {} held {} bytes, over its cap of {}: evicted its {} least recently "
                 "used entries",
                 domain, held, options_.max_domain_bytes, went);
    evicted += went;
  }
  return evicted;
}

absl::StatusOr<uint64_t> ArtifactStore::EvictDomainLocked(absl::string_view domain, uint64_t held,
                                                          uint64_t target_bytes) {
  Writer& w = *writer_;
  const auto [from, to] = DomainRange(domain);
  ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(*w.db));
  FreedBlobs freed;
  uint64_t evicted = 0;
  while (held > target_bytes) {
    std::vector<int64_t> candidates;
    w.least_recently_used_in_range.BindText(1, from).BindText(2, to).Bind(3, kEvictionBatch);
    while (true) {
      ASSIGN_OR_RETURN(bool row, w.least_recently_used_in_range.Step());
      if (!row) break;
      candidates.push_back(w.least_recently_used_in_range.ColumnInt(0));
    }
    w.least_recently_used_in_range.Reset();
    if (candidates.empty()) break;
    for (int64_t entry_id : candidates) {
      if (held <= target_bytes) break;
      w.entry_bytes.Bind(1, entry_id);
      ASSIGN_OR_RETURN(bool row, w.entry_bytes.Step());
      const uint64_t entry_bytes = row ? static_cast<uint64_t>(w.entry_bytes.ColumnInt(0)) : 0;
      w.entry_bytes.Reset();
      RETURN_IF_ERROR(EvictEntryLocked(entry_id, freed));
      held -= std::min(held, entry_bytes);
      ++evicted;
    }
  }
  RETURN_IF_ERROR(txn.Commit());
  ReleaseFreedBlobs(freed);
  evicted_entries_ += evicted;
  return evicted;
}

absl::StatusOr<uint64_t> ArtifactStore::EvictToSize(uint64_t target_bytes) {
  {
    // Files whose holders let go since: they free space before any entry goes.
    std::lock_guard lock(writer_mutex_);
    RemoveLeftoversLocked();
  }
  absl::StatusOr<uint64_t> evicted = EvictBatchesToSize(target_bytes);
  if (absl::IsResourceExhausted(evicted.status())) {
    // The transaction found no room to write in: give it the reserve's.
    std::error_code error;
    if (fs::remove(options_.data_dir / kReserveFile, error)) {
      spdlog::warn("cache: the disk is full; evicting with the space kept in reserve for it");
      evicted = EvictBatchesToSize(target_bytes);
    }
  }
  EnsureSpaceReserve();
  return evicted;
}

absl::StatusOr<uint64_t> ArtifactStore::EvictBatchesToSize(uint64_t target_bytes) {
  uint64_t evicted = 0;
  while (!stop_requested_.load()) {
    // The lock is taken per batch so puts and corrupt-blob drops interleave;
    // lookups never wait for it (WAL readers see the last committed state).
    std::lock_guard lock(writer_mutex_);
    // The WAL cut to nothing first (when no reader is in it; best effort), so
    // that what it held, the last batch's pages, is not taken for entries to evict.
    writer_->db->Exec("PRAGMA wal_checkpoint(TRUNCATE)").IgnoreError();
    if (DiskBytes() <= target_bytes) break;
    RETURN_IF_ERROR(FlushTouches());
    ASSIGN_OR_RETURN(uint64_t batch, EvictBatchLocked(target_bytes));
    if (batch == 0) break;
    evicted += batch;
  }
  if (evicted > 0) {
    spdlog::info("cache: evicted {} least recently used entries; {} bytes on disk", evicted,
                 DiskBytes());
  }
  return evicted;
}

bool ArtifactStore::RemoveOrphanFiles() {
  std::error_code error;
  const fs::path blob_root = options_.data_dir / "blobs";
  for (auto it = fs::recursive_directory_iterator(blob_root, error);
       it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (stop_requested_.load()) return false;
    const fs::directory_entry& file = *it;
    if (!file.is_regular_file() || file.path().parent_path().filename() == "tmp") continue;
    const std::string name = file.path().filename().string();
    if (name.size() != 2 * kSha256Size || !std::all_of(name.begin(), name.end(), absl::ascii_isxdigit)) {
      continue;
    }
    const std::string digest = absl::HexStringToBytes(name);
    std::lock_guard lock(writer_mutex_);
    sqlite::Statement& exists = writer_->file_blob_exists;
    exists.BindBlob(1, digest);
    absl::StatusOr<bool> row = exists.Step();
    exists.Reset();
    if (row.ok() && !*row) fs::remove(file.path(), error);
  }
  return served_files_.RemoveOrphans(
      [this](absl::string_view digest, absl::string_view extension) {
        std::lock_guard lock(writer_mutex_);
        sqlite::Statement& recorded = writer_->served_copy_recorded;
        recorded.BindBlob(1, digest).BindText(2, extension);
        absl::StatusOr<bool> row = recorded.Step();
        recorded.Reset();
        return !row.ok() || *row;  // keep what cannot be checked
      },
      [this] { return stop_requested_.load(); });
}

void ArtifactStore::RetireUnrecordedServedFiles() {
  std::error_code error;
  const fs::path retired = options_.data_dir / kRetiredDir;
  fs::create_directories(retired, error);
  const fs::path served = served_files_.dir();
  int moved = 0;
  for (const fs::directory_entry& tree : fs::directory_iterator(served, error)) {
    if (tree.path() == served_files_.hits_dir()) continue;
    // One rename a directory: instant however many files they hold. One that
    // cannot move (a file in it held open, on Windows) is left to the sweep.
    fs::rename(tree.path(), retired / absl::StrCat(moved++, "-", tree.path().filename().string()),
               error);
  }
  spdlog::info("cache: served files of the previous version moved to {} to be deleted; local "
               "clients ask kilnd once per entry until it serves them again",
               retired.string());
}

void ArtifactStore::DeleteRetiredFiles() {
  platform::LowerCurrentThreadPriority();
  std::error_code error;
  const fs::path retired = options_.data_dir / kRetiredDir;
  // Files first, then the directories, deepest first; each step looks for a stop.
  std::vector<fs::path> directories;
  for (auto it = fs::recursive_directory_iterator(retired, error);
       it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (stop_requested_.load()) return;
    if (it->is_directory(error) && !it->is_symlink(error)) {
      directories.push_back(it->path());
    } else {
      fs::remove(it->path(), error);
    }
  }
  for (auto dir = directories.rbegin(); dir != directories.rend(); ++dir) fs::remove(*dir, error);
  fs::remove(retired, error);
}

void ArtifactStore::MaintenanceLoop() {
  if (sweep_orphans_) {
    spdlog::info("cache: the last kilnd did not stop cleanly; sweeping files it left unrecorded");
    if (!RemoveOrphanFiles()) return;  // stopped: the next start sweeps again
    sweep_orphans_ = false;
  }
  std::unique_lock lock(maintenance_mutex_);
  while (!stopping_) {
    maintenance_wakeup_.wait_for(lock, absl::ToChronoMilliseconds(options_.lru_flush_interval),
                                 [this] { return stopping_ || eviction_needed_; });
    if (stopping_) break;
    eviction_needed_ = false;
    lock.unlock();
    MeasureUnrecordedBytes();
    CollectJournaledHits();
    if (absl::StatusOr<uint64_t> evicted = EnforceDomainCaps(); !evicted.ok()) {
      spdlog::error("cache: eviction of a domain over its cap failed: {}",
                    evicted.status().message());
    }
    {
      std::lock_guard writer_lock(writer_mutex_);
      if (absl::Status status = FlushTouches(); !status.ok()) {
        spdlog::warn("cache: cannot record last-use times: {}", status.message());
      }
      RemoveLeftoversLocked();
    }
    if (DiskBytes() > options_.max_size_bytes) {
      // Evict below the cap, not just to it, so the next put does not evict again.
      const uint64_t target = options_.max_size_bytes / 10 * 9;
      if (absl::StatusOr<uint64_t> evicted = EvictToSize(target); !evicted.ok()) {
        spdlog::error("cache: eviction failed: {}", evicted.status().message());
      }
    }
    lock.lock();
  }
}

absl::StatusOr<ArtifactStore::VerifyReport> ArtifactStore::VerifyAll() {
  VerifyReport report;
  std::vector<std::pair<std::string, std::string>> broken;  // digest, reason
  {
    ASSIGN_OR_RETURN(ReaderLease reader, AcquireReader());
    // One read transaction: blobs dropped meanwhile by eviction are not seen.
    ASSIGN_OR_RETURN(sqlite::Statement all,
                     reader->db->Prepare("SELECT digest, size, codec, location, data FROM blobs"));
    while (!stop_requested_.load()) {
      ASSIGN_OR_RETURN(bool row, all.Step());
      if (!row) break;
      ++report.blobs_checked;
      const std::string digest(all.ColumnBlob(0));
      absl::StatusOr<std::string> content =
          ReadBlobContent(all.ColumnInt(2), all.ColumnInt(3), all.ColumnBlob(4), digest,
                          static_cast<uint64_t>(all.ColumnInt(1)), IntegrityCheck::kHashEverything);
      if (!content.ok()) broken.emplace_back(digest, std::string(content.status().message()));
    }
  }
  for (const auto& [digest, reason] : broken) DropCorruptBlob(digest, reason);
  report.corrupt_blobs = broken.size();
  return report;
}

absl::StatusOr<StoreStats> ArtifactStore::Stats() {
  CollectJournaledHits();
  StoreStats stats;
  stats.hits = hits_.load();
  stats.misses = misses_.load();
  stats.puts = puts_.load();
  stats.evicted_entries = evicted_entries_.load();
  stats.corrupt_entries_dropped = corrupt_entries_dropped_.load();
  {
    // Between writes where it can: a checkpoint moves the WAL's pages into the
    // database file, and sizing the two while it runs can miss pages in
    // flight. Never waiting for one: an eviction holds the writer batch after
    // batch, and stats must answer meanwhile.
    std::unique_lock lock(writer_mutex_, std::try_to_lock);
    stats.stored_bytes = stored_bytes_.load();
    stats.disk_bytes = DiskBytes();
  }
  stats.max_size_bytes = options_.max_size_bytes;
  stats.puts_refused_disk_full = puts_refused_disk_full_.load();
  {
    std::lock_guard lock(disk_full_mutex_);
    stats.disk_full_since = disk_full_since_;
  }
  {
    std::lock_guard lock(namespace_stats_mutex_);
    stats.lookups_by_namespace.insert(lookups_by_namespace_.begin(), lookups_by_namespace_.end());
  }
  // Kept as rows come and go: counting a million rows takes a tenth of a second.
  stats.entries = entry_count_.load();
  stats.blobs = blob_count_.load();
  return stats;
}

}  // namespace kiln::cache
