#ifndef KILN_CACHE_ENTRY_REMOVAL_H_
#define KILN_CACHE_ENTRY_REMOVAL_H_

// How entries leave the store, whatever takes them (eviction, a put that
// replaces one, an import taken back, a corrupt blob dropped): their rows and
// those of the blobs only they used are deleted within the writer's
// transaction; once it commits, their files go, or are kept as leftovers
// (LeftoverFiles) while a holder or a reader may still need them, and the
// totals (StoreAccounting) are lowered. Deleting rows and releasing files are
// two steps because a transaction that fails must leave every file in place.
// The caller holds the writer.
//
// Internal to the artifact store.

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache/blob_rows.h"
#include "cache/blob_storage.h"
#include "cache/entry_rows.h"
#include "cache/eviction_candidates.h"
#include "cache/leftover_files.h"
#include "cache/served_file_records.h"
#include "cache/served_files.h"
#include "cache/store_accounting.h"

namespace kiln::cache {

// Entry and blob rows a transaction deleted; their files go only after it commits.
struct FreedBlobs {
  uint64_t bytes = 0;         // stored (compressed) bytes
  uint64_t file_bytes = 0;    // what the freed blob files take on disk
  uint64_t served_bytes = 0;  // what their served copies and index entries take
  uint64_t blob_rows = 0;
  std::vector<std::filesystem::path> files;
  // Deleted entries: their served index entries and links go too.
  std::vector<EntryNames> entries;
  // Freed blobs that have served copies (keyed by content, as every served
  // blob is): digest, the copies' extensions.
  std::vector<std::pair<std::string, std::vector<std::string>>> served_copies;
  void Add(FreedBlobs&& other);
};

class EntryRemoval {
 public:
  // The parts whose rows and files it removes; each must outlive it.
  struct Parts {
    EntryRows& entry_rows;
    BlobRows& blob_rows;
    ServedFileRecords& served_file_records;
    EvictionCandidates& eviction_candidates;
    LeftoverFiles& leftover_files;
    const BlobStorage& blobs;
    ServedFiles& served_files;
    StoreAccounting& accounting;
  };
  explicit EntryRemoval(Parts parts) : parts_(parts) {}

  // Deletes the entries and the blobs only they used, adding what went to
  // `freed`. In the caller's transaction: Release(freed) once it commits.
  absl::Status Delete(absl::Span<const EntryToEvict> entries, FreedBlobs& freed);
  // The same by entry id; ids of entries gone already are passed over.
  absl::Status DeleteById(const std::vector<int64_t>& entry_ids, FreedBlobs& freed);
  // Deletes the blobs of `candidate_ids` that no entry uses any more, and the
  // records of their served copies. In the caller's transaction.
  absl::StatusOr<FreedBlobs> DeleteOrphanBlobs(const std::vector<int64_t>& candidate_ids);
  // After the transaction that freed them committed: the totals are lowered,
  // the blob files removed (a file held open stays, recorded, and is tried
  // again), served index entries and links removed, and served copies kept
  // through their grace for a reader that found them a moment ago.
  void Release(const FreedBlobs& freed);

  // Tries again to remove the files whose removal failed.
  void RetryLeftovers();
  // Removes the served copies past their grace (`all`: every one, at a stop).
  void RemoveCopiesPastGrace(bool all);

 private:
  // Whether a file let go of is stored or served again since under its
  // content-addressed name: then it is in use, and counted where it is
  // recorded now.
  bool RecordedAgain(const std::filesystem::path& path);

  Parts parts_;
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_ENTRY_REMOVAL_H_
