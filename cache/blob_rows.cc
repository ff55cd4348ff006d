#include "cache/blob_rows.h"

#include "common/status_macros.h"

namespace kiln::cache {

std::string PlaceholderKey(int64_t blob_id) {
  std::string key(1, '\0');
  for (int shift = 56; shift >= 0; shift -= 8) {
    key.push_back(static_cast<char>(static_cast<uint64_t>(blob_id) >> shift));
  }
  return key;
}

absl::Status BlobRows::Prepare(sqlite::Database& writer) {
  ASSIGN_OR_RETURN(find_, writer.Prepare("SELECT id FROM blobs WHERE digest = ?1"));
  ASSIGN_OR_RETURN(insert_, writer.Prepare("INSERT INTO blobs (digest, size, stored_size, codec, "
                                           "location, data, id, content_digest) "
                                           "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"));
  // The row keyed by placeholder ?1, its stored size, and the row keyed by
  // its content, if any.
  ASSIGN_OR_RETURN(placeholder_row_,
                   writer.Prepare("SELECT b.id, b.stored_size, c.id FROM blobs b "
                                  "LEFT JOIN blobs c ON c.digest = b.content_digest "
                                  "WHERE b.digest = ?1"));
  ASSIGN_OR_RETURN(key_by_content_,
                   writer.Prepare("UPDATE blobs SET digest = content_digest, content_digest = NULL "
                                  "WHERE id = ?1"));
  ASSIGN_OR_RETURN(move_references_,
                   writer.Prepare("UPDATE entry_blobs SET blob_id = ?2 WHERE blob_id = ?1"));
  // Of the rows ?1, those no entry uses: a row per served copy (extension
  // NULL when it has none), a blob's rows one after another.
  ASSIGN_OR_RETURN(orphans_,
                   writer.Prepare("SELECT b.id, b.digest, b.stored_size, b.location, s.extension, "
                                  "s.disk_bytes FROM blobs b "
                                  "LEFT JOIN served_copies s ON s.blob_id = b.id "
                                  "WHERE b.id IN (SELECT value FROM json_each(?1)) AND NOT EXISTS "
                                  "(SELECT 1 FROM entry_blobs WHERE blob_id = b.id) ORDER BY b.id"));
  ASSIGN_OR_RETURN(delete_,
                   writer.Prepare("DELETE FROM blobs WHERE id IN (SELECT value FROM json_each(?1))"));
  ASSIGN_OR_RETURN(entries_naming_,
                   writer.Prepare("SELECT b.id, eb.entry_id FROM blobs b "
                                  "LEFT JOIN entry_blobs eb ON eb.blob_id = b.id WHERE b.digest = ?1"));
  ASSIGN_OR_RETURN(file_blob_exists_,
                   writer.Prepare("SELECT 1 FROM blobs WHERE digest = ?1 AND location = 1"));
  ASSIGN_OR_RETURN(sqlite::Statement last_id, writer.Prepare("SELECT ifnull(max(id), 0) FROM blobs"));
  ASSIGN_OR_RETURN(bool has_row, last_id.Step());
  next_id_ = (has_row ? last_id.ColumnInt(0) : 0) + 1;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> BlobRows::Find(absl::string_view key) {
  return find_.BindBlob(1, key).RunForInt();
}

absl::StatusOr<int64_t> BlobRows::Insert(PreparedBlob& blob, bool keyed_by_content) {
  const int64_t id = next_id_;
  if (!keyed_by_content) blob.store_key = PlaceholderKey(id);
  insert_.BindBlob(1, keyed_by_content ? blob.digest : blob.store_key)
      .Bind(2, static_cast<int64_t>(blob.size))
      .Bind(3, static_cast<int64_t>(blob.stored_size))
      .Bind(4, blob.codec)
      .Bind(5, static_cast<int64_t>(blob.location))
      .Bind(7, id);
  if (blob.location == BlobLocation::kInline) {
    insert_.BindBlob(6, blob.stored);
  } else {
    insert_.BindNull(6);
  }
  if (keyed_by_content) {
    insert_.BindNull(8);
  } else {
    insert_.BindBlob(8, blob.digest);
  }
  RETURN_IF_ERROR(insert_.Run());
  ++next_id_;
  return id;
}

absl::Status BlobRows::KeyByContent(absl::string_view placeholder, Merged& merged) {
  placeholder_row_.BindBlob(1, placeholder);
  ASSIGN_OR_RETURN(bool found, placeholder_row_.Step());
  const int64_t row = found ? placeholder_row_.ColumnInt(0) : -1;
  const auto stored_size = found ? static_cast<uint64_t>(placeholder_row_.ColumnInt(1)) : 0;
  // The content's row, if one has its key already (file blobs, blobs served before).
  const bool shared = found && !placeholder_row_.ColumnIsNull(2);
  const int64_t content_row = shared ? placeholder_row_.ColumnInt(2) : -1;
  placeholder_row_.Reset();
  if (!found) return absl::OkStatus();  // keyed by content by a lookup before, or evicted
  if (!shared) return key_by_content_.Bind(1, row).Run();
  RETURN_IF_ERROR(move_references_.Bind(1, row).Bind(2, content_row).Run());
  RETURN_IF_ERROR(delete_.BindText(1, sqlite::IdsAsJson({row})).Run());
  merged.stored_bytes += stored_size;
  ++merged.rows;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BlobRows::Orphan>> BlobRows::DeleteOrphans(
    const std::vector<int64_t>& candidate_ids) {
  std::vector<Orphan> orphans;
  if (candidate_ids.empty()) return orphans;
  const std::string candidates = sqlite::IdsAsJson(candidate_ids);  // bound, not copied
  orphans_.BindText(1, candidates);
  absl::StatusOr<bool> row;
  while ((row = orphans_.Step()).ok() && *row) {
    const int64_t id = orphans_.ColumnInt(0);
    if (orphans.empty() || orphans.back().id != id) {  // its first row
      Orphan& orphan = orphans.emplace_back();
      orphan.id = id;
      orphan.key = std::string(orphans_.ColumnBlob(1));
      orphan.stored_size = static_cast<uint64_t>(orphans_.ColumnInt(2));
      orphan.location = static_cast<BlobLocation>(orphans_.ColumnInt(3));
    }
    if (!orphans_.ColumnIsNull(4)) {
      orphans.back().served_copies.emplace_back(std::string(orphans_.ColumnText(4)),
                                                static_cast<uint64_t>(orphans_.ColumnInt(5)));
    }
  }
  orphans_.Reset();
  RETURN_IF_ERROR(row.status());
  if (orphans.empty()) return orphans;
  std::vector<int64_t> ids;
  ids.reserve(orphans.size());
  for (const Orphan& orphan : orphans) ids.push_back(orphan.id);
  const std::string orphan_ids = sqlite::IdsAsJson(ids);
  RETURN_IF_ERROR(delete_.BindText(1, orphan_ids).Run());
  return orphans;
}

absl::StatusOr<BlobRows::Users> BlobRows::EntriesNaming(absl::string_view key) {
  Users users;
  entries_naming_.BindBlob(1, key);
  absl::StatusOr<bool> row;
  while ((row = entries_naming_.Step()).ok() && *row) {
    users.blob_id = entries_naming_.ColumnInt(0);
    if (!entries_naming_.ColumnIsNull(1)) users.entry_ids.push_back(entries_naming_.ColumnInt(1));
  }
  entries_naming_.Reset();
  RETURN_IF_ERROR(row.status());
  return users;
}

absl::StatusOr<bool> BlobRows::IsFileBlob(absl::string_view digest) {
  file_blob_exists_.BindBlob(1, digest);
  absl::StatusOr<bool> found = file_blob_exists_.Step();
  file_blob_exists_.Reset();
  return found;
}

}  // namespace kiln::cache
