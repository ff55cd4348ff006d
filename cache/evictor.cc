#include "cache/evictor.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/types/span.h"
#include "cache/lru_policy.h"
#include "common/fmt_absl.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

// Entries an eviction transaction takes at most: the writer is held for some
// 80 ms (about 13,000 entries/s at 300k entries on the 2-core machine), so
// puts interleave. A commit writes each index page it changed once, and the
// pages of keys and digests an eviction changes are scattered: the more
// entries a commit shares, the fewer of them each one writes.
constexpr int kEvictionBatch = 1024;
// How often an eviction's last checkpoint is tried, 50 ms apart.
constexpr int kTruncateAttempts = 40;

}  // namespace

uint64_t Evictor::EvictionBytesLocked() {
  return parts_.accounting.EvictionBytes(parts_.index_pages, parts_.served_files.bytes());
}

absl::StatusOr<uint64_t> Evictor::EvictToSize(uint64_t target_bytes) {
  {
    // Files whose holders let go since: they free space before any entry goes.
    std::lock_guard lock(parts_.writer_mutex);
    parts_.removal.RetryLeftovers();
    parts_.removal.RemoveCopiesPastGrace(/*all=*/false);
  }
  absl::StatusOr<uint64_t> evicted = EvictBatchesToSize(target_bytes);
  {
    std::lock_guard lock(parts_.writer_mutex);
    parts_.removal.RemoveCopiesPastGrace(/*all=*/false);  // those past their grace already
  }
  if (absl::IsResourceExhausted(evicted.status())) {
    // The transaction found no room to write in: give it the reserve's.
    if (parts_.accounting.GiveUpSpaceReserve()) {
      spdlog::warn("cache: the disk is full; evicting with the space kept in reserve for it");
      evicted = EvictBatchesToSize(target_bytes);
    }
  }
  parts_.accounting.EnsureSpaceReserve(limits_.max_size_bytes);
  return evicted;
}

absl::StatusOr<uint64_t> Evictor::EvictBatchesToSize(uint64_t target_bytes) {
  uint64_t evicted = 0;
  while (!parts_.stop_requested.load()) {
    // The lock is taken per batch so puts and corrupt-blob drops interleave;
    // lookups never wait for it (WAL readers see the last committed state).
    std::lock_guard lock(parts_.writer_mutex);
    if (EvictionBytesLocked() <= target_bytes) break;
    RETURN_IF_ERROR(parts_.record_uses());
    ASSIGN_OR_RETURN(uint64_t batch, EvictBatchLocked(target_bytes));
    if (batch == 0) break;
    evicted += batch;
  }
  // The WAL cut to nothing and the database file to its pages: what
  // EvictionBytesLocked measured. Tried for a while (best effort): the
  // checkpointer's own checkpoint, or readers, may hold it off for moments.
  for (int attempt = 0; attempt < kTruncateAttempts && !parts_.stop_requested.load(); ++attempt) {
    {
      std::lock_guard lock(parts_.writer_mutex);
      absl::StatusOr<bool> truncated = parts_.db.CheckpointAndTruncate();
      if (!truncated.ok() || *truncated) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (evicted > 0) {
    spdlog::info("cache: evicted {} least recently used entries; {} bytes on disk", evicted,
                 parts_.accounting.DiskBytes(parts_.served_files.bytes()));
  }
  return evicted;
}

absl::StatusOr<uint64_t> Evictor::EvictBatchLocked(uint64_t target_bytes) {
  ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(parts_.db));
  ASSIGN_OR_RETURN(std::vector<EntryToEvict> candidates,
                   parts_.candidates.LeastRecentlyUsed(kEvictionBatch));
  candidates.resize(LruPolicy::EntriesToFree(
      EvictionCandidates::BytesFreedByEach(candidates, EvictionCandidates::IndexFiles::kCounted),
      EvictionBytesLocked(), target_bytes));
  FreedBlobs freed;
  RETURN_IF_ERROR(parts_.removal.Delete(candidates, freed));
  RETURN_IF_ERROR(txn.Commit());
  parts_.removal.Release(freed);
  evicted_ += candidates.size();
  // The pages of inline blobs go back to the file system. Not a failure of
  // the eviction when it cannot (a full disk): the next batch tries again.
  if (absl::Status status = parts_.db.Exec("PRAGMA incremental_vacuum"); !status.ok()) {
    spdlog::debug("cache: incremental_vacuum: {}", status.message());
  }
  return candidates.size();
}

absl::StatusOr<uint64_t> Evictor::EnforceDomainCaps() {
  const absl::flat_hash_set<std::string> taken = parts_.schedule.TakeDomainsPutTo();
  const std::vector<std::string> domains(taken.begin(), taken.end());
  uint64_t evicted = 0;
  for (size_t i = 0; i < domains.size(); ++i) {
    absl::StatusOr<uint64_t> went = EnforceDomainCap(domains[i]);
    if (went.ok()) evicted += *went;
    if (!went.ok() || parts_.stop_requested.load()) {
      // This domain, perhaps not done, and those not looked at wait for the next call.
      parts_.schedule.LookAgainLater(absl::MakeConstSpan(domains).subspan(i));
      if (!went.ok()) return went.status();
      break;
    }
  }
  return evicted;
}

absl::StatusOr<uint64_t> Evictor::EnforceDomainCap(absl::string_view domain) {
  uint64_t held = 0;
  {
    std::lock_guard lock(parts_.writer_mutex);
    RETURN_IF_ERROR(parts_.record_uses());  // the LRU order as lookups left it
    ASSIGN_OR_RETURN(held, parts_.candidates.DomainBytes(domain));
  }
  if (held <= limits_.max_domain_bytes) return 0;
  const uint64_t found = held;
  // Below the cap, not just to it, so the next put does not evict again.
  const uint64_t target = limits_.max_domain_bytes / 10 * 9;
  uint64_t went = 0;
  while (held > target && !parts_.stop_requested.load()) {
    std::lock_guard lock(parts_.writer_mutex);
    RETURN_IF_ERROR(parts_.record_uses());
    ASSIGN_OR_RETURN(uint64_t batch, EvictDomainBatchLocked(domain, held, target));
    if (batch == 0) break;
    went += batch;
  }
  spdlog::info("cache: {} held {} bytes, over its cap of {}: evicted its {} least recently used "
               "entries",
               domain, found, limits_.max_domain_bytes, went);
  return went;
}

absl::StatusOr<uint64_t> Evictor::EvictDomainBatchLocked(absl::string_view domain, uint64_t& held,
                                                         uint64_t target_bytes) {
  ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(parts_.db));
  ASSIGN_OR_RETURN(std::vector<EntryToEvict> candidates,
                   parts_.candidates.LeastRecentlyUsedOf(domain, kEvictionBatch));
  candidates.resize(LruPolicy::EntriesToFree(
      EvictionCandidates::BytesFreedByEach(candidates, EvictionCandidates::IndexFiles::kNotCounted),
      held, target_bytes));
  FreedBlobs freed;
  RETURN_IF_ERROR(parts_.removal.Delete(candidates, freed));
  for (const EntryToEvict& entry : candidates) held -= std::min(held, entry.stored_bytes);
  RETURN_IF_ERROR(txn.Commit());
  parts_.removal.Release(freed);
  evicted_ += candidates.size();
  return candidates.size();
}

}  // namespace kiln::cache
