#ifndef KILN_CACHE_INDEX_READERS_H_
#define KILN_CACHE_INDEX_READERS_H_

// The index's read connections: a pool that grows to the peak number of
// concurrent lookups, each connection with its prepared statements. In WAL
// mode a reader sees the last committed state and never waits for the
// writer, so lookups go on while puts and eviction commit. A lease gives a
// connection back to the pool when it ends.
//
// Internal to the artifact store. Thread-safe.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cache/sqlite.h"

namespace kiln::cache {

class IndexReaders {
 public:
  struct Reader {
    std::unique_ptr<sqlite::Database> db;
    // (ns ?1, key ?2): a row per blob of the entry, by name: entry id,
    // created_ms, blob name, content digest, size, codec, location, inline
    // data, the row's key. One statement is one read transaction, so
    // eviction cannot remove a blob between the manifest and its rows.
    sqlite::Statement entry_blobs;
    // The id of the entry (ns, key); nullopt when it is not stored.
    absl::StatusOr<std::optional<int64_t>> FindEntry(absl::string_view ns, absl::string_view key);

   private:
    friend class IndexReaders;
    sqlite::Statement find_entry_;
  };

  class Lease {
   public:
    Lease(IndexReaders* pool, std::unique_ptr<Reader> reader)
        : pool_(pool), reader_(std::move(reader)) {}
    Lease(Lease&&) = default;
    ~Lease() {
      if (reader_) pool_->Release(std::move(reader_));
    }
    Reader* operator->() { return reader_.get(); }
    Reader& operator*() { return *reader_; }

   private:
    IndexReaders* pool_;
    std::unique_ptr<Reader> reader_;
  };

  IndexReaders(std::filesystem::path index_path, absl::Duration busy_timeout)
      : index_path_(std::move(index_path)), busy_timeout_(busy_timeout) {}

  // An idle connection, or a new one when every one is leased.
  absl::StatusOr<Lease> Acquire();
  // Connections open and not leased.
  size_t idle() const;

 private:
  void Release(std::unique_ptr<Reader> reader);
  absl::StatusOr<std::unique_ptr<Reader>> Open() const;

  const std::filesystem::path index_path_;
  const absl::Duration busy_timeout_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Reader>> idle_;  // guarded by mutex_
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_INDEX_READERS_H_
