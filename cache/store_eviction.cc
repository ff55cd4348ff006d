// Eviction: least recently used entries go, by the batch, until the data
// directory fits a size; and each capped trust domain's go when it holds more
// than its cap (StoreOptions::max_domain_bytes).

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cache/artifact_store.h"
#include "cache/artifact_store_internal.h"
#include "cache/sqlite.h"
#include "common/fmt_absl.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;

// Entries an eviction transaction takes at most: the writer is held for some
// 80 ms (about 13,000 entries/s at 300k entries on the 2-core machine), so
// puts interleave. A commit writes each index page it changed once, and the
// pages of keys and digests an eviction changes are scattered: the more
// entries a commit shares, the fewer of them each one writes.
constexpr int kEvictionBatch = 1024;
// How often an eviction's last checkpoint is tried, 50 ms apart.
constexpr int kTruncateAttempts = 40;

}  // namespace

absl::Status ArtifactStore::EvictEntriesLocked(const std::vector<int64_t>& entry_ids,
                                               FreedBlobs& freed) {
  if (entry_ids.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<EntryToEvict> found,
                   writer_->eviction_candidates.ById(entry_ids));
  return EvictEntriesLocked(found, freed);
}

absl::Status ArtifactStore::EvictEntriesLocked(absl::Span<const EntryToEvict> entries,
                                               FreedBlobs& freed) {
  if (entries.empty()) return absl::OkStatus();
  std::vector<int64_t> entry_ids;
  entry_ids.reserve(entries.size());
  for (const EntryToEvict& entry : entries) {
    entry_ids.push_back(entry.id);
    freed.served_bytes += entry.index_disk_bytes;
    freed.entries.push_back(entry.names);
  }
  std::vector<int64_t> blob_ids;
  RETURN_IF_ERROR(DeleteEntriesLocked(entry_ids, blob_ids));
  ASSIGN_OR_RETURN(FreedBlobs blobs_freed, DeleteOrphanBlobsLocked(blob_ids));
  freed.Add(std::move(blobs_freed));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ArtifactStore::EvictBatchLocked(uint64_t target_bytes) {
  Writer& w = *writer_;
  ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(*w.db));
  ASSIGN_OR_RETURN(std::vector<EntryToEvict> candidates,
                   w.eviction_candidates.LeastRecentlyUsed(kEvictionBatch));
  candidates.resize(LruPolicy::EntriesToFree(
      EvictionCandidates::BytesFreedByEach(candidates, EvictionCandidates::IndexFiles::kCounted),
      EvictionBytesLocked(), target_bytes));
  FreedBlobs freed;
  RETURN_IF_ERROR(EvictEntriesLocked(candidates, freed));
  RETURN_IF_ERROR(txn.Commit());
  ReleaseFreedBlobs(freed);
  evicted_entries_ += candidates.size();
  // The pages of inline blobs go back to the file system. Not a failure of
  // the eviction when it cannot (a full disk): the next batch tries again.
  if (absl::Status status = w.db->Exec("PRAGMA incremental_vacuum"); !status.ok()) {
    spdlog::debug("cache: incremental_vacuum: {}", status.message());
  }
  return candidates.size();
}

uint64_t ArtifactStore::EvictionBytesLocked() {
  return accounting_.EvictionBytes(writer_->index_pages, served_files_.bytes());
}

absl::StatusOr<uint64_t> ArtifactStore::DomainBytes(absl::string_view domain) {
  std::lock_guard lock(writer_mutex_);
  return DomainBytesLocked(domain);
}

absl::StatusOr<uint64_t> ArtifactStore::DomainBytesLocked(absl::string_view domain) {
  return writer_->eviction_candidates.DomainBytes(domain);
}

absl::StatusOr<uint64_t> ArtifactStore::EnforceDomainCaps() {
  const absl::flat_hash_set<std::string> domains = maintenance_schedule_.TakeDomainsPutTo();
  // Domains not looked at (a stop, an error) wait for the next call.
  const auto look_again_later = [&](auto from) {
    maintenance_schedule_.LookAgainLater(std::vector<std::string>(from, domains.end()));
  };
  uint64_t evicted = 0;
  for (auto domain = domains.begin(); domain != domains.end(); ++domain) {
    absl::StatusOr<uint64_t> went = EnforceDomainCap(*domain);
    if (!went.ok()) {
      look_again_later(domain);
      return went.status();
    }
    evicted += *went;
    if (stop_requested_.load()) {  // this one may not be done either
      look_again_later(domain);
      break;
    }
  }
  return evicted;
}

absl::StatusOr<uint64_t> ArtifactStore::EnforceDomainCap(absl::string_view domain) {
  uint64_t held = 0;
  {
    std::lock_guard lock(writer_mutex_);
    RETURN_IF_ERROR(FlushTouches());  // the LRU order as lookups left it
    ASSIGN_OR_RETURN(held, DomainBytesLocked(domain));
  }
  if (held <= options_.max_domain_bytes) return 0;
  const uint64_t found = held;
  // Below the cap, not just to it, so the next put does not evict again.
  const uint64_t target = options_.max_domain_bytes / 10 * 9;
  uint64_t went = 0;
  while (held > target && !stop_requested_.load()) {
    std::lock_guard lock(writer_mutex_);
    RETURN_IF_ERROR(FlushTouches());
    ASSIGN_OR_RETURN(uint64_t batch, EvictDomainBatchLocked(domain, held, target));
    if (batch == 0) break;
    went += batch;
  }
  spdlog::info("cache: {} held {} bytes, over its cap of {}: evicted its {} least recently used "
               "entries",
               domain, found, options_.max_domain_bytes, went);
  return went;
}

absl::StatusOr<uint64_t> ArtifactStore::EvictDomainBatchLocked(absl::string_view domain,
                                                               uint64_t& held,
                                                               uint64_t target_bytes) {
  Writer& w = *writer_;
  ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(*w.db));
  ASSIGN_OR_RETURN(std::vector<EntryToEvict> candidates,
                   w.eviction_candidates.LeastRecentlyUsedOf(domain, kEvictionBatch));
  candidates.resize(LruPolicy::EntriesToFree(
      EvictionCandidates::BytesFreedByEach(candidates, EvictionCandidates::IndexFiles::kNotCounted),
      held, target_bytes));
  FreedBlobs freed;
  RETURN_IF_ERROR(EvictEntriesLocked(candidates, freed));
  for (const EntryToEvict& entry : candidates) held -= std::min(held, entry.stored_bytes);
  const uint64_t evicted = candidates.size();
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
    RemoveServedCopiesGoneLocked(/*all=*/false);
  }
  absl::StatusOr<uint64_t> evicted = EvictBatchesToSize(target_bytes);
  {
    std::lock_guard lock(writer_mutex_);
    RemoveServedCopiesGoneLocked(/*all=*/false);  // those past their grace already
  }
  if (absl::IsResourceExhausted(evicted.status())) {
    // The transaction found no room to write in: give it the reserve's.
    if (accounting_.GiveUpSpaceReserve()) {
      spdlog::warn("cache: the disk is full; evicting with the space kept in reserve for it");
      evicted = EvictBatchesToSize(target_bytes);
    }
  }
  accounting_.EnsureSpaceReserve(options_.max_size_bytes);
  return evicted;
}

absl::StatusOr<uint64_t> ArtifactStore::EvictBatchesToSize(uint64_t target_bytes) {
  uint64_t evicted = 0;
  while (!stop_requested_.load()) {
    // The lock is taken per batch so puts and corrupt-blob drops interleave;
    // lookups never wait for it (WAL readers see the last committed state).
    std::lock_guard lock(writer_mutex_);
    if (EvictionBytesLocked() <= target_bytes) break;
    RETURN_IF_ERROR(FlushTouches());
    ASSIGN_OR_RETURN(uint64_t batch, EvictBatchLocked(target_bytes));
    if (batch == 0) break;
    evicted += batch;
  }
  // The WAL cut to nothing and the database file to its pages: what
  // EvictionBytesLocked measured. Tried for a while (best effort): the
  // checkpointer's own checkpoint, or readers, may hold it off for moments.
  for (int attempt = 0; attempt < kTruncateAttempts && !stop_requested_.load(); ++attempt) {
    {
      std::lock_guard lock(writer_mutex_);
      absl::StatusOr<bool> truncated = writer_->db->CheckpointAndTruncate();
      if (!truncated.ok() || *truncated) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (evicted > 0) {
    spdlog::info("cache: evicted {} least recently used entries; {} bytes on disk", evicted,
                 DiskBytes());
  }
  return evicted;
}

}  // namespace kiln::cache
