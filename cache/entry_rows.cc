#include "cache/entry_rows.h"

#include "common/status_macros.h"

namespace kiln::cache {

absl::Status EntryRows::Prepare(sqlite::Database& writer) {
  writer_ = &writer;
  ASSIGN_OR_RETURN(find_, writer.Prepare("SELECT id, index_disk_bytes, link_extension, index_namespace "
                                         "FROM entries WHERE namespace = ?1 AND key = ?2"));
  ASSIGN_OR_RETURN(insert_,
                   writer.Prepare("INSERT INTO entries (namespace, key, created_ms, last_use, "
                                  "index_disk_bytes, link_extension, index_namespace) "
                                  "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"));
  ASSIGN_OR_RETURN(name_, writer.Prepare("INSERT INTO entry_blobs (entry_id, name, blob_id) "
                                         "VALUES (?1, ?2, ?3)"));
  // Entries go a set at a time, their ids a JSON array (?1): a statement per
  // entry and blob was a third of eviction's CPU time. Not one DELETE ...
  // RETURNING: SQLite gathers a RETURNING's rows in a temporary b-tree, and
  // with it the heap grew and was trimmed back each time (18% of eviction's
  // time when it was one per entry).
  ASSIGN_OR_RETURN(named_blobs_, writer.Prepare("SELECT DISTINCT blob_id FROM entry_blobs "
                                                "WHERE entry_id IN (SELECT value FROM json_each(?1))"));
  ASSIGN_OR_RETURN(delete_names_, writer.Prepare("DELETE FROM entry_blobs "
                                                 "WHERE entry_id IN (SELECT value FROM json_each(?1))"));
  ASSIGN_OR_RETURN(delete_,
                   writer.Prepare("DELETE FROM entries WHERE id IN (SELECT value FROM json_each(?1))"));
  ASSIGN_OR_RETURN(touch_,
                   writer.Prepare("UPDATE entries SET last_use = max(last_use, ?2) WHERE id = ?1"));
  ASSIGN_OR_RETURN(blobs_, writer.Prepare("SELECT eb.name, coalesce(b.content_digest, b.digest) "
                                          "FROM entries e JOIN entry_blobs eb ON eb.entry_id = e.id "
                                          "JOIN blobs b ON b.id = eb.blob_id "
                                          "WHERE e.namespace = ?1 AND e.key = ?2"));
  ASSIGN_OR_RETURN(list_after_,
                   writer.Prepare("SELECT id, namespace, key, created_ms FROM entries "
                                  "WHERE namespace >= ?1 AND namespace < ?2 AND created_ms >= ?3 "
                                  "AND id > ?4 ORDER BY id LIMIT ?5"));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<EntryRows::Found>> EntryRows::Find(absl::string_view ns,
                                                                absl::string_view key) {
  find_.BindText(1, ns).BindText(2, key);
  absl::StatusOr<bool> row = find_.Step();
  std::optional<Found> found;
  if (row.ok() && *row) {
    found.emplace();
    found->id = find_.ColumnInt(0);
    found->served_index.disk_bytes = static_cast<uint64_t>(find_.ColumnInt(1));
    if (!find_.ColumnIsNull(2)) found->served_index.link_extension = std::string(find_.ColumnText(2));
    if (!find_.ColumnIsNull(3)) found->served_index.index_namespace = std::string(find_.ColumnText(3));
  }
  find_.Reset();
  RETURN_IF_ERROR(row.status());
  return found;
}

absl::StatusOr<int64_t> EntryRows::Insert(absl::string_view ns, absl::string_view key,
                                          int64_t created_ms, int64_t last_use,
                                          const ServedIndex& served_index) {
  insert_.BindText(1, ns).BindText(2, key).Bind(3, created_ms).Bind(4, last_use);
  insert_.Bind(5, static_cast<int64_t>(served_index.disk_bytes));
  if (served_index.link_extension.has_value()) {
    insert_.BindText(6, *served_index.link_extension);
  } else {
    insert_.BindNull(6);
  }
  if (served_index.index_namespace.has_value()) {
    insert_.BindText(7, *served_index.index_namespace);
  } else {
    insert_.BindNull(7);
  }
  RETURN_IF_ERROR(insert_.Run());
  return writer_->LastInsertId();
}

absl::Status EntryRows::Name(int64_t entry_id, absl::string_view name, int64_t blob_id) {
  return name_.Bind(1, entry_id).BindText(2, name).Bind(3, blob_id).Run();
}

absl::Status EntryRows::Delete(const std::vector<int64_t>& entry_ids,
                               std::vector<int64_t>& named_blob_ids) {
  if (entry_ids.empty()) return absl::OkStatus();
  const std::string ids = sqlite::IdsAsJson(entry_ids);  // bound, not copied
  named_blobs_.BindText(1, ids);
  absl::StatusOr<bool> row;
  while ((row = named_blobs_.Step()).ok() && *row) named_blob_ids.push_back(named_blobs_.ColumnInt(0));
  named_blobs_.Reset();
  RETURN_IF_ERROR(row.status());
  RETURN_IF_ERROR(delete_names_.BindText(1, ids).Run());
  return delete_.BindText(1, ids).Run();
}

absl::Status EntryRows::Touch(int64_t entry_id, int64_t last_use) {
  return touch_.Bind(1, entry_id).Bind(2, last_use).Run();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> EntryRows::Blobs(
    absl::string_view ns, absl::string_view key) {
  std::vector<std::pair<std::string, std::string>> named;
  blobs_.BindText(1, ns).BindText(2, key);
  absl::StatusOr<bool> row;
  while ((row = blobs_.Step()).ok() && *row) {
    named.emplace_back(std::string(blobs_.ColumnText(0)), std::string(blobs_.ColumnBlob(1)));
  }
  blobs_.Reset();
  RETURN_IF_ERROR(row.status());
  return named;
}

absl::StatusOr<std::vector<EntryRows::Listed>> EntryRows::ListAfter(absl::string_view from,
                                                                    absl::string_view to,
                                                                    int64_t since_ms,
                                                                    int64_t after_id, int64_t limit) {
  list_after_.BindText(1, from).BindText(2, to).Bind(3, since_ms).Bind(4, after_id).Bind(5, limit);
  std::vector<Listed> entries;
  absl::StatusOr<bool> row;
  while ((row = list_after_.Step()).ok() && *row) {
    entries.push_back({list_after_.ColumnInt(0), std::string(list_after_.ColumnText(1)),
                       std::string(list_after_.ColumnText(2)), list_after_.ColumnInt(3)});
  }
  list_after_.Reset();
  RETURN_IF_ERROR(row.status());
  return entries;
}

}  // namespace kiln::cache
