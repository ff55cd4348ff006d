// Blobs that a lookup hands to a local client as files (served_files.h): the
// served copies and index entry it writes, and their records in the index, so
// that eviction finds them and their disk is counted.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cache/artifact_store.h"
#include "cache/artifact_store_internal.h"
#include "cache/served_files.h"
#include "cache/sqlite.h"
#include "common/fmt_absl.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;

}  // namespace

absl::Status ArtifactStore::ServeAsFile(StoredBlob& blob, int64_t codec, BlobLocation location,
                                        absl::string_view inline_data, ServedWrites& writes) {
  const std::optional<std::string> extension = ServedFiles::ExtensionOf(blob.name);
  if (extension.has_value()) {
    if (!blob.store_key.empty()) writes.to_key_by_content.push_back(blob.store_key);
    if (std::optional<fs::path> served = served_files_.Find(blob.digest, *extension)) {
      blob.file = *std::move(served);
      return absl::OkStatus();
    }
  }
  ASSIGN_OR_RETURN(std::string content,
                   blobs_.Read(codec, location, inline_data, blob.digest, blob.size,
                               BlobStorage::IntegrityCheck::kTrustUnchangedFiles));
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
  BlobRows::Merged rows_merged;  // placeholder rows whose entries went to the row of their content
  {
    std::lock_guard lock(writer_mutex_);
    Writer& w = *writer_;
    auto record = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(sqlite::Transaction txn, sqlite::Transaction::Begin(*w.db));
      for (const std::string& placeholder : writes.to_key_by_content) {
        RETURN_IF_ERROR(w.blob_rows.KeyByContent(placeholder, rows_merged));
      }
      for (const auto& [digest, extension, disk_bytes] : writes.copies) {
        ASSIGN_OR_RETURN(bool recorded, w.served_file_records.RecordCopy(digest, extension, disk_bytes));
        if (!recorded) unrecorded.emplace_back(digest, extension);
      }
      if (writes.index.has_value()) {
        ASSIGN_OR_RETURN(bool recorded, w.served_file_records.RecordIndex(
                                            ns, key, *writes.index, writes.index_namespace));
        index_unrecorded = !recorded;
      }
      return txn.Commit();
    };
    if (absl::Status status = record(); status.ok()) {
      accounting_.Remove({.stored_bytes = rows_merged.stored_bytes, .blobs = rows_merged.rows});
    } else {
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

}  // namespace kiln::cache
