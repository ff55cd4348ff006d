#ifndef KILN_CACHE_SQLITE_H_
#define KILN_CACHE_SQLITE_H_

// Thin RAII over the SQLite C API: a connection, prepared statements with bound
// parameters, and transactions that roll back unless committed.

#include <sqlite3.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kiln::sqlite {

class Statement {
 public:
  Statement() = default;
  Statement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&& other) noexcept;
  ~Statement();

  // Parameters are 1-based, as in SQLite. Text and blobs are copied by SQLite
  // only when the statement outlives them, so callers keep them alive until Step().
  Statement& Bind(int index, int64_t value);
  Statement& BindText(int index, absl::string_view value);
  Statement& BindBlob(int index, absl::string_view value);
  Statement& BindNull(int index);

  // Advances; true while a row is available, false when done.
  absl::StatusOr<bool> Step();
  // Runs a statement that returns no rows, then resets it for reuse.
  absl::Status Run();
  // Runs a statement that returns one row at most: its first column as an
  // integer, nullopt when there is no row; then resets it for reuse.
  absl::StatusOr<std::optional<int64_t>> RunForInt();
  void Reset();

  int64_t ColumnInt(int column) const;
  // Views stay valid until the next Step() or Reset().
  absl::string_view ColumnText(int column) const;
  absl::string_view ColumnBlob(int column) const;
  bool ColumnIsNull(int column) const;

 private:
  sqlite3* db_ = nullptr;
  sqlite3_stmt* stmt_ = nullptr;
};

class Database {
 public:
  // Opens (creating if absent) a database in WAL mode with a finite busy timeout
  // and foreign keys on.
  static absl::StatusOr<std::unique_ptr<Database>> Open(const std::filesystem::path& path,
                                                        absl::Duration busy_timeout);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  absl::Status Exec(absl::string_view sql);
  absl::StatusOr<Statement> Prepare(absl::string_view sql);
  int64_t ChangedRows() const { return sqlite3_changes64(db_); }
  int64_t LastInsertId() const { return sqlite3_last_insert_rowid(db_); }
  absl::Status Error(absl::string_view what) const;

  // After each commit of this connection, calls `on_commit` with the WAL's
  // size in pages instead of checkpointing it itself (SQLite's autocheckpoint):
  // whoever gets the call checkpoints, so the commit does not wait for it.
  void OnWalCommit(std::function<void(int wal_pages)> on_commit);
  // Copies what it can of the WAL into the database without waiting for
  // readers or writers (PASSIVE), and syncs the database file. Returns how
  // many of the WAL's pages it could not copy yet (written meanwhile).
  absl::StatusOr<int> CheckpointPassively();
  // Copies all of the WAL into the database, cuts the database file to its
  // pages and the WAL to nothing, waiting for readers and writers as the busy
  // timeout allows (TRUNCATE). False when they kept it from finishing.
  absl::StatusOr<bool> CheckpointAndTruncate();

 private:
  explicit Database(sqlite3* db) : db_(db) {}
  sqlite3* db_;
  std::function<void(int)> on_wal_commit_;
};

// BEGIN IMMEDIATE on construction (so a writer fails fast on the busy timeout
// rather than deadlocking on upgrade), ROLLBACK on destruction unless Commit().
class Transaction {
 public:
  static absl::StatusOr<Transaction> Begin(Database& db);
  Transaction(Transaction&& other) noexcept : db_(std::exchange(other.db_, nullptr)) {}
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction();
  absl::Status Commit();

 private:
  explicit Transaction(Database& db) : db_(&db) {}
  Database* db_;
};

// Row ids as a JSON array, to bind as a set a statement walks with
// json_each(?N): one prepared statement for any number of ids.
std::string IdsAsJson(const std::vector<int64_t>& ids);

}  // namespace kiln::sqlite

#endif  // KILN_CACHE_SQLITE_H_
