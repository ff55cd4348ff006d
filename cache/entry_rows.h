#ifndef KILN_CACHE_ENTRY_ROWS_H_
#define KILN_CACHE_ENTRY_ROWS_H_

// The index's entry rows: the entries table (an entry's names, when it was
// made, its last use on the LRU clock, its served index) and entry_blobs
// (the blobs it names, by name). Entries are found, made (a put replaces the
// entry of its names), touched, listed a page at a time, and deleted a set
// at a time. Its statements are prepared on the store's writer connection
// and run in the writer's transactions; the caller holds the writer.
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
#include "cache/sqlite.h"

namespace kiln::cache {

class EntryRows {
 public:
  // Prepares the statements on `writer`, which must outlive them.
  absl::Status Prepare(sqlite::Database& writer);

  // An entry's served index entry and link (served_files.h), as its row
  // records them: a new entry of the same names takes them over.
  struct ServedIndex {
    uint64_t disk_bytes = 0;
    std::optional<std::string> link_extension;
    std::optional<std::string> index_namespace;
  };
  struct Found {
    int64_t id = 0;
    ServedIndex served_index;
  };
  // The entry (ns, key); nullopt when none is stored.
  absl::StatusOr<std::optional<Found>> Find(absl::string_view ns, absl::string_view key);
  // Makes the row of a new entry; returns its id.
  absl::StatusOr<int64_t> Insert(absl::string_view ns, absl::string_view key, int64_t created_ms,
                                 int64_t last_use, const ServedIndex& served_index);
  // Entry `entry_id` names blob `blob_id` `name`.
  absl::Status Name(int64_t entry_id, absl::string_view name, int64_t blob_id);
  // The entries `entry_ids` go, with what they name. Appends the ids of the
  // blobs they named to `named_blob_ids`, each once: candidates for orphans.
  absl::Status Delete(const std::vector<int64_t>& entry_ids, std::vector<int64_t>& named_blob_ids);
  // Entry `entry_id` was used at `last_use` (the LRU clock), unless it was
  // used later already.
  absl::Status Touch(int64_t entry_id, int64_t last_use);

  // The blobs of entry (ns, key): name, content digest.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Blobs(absl::string_view ns,
                                                                        absl::string_view key);

  struct Listed {
    int64_t id = 0;
    std::string ns;
    std::string key;
    int64_t created_ms = 0;
  };
  // Up to `limit` entries whose namespace is in [from, to), made at or after
  // `since_ms`, with ids above `after_id`, by id.
  absl::StatusOr<std::vector<Listed>> ListAfter(absl::string_view from, absl::string_view to,
                                                int64_t since_ms, int64_t after_id, int64_t limit);

 private:
  sqlite::Database* writer_ = nullptr;
  sqlite::Statement find_;
  sqlite::Statement insert_;
  sqlite::Statement name_;
  sqlite::Statement named_blobs_;
  sqlite::Statement delete_names_;
  sqlite::Statement delete_;
  sqlite::Statement touch_;
  sqlite::Statement blobs_;
  sqlite::Statement list_after_;
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_ENTRY_ROWS_H_
