#include "cache/import_journal.h"

#include "common/status_macros.h"

namespace kiln::cache {

absl::Status ImportJournal::Prepare(sqlite::Database& writer) {
  ASSIGN_OR_RETURN(journal_, writer.Prepare("INSERT OR IGNORE INTO imported_entries "
                                            "(import_id, namespace, key) VALUES (?1, ?2, ?3)"));
  ASSIGN_OR_RETURN(entries_of_import_,
                   writer.Prepare("SELECT namespace, key FROM imported_entries "
                                  "WHERE import_id = ?1 LIMIT ?2"));
  ASSIGN_OR_RETURN(forget_, writer.Prepare("DELETE FROM imported_entries "
                                           "WHERE import_id = ?1 AND namespace = ?2 AND key = ?3"));
  ASSIGN_OR_RETURN(finish_, writer.Prepare("DELETE FROM imported_entries WHERE import_id = ?1"));
  ASSIGN_OR_RETURN(unfinished_imports_,
                   writer.Prepare("SELECT DISTINCT import_id FROM imported_entries"));
  return absl::OkStatus();
}

absl::Status ImportJournal::FindUnfinished() {
  absl::StatusOr<bool> row;
  while ((row = unfinished_imports_.Step()).ok() && *row) {
    unfinished_.push_back(unfinished_imports_.ColumnInt(0));
  }
  unfinished_imports_.Reset();
  return row.status();
}

std::vector<int64_t> ImportJournal::TakeUnfinished() {
  std::vector<int64_t> taken;
  taken.swap(unfinished_);
  return taken;
}

absl::Status ImportJournal::Journal(int64_t import_id, absl::string_view ns,
                                    absl::string_view key) {
  return journal_.Bind(1, import_id).BindText(2, ns).BindText(3, key).Run();
}

absl::Status ImportJournal::Finish(int64_t import_id) { return finish_.Bind(1, import_id).Run(); }

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ImportJournal::TakeBatch(
    int64_t import_id, int limit) {
  std::vector<std::pair<std::string, std::string>> names;
  entries_of_import_.Bind(1, import_id).Bind(2, limit);
  absl::StatusOr<bool> row;
  while ((row = entries_of_import_.Step()).ok() && *row) {
    names.emplace_back(std::string(entries_of_import_.ColumnText(0)),
                       std::string(entries_of_import_.ColumnText(1)));
  }
  entries_of_import_.Reset();
  RETURN_IF_ERROR(row.status());
  for (const auto& [ns, key] : names) {
    RETURN_IF_ERROR(forget_.Bind(1, import_id).BindText(2, ns).BindText(3, key).Run());
  }
  return names;
}

}  // namespace kiln::cache
