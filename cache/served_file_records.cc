#include "cache/served_file_records.h"

#include "common/status_macros.h"

namespace kiln::cache {

absl::Status ServedFileRecords::Prepare(sqlite::Database& writer) {
  writer_ = &writer;
  // Nothing when the blob went meanwhile.
  ASSIGN_OR_RETURN(record_copy_, writer.Prepare("INSERT OR REPLACE INTO served_copies "
                                                "(blob_id, extension, disk_bytes) "
                                                "SELECT id, ?2, ?3 FROM blobs WHERE digest = ?1"));
  ASSIGN_OR_RETURN(copy_recorded_, writer.Prepare("SELECT 1 FROM served_copies c "
                                                  "JOIN blobs b ON b.id = c.blob_id "
                                                  "WHERE b.digest = ?1 AND c.extension = ?2"));
  ASSIGN_OR_RETURN(forget_copies_, writer.Prepare("DELETE FROM served_copies WHERE blob_id IN "
                                                  "(SELECT value FROM json_each(?1))"));
  ASSIGN_OR_RETURN(record_index_,
                   writer.Prepare("UPDATE entries SET index_disk_bytes = ?3, link_extension = ?4, "
                                  "index_namespace = ?5 WHERE namespace = ?1 AND key = ?2"));
  return absl::OkStatus();
}

absl::StatusOr<bool> ServedFileRecords::RecordCopy(absl::string_view digest,
                                                   absl::string_view extension,
                                                   uint64_t disk_bytes) {
  RETURN_IF_ERROR(record_copy_.BindBlob(1, digest)
                      .BindText(2, extension)
                      .Bind(3, static_cast<int64_t>(disk_bytes))
                      .Run());
  return writer_->ChangedRows() != 0;
}

absl::StatusOr<bool> ServedFileRecords::IsCopyRecorded(absl::string_view digest,
                                                       absl::string_view extension) {
  copy_recorded_.BindBlob(1, digest).BindText(2, extension);
  absl::StatusOr<bool> found = copy_recorded_.Step();
  copy_recorded_.Reset();
  return found;
}

absl::Status ServedFileRecords::ForgetCopiesOf(const std::vector<int64_t>& blob_ids) {
  if (blob_ids.empty()) return absl::OkStatus();
  return forget_copies_.BindText(1, sqlite::IdsAsJson(blob_ids)).Run();
}

absl::StatusOr<bool> ServedFileRecords::RecordIndex(absl::string_view ns, absl::string_view key,
                                                    const ServedFiles::IndexFootprint& footprint,
                                                    absl::string_view index_namespace) {
  record_index_.BindText(1, ns).BindText(2, key).Bind(3, static_cast<int64_t>(footprint.disk_bytes));
  if (footprint.link_extension.has_value()) {
    record_index_.BindText(4, *footprint.link_extension);
  } else {
    record_index_.BindNull(4);
  }
  RETURN_IF_ERROR(record_index_.BindText(5, index_namespace).Run());
  return writer_->ChangedRows() != 0;
}

}  // namespace kiln::cache
