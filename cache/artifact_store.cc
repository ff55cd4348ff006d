// The artifact store's open and close, lookups and hits, puts with their
// group commit, a corrupt blob's entries dropped, and stats. Its other jobs
// have files of their own (artifact_store_internal.h lists them), and its
// parts headers of their own (eviction is evictor.h; how entries and their
// files go, entry_removal.h).

#include "cache/artifact_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cache/artifact_store_internal.h"
#include "cache/disk_usage.h"
#include "cache/evictor.h"
#include "cache/sqlite.h"
#include "common/fmt_absl.h"
#include "common/platform.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;
using store_internal::kRetiredDir;
using store_internal::OpenedIndex;
using store_internal::OpenIndex;

// Written when the store closes cleanly, removed when it opens: missing at an
// open, the last kilnd was killed and may have left files it never recorded.
constexpr char kCleanStopFile[] = "clean-stop";

// Puts one group commit takes at most: a bulk writer's thousands go in
// transactions of about 25 ms, so an eviction batch or a lone put waits for
// no more than one.
constexpr size_t kPutsPerCommit = 512;

int64_t NowMillis() { return absl::ToUnixMillis(absl::Now()); }

// "tenant:alpha" of "tenant:alpha/triton": the trust domain a namespace is in.
absl::string_view DomainOf(absl::string_view ns) { return ns.substr(0, ns.find('/')); }

}  // namespace

ArtifactStore::ArtifactStore(StoreOptions options)
    : options_(std::move(options)),
      group_commit_(kPutsPerCommit,
                    [this](const std::vector<QueuedPut*>& group) {
                      std::lock_guard writer_lock(writer_mutex_);
                      CommitGroupLocked(group);
                    }),
      readers_(options_.data_dir / "kiln.db", options_.busy_timeout),
      blobs_({options_.data_dir, options_.inline_threshold_bytes, options_.zstd_level,
              options_.trust_files_changed_before}),
      served_files_(options_.data_dir / "files", options_.trust_files_changed_before),
      hit_journal_(served_files_.hits_dir()),
      accounting_(options_.data_dir),
      maintenance_schedule_(options_.lru_flush_interval) {}

void ArtifactStore::RequestStop() {
  stop_requested_ = true;
  maintenance_schedule_.Stop();
}

ArtifactStore::~ArtifactStore() {
  RequestStop();
  if (maintenance_thread_.joinable()) maintenance_thread_.join();
  if (retired_files_thread_.joinable()) retired_files_thread_.join();
  SaveStateAtStop();
  // Not while holding the writer: its thread may be waiting for it.
  checkpointer_.reset();
}

void ArtifactStore::SaveStateAtStop() {
  std::lock_guard lock(writer_mutex_);
  if (writer_) {
    writer_->removal.RemoveCopiesPastGrace(/*all=*/true);
    if (absl::Status status = FlushTouches(); !status.ok()) {
      spdlog::warn("cache: last-use times not saved at shutdown: {}", status.message());
    }
    // Every file written is recorded by now: the next start need not sweep,
    // nor count what these totals say.
    if (!sweep_orphans_.load()) {
      absl::Status saved = accounting_.SaveTotals(*writer_->db, served_files_.file_bytes(),
                                                  static_cast<uint64_t>(lru_.clock()));
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
  RETURN_IF_ERROR(blobs_.Initialize());
  std::error_code error;
  auto writer = std::make_unique<Writer>(options_, accounting_, blobs_, served_files_);
  ASSIGN_OR_RETURN(OpenedIndex index,
                   OpenIndex(options_.data_dir / "kiln.db", options_.busy_timeout,
                             [this] { RetireUnrecordedServedFiles(); }));
  writer->db = std::move(index.db);
  // The writer deletes what the schema's foreign keys would cascade to itself
  // (EntryRows::Delete, EntryRemoval::DeleteOrphanBlobs), knowing when there is
  // nothing to delete: enforced, each evicted blob cost two more index probes
  // (its entry_blobs, which the orphan check had just looked at, and its
  // served copies, which few blobs have), a fifth of eviction's time.
  RETURN_IF_ERROR(writer->db->Exec("PRAGMA foreign_keys = OFF"));
  ASSIGN_OR_RETURN(checkpointer_,
                   WalCheckpointer::Start(options_.data_dir / "kiln.db", options_.busy_timeout,
                                          store_internal::WalCheckpointPages(options_.max_size_bytes), *writer->db,
                                          writer_mutex_));
  const int64_t found_version = index.found_version;
  sqlite::Database& db = *writer->db;
  ASSIGN_OR_RETURN(writer->begin_put, db.Prepare("SAVEPOINT put"));
  ASSIGN_OR_RETURN(writer->undo_put, db.Prepare("ROLLBACK TO put"));
  ASSIGN_OR_RETURN(writer->end_put, db.Prepare("RELEASE put"));
  ASSIGN_OR_RETURN(writer->index_pages,
                   db.Prepare("SELECT page_count * page_size FROM pragma_page_count(), "
                              "pragma_page_size()"));
  RETURN_IF_ERROR(writer->imports.Prepare(db));
  RETURN_IF_ERROR(writer->leftover_files.Prepare(db));
  RETURN_IF_ERROR(writer->eviction_candidates.Prepare(db));
  RETURN_IF_ERROR(writer->served_file_records.Prepare(db));
  RETURN_IF_ERROR(writer->blob_rows.Prepare(db));
  RETURN_IF_ERROR(writer->entry_rows.Prepare(db));
  // The files of a kilnd that did not stop cleanly may include some it wrote
  // and never recorded: the maintenance thread sweeps them (RemoveOrphanFiles).
  // A new store has none.
  const bool stopped_cleanly = fs::remove(options_.data_dir / kCleanStopFile, error);
  sweep_orphans_ = found_version != 0 && !stopped_cleanly;
  ASSIGN_OR_RETURN(StoreAccounting::Totals totals,
                   StoreAccounting::ReadTotals(db, stopped_cleanly));
  accounting_.Restore(totals);
  lru_.StartClockAt(static_cast<int64_t>(totals.use_clock));
  writer_ = std::move(writer);
  evictor_ = std::make_unique<Evictor>(
      Evictor::Parts{.writer_mutex = writer_mutex_,
                     .db = *writer_->db,
                     .index_pages = writer_->index_pages,
                     .candidates = writer_->eviction_candidates,
                     .removal = writer_->removal,
                     .accounting = accounting_,
                     .served_files = served_files_,
                     .schedule = maintenance_schedule_,
                     .stop_requested = stop_requested_,
                     .record_uses = [this] { return FlushTouches(); }},
      Evictor::Limits{.max_size_bytes = options_.max_size_bytes,
                      .max_domain_bytes = options_.max_domain_bytes});
  {
    std::lock_guard lock(writer_mutex_);
    RETURN_IF_ERROR(writer_->imports.FindUnfinished());
  }
  RETURN_IF_ERROR(served_files_.Initialize(options_.served_file_readers));
  served_files_.AddRecordedBytes(totals.served_bytes);
  accounting_.EnsureSpaceReserve(options_.max_size_bytes);
  MeasureUnrecordedBytes();
  return absl::OkStatus();
}

absl::StatusOr<ArtifactStore::ReadResult> ArtifactStore::ReadEntry(
    absl::string_view ns, absl::string_view key,
    const absl::flat_hash_set<std::string>& digests_to_skip, const AsFiles* as_files) {
  ReadResult result;
  std::vector<BrokenBlob> broken;
  ServedWrites writes;
  {
    ASSIGN_OR_RETURN(IndexReaders::Lease reader, readers_.Acquire());
    sqlite::Statement& lookup = reader->entry_blobs;
    lookup.BindText(1, ns).BindText(2, key);
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
                      static_cast<uint64_t>(lookup.ColumnInt(4)), "", std::nullopt, std::nullopt};
      const std::string row_key(lookup.ColumnBlob(8));
      if (row_key != blob.digest) blob.store_key = row_key;
      if (as_files != nullptr && blob.name == kKeyInputsBlob) {
        continue;  // read through Lookup alone
      }
      if (as_files != nullptr) {
        if (absl::Status served = ServeAsFile(blob, lookup.ColumnInt(5),
                                              static_cast<BlobLocation>(lookup.ColumnInt(6)),
                                              lookup.ColumnBlob(7), writes);
            !served.ok()) {
          broken.push_back({row_key, blob.digest, std::string(served.message())});
          continue;
        }
      } else if (!digests_to_skip.contains(blob.digest)) {
        absl::StatusOr<std::string> content =
            blobs_.Read(lookup.ColumnInt(5), static_cast<BlobLocation>(lookup.ColumnInt(6)),
                        lookup.ColumnBlob(7), blob.digest, blob.size,
                        BlobStorage::IntegrityCheck::kTrustUnchangedFiles);
        if (!content.ok()) {
          broken.push_back({row_key, blob.digest, std::string(content.status().message())});
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
    for (const BrokenBlob& blob : broken) DropCorruptBlob(blob);
    return absl::NotFoundError(
        absl::StrFormat("cache entry %s/%s failed its integrity check and was dropped", ns, key));
  }
  return result;
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
  lru_.RecordUse(read->entry_id);
  return std::move(read->entry);
}

absl::Status ArtifactStore::ServeAsFiles(absl::string_view ns, absl::string_view key,
                                         const AsFiles& as_files) {
  return ReadEntry(ns, key, {}, &as_files).status();
}

absl::StatusOr<uint64_t> ArtifactStore::RecordHits(absl::string_view ns,
                                                   const std::vector<std::string>& keys) {
  uint64_t recorded = 0;
  ASSIGN_OR_RETURN(IndexReaders::Lease reader, readers_.Acquire());
  for (const std::string& key : keys) {
    ASSIGN_OR_RETURN(std::optional<int64_t> entry_id, reader->FindEntry(ns, key));
    if (!entry_id.has_value()) continue;  // evicted meanwhile: the client's copy still served it
    lru_.RecordUse(*entry_id);
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


absl::Status ArtifactStore::ValidateEntry(absl::string_view ns, absl::string_view key,
                                          const std::vector<BlobInput>& blobs,
                                          const BlobReferences& stored) {
  if (ns.empty() || key.empty()) {
    return absl::InvalidArgumentError("a cache entry needs a non-empty namespace and key");
  }
  if (blobs.empty() && stored.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("entry %s/%s has no blobs; send at least one artifact", ns, key));
  }
  absl::flat_hash_set<absl::string_view> names;
  std::vector<absl::string_view> all_names;
  for (const BlobInput& blob : blobs) all_names.push_back(blob.name);
  for (const BlobReference& reference : stored) all_names.push_back(reference.name);
  for (absl::string_view name : all_names) {
    if (name.empty() || !names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "entry %s/%s: blob name '%s' is empty or repeated; every blob needs a unique name", ns,
          key, name));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PreparedBlob>> ArtifactStore::PrepareBlobs(
    std::vector<BlobInput> blobs) {
  std::vector<PreparedBlob> prepared;
  prepared.reserve(blobs.size());
  for (BlobInput& blob : blobs) {
    absl::StatusOr<PreparedBlob> ready =
        blobs_.Prepare(std::move(blob.name), std::move(blob.data), blob.expected_digest);
    if (!ready.ok()) {
      BlobStorage::RemoveTempFiles(prepared);
      return ready.status();
    }
    prepared.push_back(*std::move(ready));
  }
  return prepared;
}

// One put waiting for a group commit: what it stores, and once committed, how it went.
struct ArtifactStore::QueuedPut {
  absl::string_view ns;
  absl::string_view key;
  std::vector<PreparedBlob> prepared;
  const BlobReferences* stored = nullptr;
  absl::Status result;
  // Within the group's transaction, until it commits.
  uint64_t added_bytes = 0;
  uint64_t added_file_bytes = 0;
  std::vector<fs::path> published_files;  // blob files it moved into place
  std::vector<std::string> inserted_digests;  // of the blob rows it added
  bool new_entry = false;  // not one replaced
  FreedBlobs freed;
  const ImportMode* import = nullptr;  // set for an import's entries
  ImportedAs imported_as = ImportedAs::kStored;
};

absl::StatusOr<std::vector<StoredBlob>> ArtifactStore::Put(absl::string_view ns,
                                                           absl::string_view key,
                                                           std::vector<BlobInput> blobs,
                                                           const BlobReferences& stored) {
  RETURN_IF_ERROR(ValidateEntry(ns, key, blobs, stored));
  std::vector<QueuedPut> puts(1);
  QueuedPut& put = puts.front();
  put.ns = ns;
  put.key = key;
  put.stored = &stored;
  ASSIGN_OR_RETURN(put.prepared, PrepareBlobs(std::move(blobs)));
  CommitInGroup(puts, 0, 1);
  RETURN_IF_ERROR(put.result);
  std::vector<StoredBlob> manifest;
  for (const PreparedBlob& blob : put.prepared) {
    manifest.push_back({blob.name, blob.digest, blob.size, blob.store_key, std::nullopt, std::nullopt});
  }
  std::sort(manifest.begin(), manifest.end(),
            [](const StoredBlob& a, const StoredBlob& b) { return a.name < b.name; });
  return manifest;
}

std::vector<absl::Status> ArtifactStore::PutMany(std::vector<EntryInput> entries) {
  return PutMany(std::move(entries), nullptr, nullptr);
}

std::vector<absl::Status> ArtifactStore::PutMany(std::vector<EntryInput> entries,
                                                 const ImportMode* import,
                                                 std::vector<ImportedAs>* imported_as) {
  static const BlobReferences kNoneStored;
  std::vector<absl::Status> results(entries.size());
  std::vector<QueuedPut> puts;
  std::vector<size_t> put_of_entry;  // puts[i] stores entries[put_of_entry[i]]
  puts.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    EntryInput& entry = entries[i];
    results[i] = ValidateEntry(entry.ns, entry.key, entry.blobs, kNoneStored);
    if (!results[i].ok()) continue;
    absl::StatusOr<std::vector<PreparedBlob>> prepared = PrepareBlobs(std::move(entry.blobs));
    if (!prepared.ok()) {
      results[i] = prepared.status();
      continue;
    }
    QueuedPut& put = puts.emplace_back();
    put.ns = entry.ns;
    put.key = entry.key;
    put.stored = &kNoneStored;
    put.prepared = *std::move(prepared);
    put.import = import;
    put_of_entry.push_back(i);
  }
  // A commit's worth at a time, so that a stop ends a bulk writer's call
  // after the commit in progress: what was not committed is refused, not lost.
  for (size_t first = 0; first < puts.size(); first += kPutsPerCommit) {
    const size_t end = std::min(puts.size(), first + kPutsPerCommit);
    if (stop_requested_.load()) {
      for (size_t i = first; i < end; ++i) {
        puts[i].result = absl::UnavailableError("kilnd is stopping: not stored; put it again");
      }
    } else {
      CommitInGroup(puts, first, end);
    }
  }
  if (imported_as != nullptr) imported_as->assign(entries.size(), ImportedAs::kStored);
  for (size_t i = 0; i < puts.size(); ++i) {
    results[put_of_entry[i]] = puts[i].result;
    if (imported_as != nullptr) (*imported_as)[put_of_entry[i]] = puts[i].imported_as;
  }
  return results;
}

void ArtifactStore::NoteEntriesStored(const std::vector<QueuedPut>& puts, size_t first,
                                      size_t end) {
  bool any_stored = false;
  absl::flat_hash_set<absl::string_view> capped_domains;
  for (size_t i = first; i < end; ++i) {
    const QueuedPut& put = puts[i];
    if (!put.result.ok()) continue;
    any_stored = true;
    if (!put.prepared.empty()) puts_.fetch_add(1, std::memory_order_relaxed);  // not an alias
    const absl::string_view domain = DomainOf(put.ns);
    if (options_.max_domain_bytes > 0 && !options_.capped_domain_prefix.empty() &&
        absl::StartsWith(domain, options_.capped_domain_prefix)) {
      capped_domains.insert(domain);
    }
  }
  if (!any_stored) return;
  if (accounting_.NoteStored()) accounting_.EnsureSpaceReserve(options_.max_size_bytes);
  const bool over_cap = DiskBytes() > options_.max_size_bytes;
  maintenance_schedule_.NotePuts(capped_domains, over_cap);
}

void ArtifactStore::CommitInGroup(std::vector<QueuedPut>& puts, size_t first, size_t end) {
  std::vector<QueuedPut*> queued;
  queued.reserve(end - first);
  for (size_t i = first; i < end; ++i) queued.push_back(&puts[i]);
  group_commit_.Commit(queued);
  for (size_t i = first; i < end; ++i) {
    BlobStorage::RemoveTempFiles(puts[i].prepared);
    if (absl::IsResourceExhausted(puts[i].result)) accounting_.NoteDiskFull(puts[i].result);
  }
  NoteEntriesStored(puts, first, end);
}

void ArtifactStore::CommitGroupLocked(const std::vector<QueuedPut*>& group) {
  Writer& w = *writer_;
  absl::Status status;
  absl::StatusOr<sqlite::Transaction> txn = sqlite::Transaction::Begin(*w.db);
  if (txn.ok()) {
    for (QueuedPut* put : group) {
      // Each put on a savepoint of its own: one that fails (a `stored` digest
      // evicted meanwhile, a full disk) takes back only itself.
      put->result = w.begin_put.Run();
      if (put->result.ok()) put->result = PutInTransactionLocked(*put);
      if (put->result.ok()) {
        put->result = w.end_put.Run();
      } else {
        w.undo_put.Run().IgnoreError();
        w.end_put.Run().IgnoreError();
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
    accounting_.Add({.stored_bytes = put->added_bytes,
                     .file_blob_bytes = put->added_file_bytes,
                     .blobs = put->inserted_digests.size(),
                     .entries = put->new_entry ? 1u : 0u});
    std::erase_if(put->freed.files, [&](const fs::path& file) {
      return stored_again.contains(absl::HexStringToBytes(file.filename().string()));
    });
    w.removal.Release(put->freed);
  }
  w.removal.RemoveCopiesPastGrace(/*all=*/false);  // those past their grace already
}

void ArtifactStore::RemovePublishedFiles(const QueuedPut& put) {
  // Moved into place for blob rows that were taken back: no row names them.
  std::error_code error;
  for (const fs::path& file : put.published_files) fs::remove(file, error);
}

absl::Status ArtifactStore::PutInTransactionLocked(QueuedPut& put) {
  Writer& w = *writer_;
  if (put.import != nullptr) {
    ASSIGN_OR_RETURN(put.imported_as,
                     ImportedAsLocked(put.ns, put.key, put.prepared, put.import->replace));
    if (put.imported_as == ImportedAs::kUnchanged || put.imported_as == ImportedAs::kConflict) {
      return absl::OkStatus();  // kept as it is
    }
    RETURN_IF_ERROR(w.imports.Journal(put.import->id, put.ns, put.key));
  }
  std::vector<int64_t> replaced_blob_ids;
  ASSIGN_OR_RETURN(const int64_t entry_id, ReplaceEntryLocked(put.ns, put.key, replaced_blob_ids,
                                                              put.new_entry));
  for (PreparedBlob& blob : put.prepared) {
    // A small blob is a row of this entry's, keyed by a placeholder: looking
    // for an equal one, and keying it by content, would each cost a random
    // page of the digest index, here and at its eviction. A file blob is
    // named for its content, and shared.
    const bool keyed_by_content = blob.location == BlobLocation::kFile;
    std::optional<int64_t> blob_id;
    if (keyed_by_content) {
      ASSIGN_OR_RETURN(blob_id, w.blob_rows.Find(blob.digest));
    }
    if (!blob_id.has_value()) {
      if (blob.location == BlobLocation::kFile) {
        RETURN_IF_ERROR(blobs_.Publish(blob));
        put.published_files.push_back(blobs_.PathOf(blob.digest));
      }
      ASSIGN_OR_RETURN(blob_id, w.blob_rows.Insert(blob, keyed_by_content));
      put.inserted_digests.push_back(blob.digest);
      put.added_bytes += blob.stored_size;
      if (blob.location == BlobLocation::kFile) put.added_file_bytes += OnDisk(blob.stored_size);
    }
    RETURN_IF_ERROR(
        w.entry_rows.Name(entry_id, blob.name, *blob_id));
  }
  for (const BlobReference& reference : *put.stored) {
    std::optional<int64_t> blob_id;
    for (const std::string* key : {&reference.store_key, &reference.digest}) {
      if (key->empty() || blob_id.has_value()) continue;
      ASSIGN_OR_RETURN(blob_id, w.blob_rows.Find(*key));
    }
    if (!blob_id.has_value()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "blob %s of '%s' is no longer stored", DigestHex(reference.digest), reference.name));
    }
    RETURN_IF_ERROR(
        w.entry_rows.Name(entry_id, reference.name, *blob_id));
  }
  ASSIGN_OR_RETURN(put.freed, w.removal.DeleteOrphanBlobs(replaced_blob_ids));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ArtifactStore::ReplaceEntryLocked(absl::string_view ns,
                                                         absl::string_view key,
                                                         std::vector<int64_t>& replaced_blob_ids,
                                                         bool& is_new) {
  EntryRows& entries = writer_->entry_rows;
  ASSIGN_OR_RETURN(std::optional<EntryRows::Found> old_entry, entries.Find(ns, key));
  is_new = !old_entry.has_value();
  // The served index file and link of (ns, key) stay where they are (a lookup
  // as files rewrites the index): the new entry owns them.
  EntryRows::ServedIndex served_index;
  if (old_entry.has_value()) {
    served_index = std::move(old_entry->served_index);
    RETURN_IF_ERROR(entries.Delete({old_entry->id}, replaced_blob_ids));
  }
  return entries.Insert(ns, key, NowMillis(), lru_.Tick(), served_index);
}

void ArtifactStore::RemoveServedCopiesGone() {
  std::optional<absl::Time> until;
  {
    std::lock_guard lock(writer_mutex_);
    until = writer_->leftover_files.LastGraceEnds();
    if (!until.has_value()) return;
  }
  for (absl::Time now = absl::Now(); now < *until && !stop_requested_.load(); now = absl::Now()) {
    absl::SleepFor(std::min(*until - now, absl::Milliseconds(50)));
  }
  std::lock_guard lock(writer_mutex_);
  writer_->removal.RemoveCopiesPastGrace(/*all=*/false);
}

void ArtifactStore::DropCorruptBlob(const BrokenBlob& blob) {
  spdlog::error("cache: blob {} failed its integrity check ({}); dropping every entry that uses it",
                DigestHex(blob.digest), blob.reason);
  std::lock_guard lock(writer_mutex_);
  Writer& w = *writer_;
  auto drop = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(*w.db));
    ASSIGN_OR_RETURN(BlobRows::Users users, w.blob_rows.EntriesNaming(blob.store_key));
    // Each entry goes as an evicted one does (its other blobs, its served index
    // entry); then the blob itself, which no entry uses any more.
    FreedBlobs freed;
    RETURN_IF_ERROR(w.removal.DeleteById(users.entry_ids, freed));
    if (users.blob_id.has_value()) {
      ASSIGN_OR_RETURN(FreedBlobs blob_freed, w.removal.DeleteOrphanBlobs({*users.blob_id}));
      freed.Add(std::move(blob_freed));
    }
    RETURN_IF_ERROR(txn.Commit());
    corrupt_entries_dropped_ += users.entry_ids.size();
    w.removal.Release(freed);
    return absl::OkStatus();
  };
  if (absl::Status status = drop(); !status.ok()) {
    spdlog::error("cache: could not drop entries of corrupt blob {}: {}", DigestHex(blob.digest),
                  status.message());
  }
}

absl::Status ArtifactStore::FlushTouches() {
  const LruPolicy::Uses touches = lru_.TakeUses();
  if (touches.empty()) return absl::OkStatus();
  Writer& w = *writer_;
  ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(*w.db));
  for (const auto& [entry_id, last_use] : touches) {
    RETURN_IF_ERROR(w.entry_rows.Touch(entry_id, last_use));
  }
  return txn.Commit();
}

absl::StatusOr<uint64_t> ArtifactStore::EvictToSize(uint64_t target_bytes) {
  return evictor_->EvictToSize(target_bytes);
}

absl::StatusOr<uint64_t> ArtifactStore::EnforceDomainCaps() { return evictor_->EnforceDomainCaps(); }

absl::StatusOr<uint64_t> ArtifactStore::DomainBytes(absl::string_view domain) {
  std::lock_guard lock(writer_mutex_);
  return writer_->eviction_candidates.DomainBytes(domain);
}

absl::StatusOr<std::vector<ArtifactStore::ListedEntry>> ArtifactStore::ListEntries(
    absl::string_view ns_prefix, absl::Time since, int64_t after_id, size_t limit) {
  std::lock_guard lock(writer_mutex_);
  // Every namespace with the prefix sorts in [prefix, prefix + U+FFFF-ish):
  // namespaces are printable ASCII, so "\x7f" ends the range.
  const std::string from(ns_prefix);
  const std::string to = absl::StrCat(ns_prefix, "\x7f");
  ASSIGN_OR_RETURN(std::vector<EntryRows::Listed> page,
                   writer_->entry_rows.ListAfter(from, to, absl::ToUnixMillis(since), after_id,
                                                 static_cast<int64_t>(limit)));
  std::vector<ListedEntry> entries;
  entries.reserve(page.size());
  for (EntryRows::Listed& listed : page) {
    entries.push_back({listed.id, std::move(listed.ns), std::move(listed.key),
                       absl::FromUnixMillis(listed.created_ms)});
  }
  return entries;
}

absl::StatusOr<StoreStats> ArtifactStore::Stats() {
  CollectJournaledHits();
  StoreStats stats;
  stats.hits = hits_.load();
  stats.misses = misses_.load();
  stats.puts = puts_.load();
  stats.evicted_entries = evictor_->evicted();
  stats.corrupt_entries_dropped = corrupt_entries_dropped_.load();
  {
    // Between writes where it can: a checkpoint moves the WAL's pages into the
    // database file, and sizing the two while it runs can miss pages in
    // flight. Never waiting for one: an eviction holds the writer batch after
    // batch, and stats must answer meanwhile.
    std::unique_lock lock(writer_mutex_, std::try_to_lock);
    stats.stored_bytes = accounting_.stored_bytes();
    stats.disk_bytes = DiskBytes();
  }
  stats.max_size_bytes = options_.max_size_bytes;
  stats.puts_refused_disk_full = accounting_.puts_refused_disk_full();
  stats.disk_full_since = accounting_.disk_full_since();
  {
    std::lock_guard lock(namespace_stats_mutex_);
    stats.lookups_by_namespace.insert(lookups_by_namespace_.begin(), lookups_by_namespace_.end());
  }
  // Kept as rows come and go: counting a million rows takes a tenth of a second.
  stats.entries = accounting_.entries();
  stats.blobs = accounting_.blobs();
  return stats;
}

}  // namespace kiln::cache
