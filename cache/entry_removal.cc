#include "cache/entry_removal.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "cache/disk_usage.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace kiln::cache {

namespace fs = std::filesystem;

void FreedBlobs::Add(FreedBlobs&& other) {
  bytes += other.bytes;
  file_bytes += other.file_bytes;
  served_bytes += other.served_bytes;
  blob_rows += other.blob_rows;
  std::move(other.files.begin(), other.files.end(), std::back_inserter(files));
  std::move(other.entries.begin(), other.entries.end(), std::back_inserter(entries));
  std::move(other.served_copies.begin(), other.served_copies.end(),
            std::back_inserter(served_copies));
}

absl::Status EntryRemoval::DeleteById(const std::vector<int64_t>& entry_ids, FreedBlobs& freed) {
  if (entry_ids.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<EntryToEvict> found, parts_.eviction_candidates.ById(entry_ids));
  return Delete(found, freed);
}

absl::Status EntryRemoval::Delete(absl::Span<const EntryToEvict> entries, FreedBlobs& freed) {
  if (entries.empty()) return absl::OkStatus();
  std::vector<int64_t> entry_ids;
  entry_ids.reserve(entries.size());
  for (const EntryToEvict& entry : entries) {
    entry_ids.push_back(entry.id);
    freed.served_bytes += entry.index_disk_bytes;
    freed.entries.push_back(entry.names);
  }
  std::vector<int64_t> blob_ids;
  RETURN_IF_ERROR(parts_.entry_rows.Delete(entry_ids, blob_ids));
  ASSIGN_OR_RETURN(FreedBlobs blobs_freed, DeleteOrphanBlobs(blob_ids));
  freed.Add(std::move(blobs_freed));
  return absl::OkStatus();
}

absl::StatusOr<FreedBlobs> EntryRemoval::DeleteOrphanBlobs(const std::vector<int64_t>& candidate_ids) {
  FreedBlobs freed;
  // Unused by any entry now: their rows, and their served copies' records.
  ASSIGN_OR_RETURN(std::vector<BlobRows::Orphan> orphans,
                   parts_.blob_rows.DeleteOrphans(candidate_ids));
  std::vector<int64_t> served;  // orphans with served copies
  for (BlobRows::Orphan& orphan : orphans) {
    freed.bytes += orphan.stored_size;
    if (orphan.location == BlobLocation::kFile) {
      freed.file_bytes += OnDisk(orphan.stored_size);
      freed.files.push_back(parts_.blobs.PathOf(orphan.key));
    }
    if (orphan.served_copies.empty()) continue;
    served.push_back(orphan.id);
    auto& [digest, extensions] = freed.served_copies.emplace_back(std::move(orphan.key),
                                                                  std::vector<std::string>());
    for (auto& [extension, disk_bytes] : orphan.served_copies) {
      extensions.push_back(std::move(extension));
      freed.served_bytes += disk_bytes;
    }
  }
  RETURN_IF_ERROR(parts_.served_file_records.ForgetCopiesOf(served));
  freed.blob_rows = orphans.size();
  return freed;
}

void EntryRemoval::Release(const FreedBlobs& freed) {
  parts_.accounting.Remove({.stored_bytes = freed.bytes,
                            .file_blob_bytes = freed.file_bytes,
                            .blobs = freed.blob_rows,
                            .entries = freed.entries.size()});
  // A file another process holds open (Windows) stays behind: it is
  // recorded and tried again until its holder lets go.
  for (const fs::path& file : freed.files) parts_.leftover_files.Remove(file);
  // Not removed yet: a local client that found the entry in the served index
  // a moment ago may be about to read them. The index entries and links go
  // now, so no new reader finds them.
  const absl::Time now = absl::Now();
  for (const auto& [digest, extensions] : freed.served_copies) {
    std::vector<ServedFiles::Leftover> detached;
    parts_.served_files.Detach(digest, extensions, detached);
    for (ServedFiles::Leftover& copy : detached) {
      parts_.leftover_files.KeepForGrace(std::move(copy), now);
    }
  }
  for (const EntryNames& entry : freed.entries) {
    if (entry.index_namespace.has_value()) {
      parts_.served_files.RemoveIndex(*entry.index_namespace, entry.key, entry.link_extension);
    }
  }
}

void EntryRemoval::RetryLeftovers() {
  parts_.leftover_files.RetryRecorded([this](const fs::path& path) { return RecordedAgain(path); });
}

void EntryRemoval::RemoveCopiesPastGrace(bool all) {
  parts_.leftover_files.RemoveCopiesPastGrace(
      absl::Now(), [this](const fs::path& path) { return RecordedAgain(path); }, all);
}

bool EntryRemoval::RecordedAgain(const fs::path& path) {
  const std::string name = path.filename().string();
  const std::string hex = name.substr(0, 2 * kSha256Size);
  if (hex.size() != 2 * kSha256Size || !std::all_of(hex.begin(), hex.end(), absl::ascii_isxdigit)) {
    return false;
  }
  const std::string digest = absl::HexStringToBytes(hex);
  if (name.size() != hex.size()) {
    absl::StatusOr<bool> served = parts_.served_file_records.IsCopyRecorded(
        digest, absl::string_view(name).substr(hex.size()));
    return served.ok() && *served;
  }
  absl::StatusOr<bool> found = parts_.blob_rows.IsFileBlob(digest);
  return found.ok() && *found;
}

}  // namespace kiln::cache
