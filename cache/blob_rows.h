#ifndef KILN_CACHE_BLOB_ROWS_H_
#define KILN_CACHE_BLOB_ROWS_H_

// The index's blob rows (the blobs table). A row is keyed by its content's
// SHA-256, and shared by the entries that name it, except a small (inline)
// blob of one entry that no local client has read as a file: that row is
// keyed by a placeholder made of its id (PlaceholderKey), its digest in
// content_digest, so that new rows append to the key index and old ones
// leave from its front (store_schema.cc says why). Rows are found, inserted,
// keyed by content when served as files, and deleted once no entry names
// them. Its statements are prepared on the store's writer connection and run
// in the writer's transactions; the caller holds the writer.
//
// Internal to the artifact store.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cache/blob_storage.h"
#include "cache/sqlite.h"

namespace kiln::cache {

// The key of a row not keyed by its content's digest: a zero byte and its
// id, big-endian (9 bytes), so that keys ascend with ids. A SHA-256 digest
// has 32 bytes: no placeholder is ever one.
std::string PlaceholderKey(int64_t blob_id);

class BlobRows {
 public:
  // Prepares the statements on `writer`, which must outlive them, and finds
  // the id the next row takes.
  absl::Status Prepare(sqlite::Database& writer);

  // The id of the row keyed `key` (a content digest or a placeholder).
  absl::StatusOr<std::optional<int64_t>> Find(absl::string_view key);
  // Inserts the row of `blob`, keyed by its content when `keyed_by_content`,
  // else by the placeholder of its new id, which becomes blob.store_key.
  // Returns its id.
  absl::StatusOr<int64_t> Insert(PreparedBlob& blob, bool keyed_by_content);

  // Placeholder rows folded into the row of their content (KeyByContent).
  struct Merged {
    uint64_t stored_bytes = 0;
    uint64_t rows = 0;
  };
  // Keys the row of `placeholder` by its content, or where a row has that key
  // already, moves its entries there and deletes it (`merged` counts it);
  // nothing when the row went.
  absl::Status KeyByContent(absl::string_view placeholder, Merged& merged);

  // A row no entry names any more, as DeleteOrphans deleted it.
  struct Orphan {
    int64_t id = 0;
    std::string key;
    uint64_t stored_size = 0;
    BlobLocation location = BlobLocation::kInline;
    // Its served copies (served_copies): extension, disk bytes.
    std::vector<std::pair<std::string, uint64_t>> served_copies;
  };
  // Of the rows `candidate_ids`, deletes those no entry names any more, and
  // returns them. Their served copies' records are the caller's to forget.
  absl::StatusOr<std::vector<Orphan>> DeleteOrphans(const std::vector<int64_t>& candidate_ids);

  // The row keyed `key`, and the entries that name it (none when it is none's).
  struct Users {
    std::optional<int64_t> blob_id;
    std::vector<int64_t> entry_ids;
  };
  absl::StatusOr<Users> EntriesNaming(absl::string_view key);
  // Whether a blob file of content `digest` is stored (its row's location).
  absl::StatusOr<bool> IsFileBlob(absl::string_view digest);

 private:
  sqlite::Statement find_;
  sqlite::Statement insert_;
  sqlite::Statement placeholder_row_;
  sqlite::Statement key_by_content_;
  sqlite::Statement move_references_;
  sqlite::Statement orphans_;
  sqlite::Statement delete_;
  sqlite::Statement entries_naming_;
  sqlite::Statement file_blob_exists_;
  int64_t next_id_ = 1;  // a new row's, which its placeholder key is made of
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_BLOB_ROWS_H_
