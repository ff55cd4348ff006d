#ifndef KILN_CACHE_STORE_SCHEMA_H_
#define KILN_CACHE_STORE_SCHEMA_H_

// The artifact store's index, kiln.db: its schema, the migrations from
// versions 1 and 2, and the open that brings a database to the current version. Internal to
// the artifact store (artifact_store*.cc, store_*.cc).

#include <cstdint>
#include <filesystem>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/sqlite.h"

namespace kiln::cache::store_internal {

// The WAL is checkpointed (WalCheckpointer) once a commit leaves it at
// WalCheckpointPages(cap) pages: a thirty-second of the cap, from SQLite's
// default for its own autocheckpoint (1,000 pages, at caps up to 128 MiB) to
// 64 MiB. Puts and evictions change index pages scattered over the whole
// index (keys and digests are random), and a checkpoint copies each page it
// finds once, however many commits wrote it since the last: in a replica of
// eviction at 300k entries, 8,000 pages in place of 1,000 made it 1.6x
// faster, 32,000 pages 2x. A thirty-second keeps what the WAL adds to the
// disk near the cap it counts against.
inline constexpr int kMinWalCheckpointPages = 1000;
inline constexpr int kMaxWalCheckpointPages = 16384;
int WalCheckpointPages(uint64_t max_size_bytes);

struct OpenedIndex {
  std::unique_ptr<sqlite::Database> db;
  // The schema version the database had before this open; 0 for a new one.
  int64_t found_version = 0;
};

// Opens the index at `path`, set up to give freed pages back and to keep its
// WAL small, with its schema brought to the current version.
// `retire_served_files` runs once the migration of a database whose served
// files are not where this version serves them (versions 1 and 2) has
// committed. FAILED_PRECONDITION when the database has a newer schema.
absl::StatusOr<OpenedIndex> OpenIndex(const std::filesystem::path& path,
                                      absl::Duration busy_timeout,
                                      absl::FunctionRef<void()> retire_served_files);

}  // namespace kiln::cache::store_internal

#endif  // KILN_CACHE_STORE_SCHEMA_H_
