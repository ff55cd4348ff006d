#include "cache/index_readers.h"

#include "common/status_macros.h"

namespace kiln::cache {

absl::StatusOr<std::optional<int64_t>> IndexReaders::Reader::FindEntry(absl::string_view ns,
                                                                       absl::string_view key) {
  return find_entry_.BindText(1, ns).BindText(2, key).RunForInt();
}

absl::StatusOr<IndexReaders::Lease> IndexReaders::Acquire() {
  {
    std::lock_guard lock(mutex_);
    if (!idle_.empty()) {
      std::unique_ptr<Reader> reader = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(reader));
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader, Open());
  return Lease(this, std::move(reader));
}

size_t IndexReaders::idle() const {
  std::lock_guard lock(mutex_);
  return idle_.size();
}

void IndexReaders::Release(std::unique_ptr<Reader> reader) {
  std::lock_guard lock(mutex_);
  idle_.push_back(std::move(reader));
}

absl::StatusOr<std::unique_ptr<IndexReaders::Reader>> IndexReaders::Open() const {
  auto reader = std::make_unique<Reader>();
  ASSIGN_OR_RETURN(reader->db, sqlite::Database::Open(index_path_, busy_timeout_));
  ASSIGN_OR_RETURN(reader->entry_blobs,
                   reader->db->Prepare(
                       "SELECT e.id, e.created_ms, eb.name, coalesce(b.content_digest, b.digest), "
                       "b.size, b.codec, b.location, b.data, b.digest FROM entries e "
                       "JOIN entry_blobs eb ON eb.entry_id = e.id "
                       "JOIN blobs b ON b.id = eb.blob_id "
                       "WHERE e.namespace = ?1 AND e.key = ?2 ORDER BY eb.name"));
  ASSIGN_OR_RETURN(reader->find_entry_,
                   reader->db->Prepare("SELECT id FROM entries WHERE namespace = ?1 AND key = ?2"));
  return reader;
}

}  // namespace kiln::cache
