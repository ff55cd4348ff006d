#ifndef KILN_CACHE_IMPORT_JOURNAL_H_
#define KILN_CACHE_IMPORT_JOURNAL_H_

// The journal of imports under way (the imported_entries table): each entry
// an import stores is journaled in the same transaction, so that an import
// that fails, or that a stop or a crash cuts short, can take back what it
// stored, and a bundle's entries are stored all or none. Its statements are
// prepared on the store's writer connection and run in the writer's
// transactions; the caller holds the writer.
//
// Internal to the artifact store.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cache/sqlite.h"

namespace kiln::cache {

class ImportJournal {
 public:
  // Prepares the journal's statements on `writer`, which must outlive them.
  absl::Status Prepare(sqlite::Database& writer);

  // At the open, before any import begins: the imports journaled by a run
  // that stopped before they finished, for TakeUnfinished.
  absl::Status FindUnfinished();
  // What FindUnfinished found, once: the maintenance thread takes them back.
  std::vector<int64_t> TakeUnfinished();

  // Within the transaction that stores it: (ns, key) is import_id's.
  absl::Status Journal(int64_t import_id, absl::string_view ns, absl::string_view key);
  // The import's entries stay: their journal goes.
  absl::Status Finish(int64_t import_id);
  // Up to `limit` of the entries import_id stored, each forgotten by the
  // journal as it is returned: within the caller's transaction, which takes
  // them back. Empty once none is left.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> TakeBatch(int64_t import_id,
                                                                             int limit);

 private:
  sqlite::Statement journal_;
  sqlite::Statement entries_of_import_;
  sqlite::Statement forget_;
  sqlite::Statement finish_;
  sqlite::Statement unfinished_imports_;
  std::vector<int64_t> unfinished_;
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_IMPORT_JOURNAL_H_
