#ifndef KILN_CACHE_EVICTION_CANDIDATES_H_
#define KILN_CACHE_EVICTION_CANDIDATES_H_

// What eviction chooses from: the index's least recently used entries, the
// store's or one trust domain's (StoreOptions::max_domain_bytes), what each
// one's going frees, and what a domain holds. The Evictor (evictor.h)
// takes a batch of them in one transaction of the writer's; LruPolicy says
// how many of a batch go. Its statements are prepared on the store's writer
// connection and run in the writer's transactions; the caller holds the
// writer.
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

// An entry's names, and those of its served index entry (served_files.h):
// what goes from the served files with it.
struct EntryNames {
  std::string ns;
  std::string key;
  std::optional<std::string> index_namespace;
  std::optional<std::string> link_extension;
};

// An entry eviction may take: what its going frees besides its blobs' rows.
struct EntryToEvict {
  int64_t id = 0;
  EntryNames names;
  uint64_t index_disk_bytes = 0;  // its served index entry and link
  // What its blobs store, shared ones included: what its going frees at most
  // besides its served copies, to know how many entries a batch takes.
  uint64_t stored_bytes = 0;
};

class EvictionCandidates {
 public:
  // Prepares the statements on `writer`, which must outlive them.
  absl::Status Prepare(sqlite::Database& writer);

  // The store's `limit` least recently used entries, least recent first.
  absl::StatusOr<std::vector<EntryToEvict>> LeastRecentlyUsed(int limit);
  // Those of trust domain `domain` (its namespaces are "<domain>/...").
  absl::StatusOr<std::vector<EntryToEvict>> LeastRecentlyUsedOf(absl::string_view domain, int limit);
  // The entries of `entry_ids` still stored, in no particular order.
  absl::StatusOr<std::vector<EntryToEvict>> ById(const std::vector<int64_t>& entry_ids);
  // The stored bytes of the blobs `domain`'s entries name, each once an entry
  // (what its cap counts).
  absl::StatusOr<uint64_t> DomainBytes(absl::string_view domain);

  // What each entry's going frees at most, for LruPolicy::EntriesToFree: a
  // blob another entry shares counts in full (the evictor measures again
  // after the batch). A domain's cap counts blobs only; the store's size
  // counts served index files and links too.
  enum class IndexFiles { kCounted, kNotCounted };
  static std::vector<uint64_t> BytesFreedByEach(const std::vector<EntryToEvict>& entries,
                                                IndexFiles index_files);

 private:
  sqlite::Statement least_recently_used_;
  sqlite::Statement least_recently_used_in_range_;
  sqlite::Statement by_id_;
  sqlite::Statement bytes_in_range_;
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_EVICTION_CANDIDATES_H_
