#ifndef KILN_CACHE_ARTIFACT_STORE_H_
#define KILN_CACHE_ARTIFACT_STORE_H_

// The artifact cache: entries indexed by (namespace, key), each a manifest of
// named, content-addressed blobs. One SQLite database indexes everything.
//
// On disk, under the data directory:
//   kiln.db (+ -wal, -shm)   the index; PRAGMA user_version = schema version
//   blobs/<hh>/<64 hex>      blobs whose stored size reaches the inline
//                            threshold; named by the SHA-256 of their content,
//                            so paths stay short (about 80 characters past the
//                            data directory) and are written once
//   blobs/tmp/               files being written; never referenced by the index
//   files/<h>/<64 hex><ext>  blobs as plain files for local clients (served_files.h)
// Small blobs live inline in the database. A blob is stored zstd-compressed
// when that saves space. Its digest is always of the uncompressed content and
// is checked on every read.
//
// ArtifactStore's members are defined by job in artifact_store.cc and the
// store_*.cc files beside it; artifact_store_internal.h says which holds what.
// The parts it ties together (eviction, the index's rows, blob files, served
// files, accounting) each have a header of their own in cache/.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/blob_storage.h"
#include "cache/group_commit.h"
#include "cache/hit_journal.h"
#include "cache/index_readers.h"
#include "cache/lru_policy.h"
#include "cache/maintenance_schedule.h"
#include "cache/served_files.h"
#include "cache/store_accounting.h"
#include "cache/wal_checkpointer.h"
#include "common/platform.h"

namespace kiln::sqlite {
class Database;
class Statement;
}

namespace kiln::cache {

class Evictor;  // evictor.h

// Blobs whose stored size is below this stay inline in SQLite. Chosen by
// measurement (build/bench/inline_threshold_bench, median lookup, 2-core
// Debian 12 machine): inline is faster up to 32 KiB (1.11x at 32 KiB), files
// are faster from 64 KiB (1.12x at 64 KiB, 2.1x at 1 MiB) and keep the WAL small.
inline constexpr uint64_t kDefaultInlineThreshold = 48 * 1024;

// The blob Kiln's client stores beside a Triton kernel with the inputs of its
// key, for `kiln prewarm` and export (which read it through Lookup): no client
// reads it as a file, so it is never served as one, nor listed in a served
// index entry.
inline constexpr absl::string_view kKeyInputsBlob = "kiln.key-inputs.json";

struct BlobInput {
  std::string name;
  std::string data;
  // Raw 32-byte SHA-256 the sender claims for `data`; empty to skip the check.
  std::string expected_digest;
};

struct StoredBlob {
  std::string name;
  std::string digest;  // raw 32-byte SHA-256 of the content
  uint64_t size = 0;
  // What a put's `stored` names this blob by where the store does not key it
  // by `digest` (a small blob no local client has read as a file); else empty.
  std::string store_key;
  // Absent when the caller listed the digest as one it already has, or when
  // the blob is served as `file`.
  std::optional<std::string> data;
  // A lookup `as_files`: the served file holding the content.
  std::optional<std::filesystem::path> file;
};

struct CacheEntry {
  std::vector<StoredBlob> blobs;  // sorted by name
  absl::Time created;
};

struct StoreOptions {
  std::filesystem::path data_dir;
  // What the data directory may hold on disk (StoreStats::disk_bytes): past
  // it, least recently used entries go.
  uint64_t max_size_bytes = 10ull << 30;
  uint64_t inline_threshold_bytes = kDefaultInlineThreshold;
  int zstd_level = 1;  // 0 stores blobs uncompressed
  absl::Duration busy_timeout = absl::Seconds(10);
  // How often recorded lookups are written to the LRU column.
  // A blob file that last changed at least this long before a lookup checked
  // its content is trusted from then on while its stamp is unchanged (no
  // hashing on read); younger files are hashed on every read, because a
  // change within the file system's time tick could keep their stamp.
  absl::Duration trust_files_changed_before = absl::Seconds(2);
  absl::Duration lru_flush_interval = absl::Seconds(2);
  // How long the served copies of a blob that went stay on disk (counted),
  // for a local client that found them in the served index just before to
  // read them; its index entry and link go at once.
  absl::Duration served_copy_grace = absl::Seconds(2);
  // Accounts besides this one that may read served files (Windows: the users
  // a machine service serves; see platform::EnsurePrivateDirectory).
  std::vector<std::string> served_file_readers;
  // Trust domains (a namespace's part before its first '/') starting with
  // `capped_domain_prefix` may hold at most `max_domain_bytes` (0: no cap):
  // beyond it the domain's own least recently used entries go, within
  // lru_flush_interval of the put, so that it cannot evict another's.
  // An entry counts the stored size of each blob it names.
  std::string capped_domain_prefix;
  uint64_t max_domain_bytes = 0;
  // What a client namespace in the served files' index is stored under
  // (kilnd's own account's trust domain, "local/"): hits that clients journal
  // (hit_journal.h) count for `served_namespace_prefix` + their namespace.
  std::string served_namespace_prefix;
};

struct StoreStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t puts = 0;
  uint64_t evicted_entries = 0;
  uint64_t corrupt_entries_dropped = 0;
  uint64_t entries = 0;
  uint64_t blobs = 0;
  uint64_t stored_bytes = 0;  // the blobs' bytes, after compression
  // What the data directory holds on disk: blob files, served copies and
  // their index, the database and its WAL. What max_size_bytes bounds.
  uint64_t disk_bytes = 0;
  uint64_t max_size_bytes = 0;
  // Puts refused because the disk was full (compiles served, not stored), and
  // since when the disk is full (nullopt once a put succeeds again).
  uint64_t puts_refused_disk_full = 0;
  std::optional<absl::Time> disk_full_since;
  // Lookups by namespace since the store opened: namespace -> {hits, misses}.
  std::map<std::string, std::pair<uint64_t, uint64_t>> lookups_by_namespace;
};

class ArtifactStore {
 public:
  // Opens or creates the store in options.data_dir. FAILED_PRECONDITION when the
  // directory or database cannot be used, or was written by a newer schema.
  static absl::StatusOr<std::unique_ptr<ArtifactStore>> Open(StoreOptions options);
  ~ArtifactStore();
  ArtifactStore(const ArtifactStore&) = delete;
  ArtifactStore& operator=(const ArtifactStore&) = delete;

  // How a lookup hands blobs to a local client that reads files itself.
  struct AsFiles {
    // Also index the entry in this (the client's) namespace, so that local
    // clients find it without asking (ServedFiles::PublishIndex); empty: not.
    std::string index_namespace;
  };

  // The entry for (ns, key). Blobs whose digest is in `digests_to_skip` come
  // back without data; with `as_files`, blobs come back as served files
  // (paths for a local client to read) where they can, with data otherwise.
  // NOT_FOUND on a miss, including when a blob fails its integrity check (the
  // entry is then dropped and the error logged).
  absl::StatusOr<CacheEntry> Lookup(absl::string_view ns, absl::string_view key,
                                    const absl::flat_hash_set<std::string>& digests_to_skip = {},
                                    const AsFiles* as_files = nullptr);

  // Writes the served files (and index entry) of (ns, key) ahead of a local
  // client's lookup, e.g. right after storing what it compiled. Not counted
  // as a lookup. NOT_FOUND as Lookup.
  absl::Status ServeAsFiles(absl::string_view ns, absl::string_view key, const AsFiles& as_files);

  // Hits a client served from its own copies of entries it got earlier:
  // counted in the stats and kept fresh for the LRU as lookups are. Keys no
  // longer stored are skipped. Returns how many were recorded.
  absl::StatusOr<uint64_t> RecordHits(absl::string_view ns, const std::vector<std::string>& keys);

  // Stores (or replaces) the entry for (ns, key): `blobs` with their data, and
  // `stored` naming blobs already in the store, which cost no blob I/O (an
  // alias of another entry is only `stored`). Small blobs of `blobs` are
  // stored as rows of this entry's, not shared with equal ones stored before.
  // INVALID_ARGUMENT for no blobs, duplicate or empty names, or data that does
  // not match its expected digest; FAILED_PRECONDITION if a `stored` blob is
  // not stored (e.g. evicted meanwhile); RESOURCE_EXHAUSTED when the disk is
  // full. Returns the manifest of `blobs`: each one's name, digest, size and
  // store_key, no data.
  // A blob already stored, under `name` in the new entry: found by the
  // store_key a manifest or lookup gave it, or (none, or its row was keyed
  // by content since, as a first read as a file does) by its raw digest.
  struct BlobReference {
    std::string name;
    std::string digest;
    std::string store_key;
  };
  using BlobReferences = std::vector<BlobReference>;
  absl::StatusOr<std::vector<StoredBlob>> Put(absl::string_view ns, absl::string_view key,
                                              std::vector<BlobInput> blobs,
                                              const BlobReferences& stored = {});
  // Stores many entries as Put stores each, sharing commits: what bulk writers
  // (an import, a farm's sync) send, so that a call's and a commit's costs
  // are shared by many entries. Each entry is stored or refused on its own;
  // returns each one's status, in order.
  struct EntryInput {
    std::string ns;
    std::string key;
    std::vector<BlobInput> blobs;
  };
  std::vector<absl::Status> PutMany(std::vector<EntryInput> entries);
  // An import's PutMany (a bundle's entries): an entry stored already is kept
  // as it is, unless `replace` and its blobs differ, and `imported_as` says
  // how each went. Each entry stored is journaled under `id` until
  // FinishImport(id); AbandonImport(id), or the first open after a stop cut
  // the import short, removes them: the import's entries are stored all or none.
  struct ImportMode {
    int64_t id = 0;
    bool replace = false;
  };
  enum class ImportedAs { kStored, kUnchanged, kConflict, kReplaced };
  std::vector<absl::Status> PutMany(std::vector<EntryInput> entries, const ImportMode* import,
                                    std::vector<ImportedAs>* imported_as);
  // The import's entries stay: their journal goes.
  absl::Status FinishImport(int64_t import_id);
  // Removes the entries the import stored, a batch a transaction, until
  // none is left or a stop (the next open takes back the rest). Returns how
  // many went.
  absl::StatusOr<uint64_t> AbandonImport(int64_t import_id);

  // The entries whose namespace starts with `ns_prefix`, created at or after
  // `since`, in the order they were stored, a page at a time: those after
  // `after_id` (0: from the first), at most `limit`. What an export bundles.
  struct ListedEntry {
    int64_t id = 0;  // the `after_id` of the next page
    std::string ns;
    std::string key;
    absl::Time created;
  };
  absl::StatusOr<std::vector<ListedEntry>> ListEntries(absl::string_view ns_prefix, absl::Time since,
                                                       int64_t after_id, size_t limit);

  // The bytes trust domain `domain`'s entries hold (see max_domain_bytes).
  absl::StatusOr<uint64_t> DomainBytes(absl::string_view domain);
  // Evicts the least recently used entries of every capped domain a put went
  // over its cap since the last call (the maintenance thread calls it too),
  // a batch a transaction so that puts interleave, until a stop is requested
  // (the domains left are looked at again on the next call). Returns how many
  // entries went.
  absl::StatusOr<uint64_t> EnforceDomainCaps();

  // Counts the hits clients journaled since the last collection (which the
  // maintenance thread runs every lru_flush_interval). Returns how many.
  uint64_t CollectJournaledHits();

  // Collects journaled hits first, so the counts include every client that exited.
  absl::StatusOr<StoreStats> Stats();

  // Where blobs are served as files (served_files.h).
  const std::filesystem::path& served_files_dir() const { return served_files_.dir(); }

  // Evicts least recently used entries until the data directory holds at
  // most `target_bytes` on disk (StoreStats::disk_bytes). Works on a full
  // disk: it gives up the space reserve (StoreAccounting) to do so. Returns how
  // many entries went.
  absl::StatusOr<uint64_t> EvictToSize(uint64_t target_bytes);
  // Waits until the served copies of blobs that went so far are past their
  // grace (options_.served_copy_grace), or a stop, and removes them: an
  // operator's eviction (kiln gc) reports, and leaves, their space freed.
  void RemoveServedCopiesGone();

  // StoreStats::disk_bytes.
  uint64_t DiskBytes() const { return accounting_.DiskBytes(served_files_.bytes()); }
  // StoreStats::stored_bytes, without Stats()'s counting of rows.
  uint64_t StoredBytes() const { return accounting_.stored_bytes(); }

  // Ends eviction, sweeps and VerifyAll at their next step, ahead of the
  // destructor: kilnd calls it as soon as it is asked to stop, before it waits
  // for in-flight calls, so that none of them keeps it from stopping.
  void RequestStop();
  bool stop_requested() const { return stop_requested_.load(); }

  struct VerifyReport {
    uint64_t blobs_checked = 0;
    uint64_t corrupt_blobs = 0;  // their entries were dropped
  };
  // Reads and re-hashes every stored blob; a corrupt or missing one is
  // dropped with every entry that uses it, as a lookup would.
  absl::StatusOr<VerifyReport> VerifyAll();

 private:
  struct Writer;
  struct ServedWrites;
  struct BrokenBlob;

  explicit ArtifactStore(StoreOptions options);
  absl::Status Initialize();

  struct ReadResult {
    CacheEntry entry;
    int64_t entry_id = -1;
  };
  // Lookup without counting it; drops the entry if a blob is corrupt.
  absl::StatusOr<ReadResult> ReadEntry(absl::string_view ns, absl::string_view key,
                                       const absl::flat_hash_set<std::string>& digests_to_skip,
                                       const AsFiles* as_files);
  // Writes the served index entry of a read entry; what it wrote, to record.
  std::optional<ServedFiles::IndexFootprint> IndexServedEntry(const AsFiles& as_files,
                                                              absl::string_view key,
                                                              const CacheEntry& entry);
  // Records the served files a lookup of (ns, key) wrote; removes those whose
  // blob or entry went meanwhile.
  void RecordServedWrites(absl::string_view ns, absl::string_view key, const ServedWrites& writes);

  // Sets `blob.file` to its served file, writing the file first if needed;
  // otherwise (a name that cannot be a file, a file held open with other
  // content) sets `blob.data`. Fails only when the blob's content is corrupt.
  absl::Status ServeAsFile(StoredBlob& blob, int64_t codec, BlobLocation location,
                           absl::string_view inline_data, ServedWrites& writes);
  // Methods named *Locked run with writer_mutex_ held.
  struct QueuedPut;
  // Checks an entry's names before anything of it is prepared.
  static absl::Status ValidateEntry(absl::string_view ns, absl::string_view key,
                                    const std::vector<BlobInput>& blobs, const BlobReferences& stored);
  // Hashes, compresses and (when large) writes each blob to a temp file.
  absl::StatusOr<std::vector<PreparedBlob>> PrepareBlobs(std::vector<BlobInput> blobs);
  // Stores puts[first, end) in transactions shared with the puts queued
  // beside them (group commit); each one's `result` says how it went.
  void CommitInGroup(std::vector<QueuedPut>& puts, size_t first, size_t end);
  // After puts[first, end) were committed: those stored are counted, and
  // their domains' caps and the store's are checked.
  void NoteEntriesStored(const std::vector<QueuedPut>& puts, size_t first, size_t end);
  void CommitGroupLocked(const std::vector<QueuedPut*>& group);
  // One put's rows, within the group's transaction.
  absl::Status PutInTransactionLocked(QueuedPut& put);
  // How an import's entry of `blobs` goes, by the entry stored under (ns, key).
  absl::StatusOr<ImportedAs> ImportedAsLocked(absl::string_view ns, absl::string_view key,
                                              const std::vector<PreparedBlob>& blobs,
                                              bool replace);
  // Takes back the entries of the imports that a stop or a crash cut short,
  // as the open found them (the maintenance thread). Only those: an import
  // begun since, before the thread got there, is no earlier run's.
  void AbandonUnfinishedImports();
  void RemovePublishedFiles(const QueuedPut& put);
  // Replaces (ns, key) with a new, empty entry; returns its id and the blob
  // ids the old one used, to be checked for orphans before commit.
  absl::StatusOr<int64_t> ReplaceEntryLocked(absl::string_view ns, absl::string_view key,
                                             std::vector<int64_t>& replaced_blob_ids, bool& is_new);
  void DropCorruptBlob(const BrokenBlob& blob);
  // Writes the uses lookups recorded (lru_) to the index's LRU column.
  absl::Status FlushTouches();
  void CountLookup(absl::string_view ns, bool hit);
  void MaintenanceLoop();
  // At a stop: the LRU order, and the totals and clean-stop mark the next open reads.
  void SaveStateAtStop();
  // Removes the files a killed kilnd left unrecorded; false when stopped.
  bool RemoveOrphanFiles();
  // A version 1 store's served files, which it never recorded, move to
  // <data dir>/retired, which DeleteRetiredFiles empties in the background.
  void RetireUnrecordedServedFiles();
  void DeleteRetiredFiles();

  const StoreOptions options_;
  // Hears of the writer's commits until the destructor's last one, then goes.
  std::unique_ptr<WalCheckpointer> checkpointer_;
  std::unique_ptr<Writer> writer_;  // guarded by writer_mutex_
  std::mutex writer_mutex_;
  // Eviction's loops, on the writer's parts: goes before the writer.
  std::unique_ptr<Evictor> evictor_;
  // Puts share transactions (CommitInGroup), each group committed with the
  // writer held.
  GroupCommit<QueuedPut> group_commit_;

  // Lookups' connections, which never wait for the writer. Closed before the
  // writer's, which is the last and so checkpoints the WAL.
  IndexReaders readers_;


  // Lookups record entry ids here; the maintenance thread writes them to the
  // LRU column in one transaction, so a hit never waits for the writer.
  LruPolicy lru_;

  std::mutex namespace_stats_mutex_;
  absl::flat_hash_map<std::string, std::pair<uint64_t, uint64_t>> lookups_by_namespace_;
  // Blobs' bytes: encoded, inline or in files, read back checked.
  BlobStorage blobs_;

  ServedFiles served_files_;
  HitJournal hit_journal_;

  // What the store holds and takes on disk, the reserve, disk-full episodes.
  StoreAccounting accounting_;
  // What the data directory holds beside what the store's parts count.
  void MeasureUnrecordedBytes();
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> misses_{0};
  std::atomic<uint64_t> puts_{0};
  std::atomic<uint64_t> corrupt_entries_dropped_{0};

  // Set once kilnd stops: every long loop (eviction, sweeps, verify) ends at
  // its next step, so that a stop takes no longer than one batch.
  std::atomic<bool> stop_requested_{false};
  // The last kilnd did not stop cleanly, and the sweep has not finished: a
  // stop now is not clean either.
  std::atomic<bool> sweep_orphans_{false};
  std::thread retired_files_thread_;

  // When the maintenance thread's next round is due, and the capped domains
  // puts went to since EnforceDomainCaps last looked.
  MaintenanceSchedule maintenance_schedule_;
  std::thread maintenance_thread_;
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_ARTIFACT_STORE_H_
