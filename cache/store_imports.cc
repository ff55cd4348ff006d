// Imports: a bundle's entries are journaled as they are stored
// (imported_entries), so that an import that fails, or that a stop or a crash
// cuts short, takes back what it stored, and its entries are stored all or
// none. An entry stored already is never replaced by one with other bytes
// unless the import asks for it.

#include <algorithm>
#include <string>
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

// Entries an abandoning transaction takes back at most, as eviction's batch.
constexpr int kAbandonBatch = 512;

}  // namespace

absl::StatusOr<ArtifactStore::ImportedAs> ArtifactStore::ImportedAsLocked(
    absl::string_view ns, absl::string_view key, const std::vector<PreparedBlob>& blobs,
    bool replace) {
  ASSIGN_OR_RETURN(auto stored_blobs, writer_->entry_rows.Blobs(ns, key));
  if (stored_blobs.empty()) return ImportedAs::kStored;
  std::vector<std::pair<std::string, std::string>> imported_blobs;
  for (const PreparedBlob& blob : blobs) imported_blobs.emplace_back(blob.name, blob.digest);
  std::sort(stored_blobs.begin(), stored_blobs.end());
  std::sort(imported_blobs.begin(), imported_blobs.end());
  if (stored_blobs == imported_blobs) return ImportedAs::kUnchanged;
  return replace ? ImportedAs::kReplaced : ImportedAs::kConflict;
}

absl::Status ArtifactStore::FinishImport(int64_t import_id) {
  std::lock_guard lock(writer_mutex_);
  return writer_->imports.Finish(import_id);
}

absl::StatusOr<uint64_t> ArtifactStore::AbandonImport(int64_t import_id) {
  uint64_t removed = 0;
  while (!stop_requested_.load()) {
    std::lock_guard lock(writer_mutex_);
    Writer& w = *writer_;
    ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(*w.db));
    ASSIGN_OR_RETURN(auto names, w.imports.TakeBatch(import_id, kAbandonBatch));
    if (names.empty()) break;
    std::vector<int64_t> entry_ids;
    for (const auto& [ns, key] : names) {
      ASSIGN_OR_RETURN(std::optional<EntryRows::Found> found, w.entry_rows.Find(ns, key));
      if (found.has_value()) entry_ids.push_back(found->id);  // else gone already
    }
    FreedBlobs freed;
    RETURN_IF_ERROR(w.removal.DeleteById(entry_ids, freed));
    RETURN_IF_ERROR(txn.Commit());
    w.removal.Release(freed);
    removed += freed.entries.size();
  }
  return removed;
}

void ArtifactStore::AbandonUnfinishedImports() {
  std::vector<int64_t> imports;
  {
    std::lock_guard lock(writer_mutex_);
    imports = writer_->imports.TakeUnfinished();
  }
  for (int64_t import_id : imports) {
    absl::StatusOr<uint64_t> removed = AbandonImport(import_id);
    if (!removed.ok()) {
      spdlog::error("cache: cannot take back an unfinished import's entries: {}",
                    removed.status().message());
      return;
    }
    spdlog::info("cache: an import that did not finish stored {} entries; they went", *removed);
  }
}

}  // namespace kiln::cache
