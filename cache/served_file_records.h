#ifndef KILN_CACHE_SERVED_FILE_RECORDS_H_
#define KILN_CACHE_SERVED_FILE_RECORDS_H_

// The index's records of the files a lookup serves to local clients
// (served_files.h): which served copies each blob has (the served_copies
// table), and what each entry's served index entry and link take (the index
// columns of the entries table). Eviction finds a blob's copies and an
// entry's index by them without reading a directory, and the open knows what
// they take on disk from its first second. ServedFiles writes the files;
// this records them. Its statements are prepared on the store's writer
// connection and run in the writer's transactions; the caller holds the
// writer.
//
// Internal to the artifact store.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cache/served_files.h"
#include "cache/sqlite.h"

namespace kiln::cache {

class ServedFileRecords {
 public:
  // Prepares the statements on `writer`, which must outlive them.
  absl::Status Prepare(sqlite::Database& writer);

  // Records the served copy of the blob keyed by `digest` (its content's)
  // with `extension`, taking `disk_bytes`, in place of one recorded before.
  // False when no such blob is stored (it went while the copy was written):
  // the caller removes the copy.
  absl::StatusOr<bool> RecordCopy(absl::string_view digest, absl::string_view extension,
                                  uint64_t disk_bytes);
  // Whether that copy is recorded.
  absl::StatusOr<bool> IsCopyRecorded(absl::string_view digest, absl::string_view extension);
  // Forgets the copies of the blobs `blob_ids` (their rows go).
  absl::Status ForgetCopiesOf(const std::vector<int64_t>& blob_ids);

  // Records the served index entry of (ns, key), written in the client
  // namespace `index_namespace`. False when the entry is not stored (it went
  // meanwhile): the caller removes the index entry.
  absl::StatusOr<bool> RecordIndex(absl::string_view ns, absl::string_view key,
                                   const ServedFiles::IndexFootprint& footprint,
                                   absl::string_view index_namespace);

 private:
  sqlite::Database* writer_ = nullptr;
  sqlite::Statement record_copy_;
  sqlite::Statement copy_recorded_;
  sqlite::Statement forget_copies_;
  sqlite::Statement record_index_;
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_SERVED_FILE_RECORDS_H_
