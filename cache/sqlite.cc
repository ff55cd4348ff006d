#include "cache/sqlite.h"

#include <utility>

#include "absl/strings/str_format.h"

namespace kiln::sqlite {

Statement::Statement(Statement&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)), stmt_(std::exchange(other.stmt_, nullptr)) {}

Statement& Statement::operator=(Statement&& other) noexcept {
  if (this != &other) {
    sqlite3_finalize(stmt_);
    db_ = std::exchange(other.db_, nullptr);
    stmt_ = std::exchange(other.stmt_, nullptr);
  }
  return *this;
}

Statement::~Statement() { sqlite3_finalize(stmt_); }

Statement& Statement::Bind(int index, int64_t value) {
  sqlite3_bind_int64(stmt_, index, value);
  return *this;
}

Statement& Statement::BindText(int index, absl::string_view value) {
  sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_STATIC, SQLITE_UTF8);
  return *this;
}

Statement& Statement::BindBlob(int index, absl::string_view value) {
  // A zero-length blob must bind as an empty blob, not NULL.
  static const char kEmpty = 0;
  sqlite3_bind_blob64(stmt_, index, value.empty() ? &kEmpty : value.data(), value.size(),
                      SQLITE_STATIC);
  return *this;
}

namespace {

// BUSY and LOCKED: another connection holds the database (try again); FULL:
// the disk is (the store counts those puts and says so).
absl::Status StatusOf(int rc, const std::string& message) {
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(message);
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(message + "; free disk space or lower max_cache_size");
    default:
      return absl::InternalError(message);
  }
}

}  // namespace

Statement& Statement::BindNull(int index) {
  sqlite3_bind_null(stmt_, index);
  return *this;
}

absl::StatusOr<bool> Statement::Step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  const std::string message = absl::StrFormat("sqlite step failed (%s): %s", sqlite3_errstr(rc),
                                              sqlite3_errmsg(db_));
  sqlite3_reset(stmt_);
  return StatusOf(rc, message);
}

absl::Status Statement::Run() {
  absl::StatusOr<bool> row = Step();
  Reset();
  return row.status();
}

absl::StatusOr<std::optional<int64_t>> Statement::RunForInt() {
  absl::StatusOr<bool> row = Step();
  const std::optional<int64_t> value =
      row.ok() && *row ? std::optional<int64_t>(ColumnInt(0)) : std::nullopt;
  Reset();
  if (!row.ok()) return row.status();
  return value;
}

void Statement::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

int64_t Statement::ColumnInt(int column) const { return sqlite3_column_int64(stmt_, column); }

absl::string_view Statement::ColumnText(int column) const {
  const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
  return text == nullptr ? absl::string_view()
                         : absl::string_view(text, sqlite3_column_bytes(stmt_, column));
}

absl::string_view Statement::ColumnBlob(int column) const {
  const auto* data = static_cast<const char*>(sqlite3_column_blob(stmt_, column));
  return data == nullptr ? absl::string_view()
                         : absl::string_view(data, sqlite3_column_bytes(stmt_, column));
}

bool Statement::ColumnIsNull(int column) const {
  return sqlite3_column_type(stmt_, column) == SQLITE_NULL;
}

absl::StatusOr<std::unique_ptr<Database>> Database::Open(const std::filesystem::path& path,
                                                         absl::Duration busy_timeout) {
  sqlite3* handle = nullptr;
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
  const int rc = sqlite3_open_v2(path.string().c_str(), &handle, flags, nullptr);
  std::unique_ptr<Database> db(new Database(handle));
  if (rc != SQLITE_OK) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot open cache database %s: %s; check the data directory's "
                        "permissions and free space",
                        path.string(), handle ? sqlite3_errmsg(handle) : sqlite3_errstr(rc)));
  }
  sqlite3_busy_timeout(handle, static_cast<int>(absl::ToInt64Milliseconds(busy_timeout)));
  // synchronous=NORMAL in WAL mode: a killed process loses nothing committed;
  // a power cut may lose the last transactions but never corrupts the file.
  if (absl::Status status = db->Exec(
          "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;");
      !status.ok()) {
    return status;
  }
  return db;
}

Database::~Database() { sqlite3_close_v2(db_); }

void Database::OnWalCommit(std::function<void(int wal_pages)> on_commit) {
  on_wal_commit_ = std::move(on_commit);
  sqlite3_wal_hook(
      db_,
      [](void* self, sqlite3*, const char*, int pages) {
        static_cast<Database*>(self)->on_wal_commit_(pages);
        return SQLITE_OK;
      },
      this);
}

absl::StatusOr<int> Database::CheckpointPassively() {
  int wal_frames = 0;
  int copied_frames = 0;
  const int rc = sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, &wal_frames,
                                           &copied_frames);
  if (rc != SQLITE_OK) {
    return StatusOf(rc, absl::StrFormat("sqlite: checkpoint: %s", sqlite3_errmsg(db_)));
  }
  return wal_frames - copied_frames;
}

absl::StatusOr<bool> Database::CheckpointAndTruncate() {
  const int rc = sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_TRUNCATE, nullptr, nullptr);
  if (rc == SQLITE_BUSY) return false;
  if (rc != SQLITE_OK) {
    return StatusOf(rc, absl::StrFormat("sqlite: checkpoint: %s", sqlite3_errmsg(db_)));
  }
  return true;
}

absl::Status Database::Error(absl::string_view what) const {
  return absl::InternalError(absl::StrFormat("%s: %s", what, sqlite3_errmsg(db_)));
}

absl::Status Database::Exec(absl::string_view sql) {
  char* message = nullptr;
  const int rc = sqlite3_exec(db_, std::string(sql).c_str(), nullptr, nullptr, &message);
  if (rc == SQLITE_OK) return absl::OkStatus();
  const std::string text = absl::StrFormat("sqlite: %s (%s)", message ? message : "",
                                           sqlite3_errstr(rc));
  sqlite3_free(message);
  return StatusOf(rc, text);
}

absl::StatusOr<Statement> Database::Prepare(absl::string_view sql) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT,
                         &stmt, nullptr) != SQLITE_OK) {
    return Error(absl::StrFormat("cannot prepare '%s'", sql));
  }
  return Statement(db_, stmt);
}

absl::StatusOr<Transaction> Transaction::Begin(Database& db) {
  if (absl::Status status = db.Exec("BEGIN IMMEDIATE"); !status.ok()) return status;
  return Transaction(db);
}

Transaction::~Transaction() {
  if (db_ != nullptr) db_->Exec("ROLLBACK").IgnoreError();
}

absl::Status Transaction::Commit() {
  absl::Status status = db_->Exec("COMMIT");
  if (status.ok()) db_ = nullptr;
  return status;
}

std::string IdsAsJson(const std::vector<int64_t>& ids) {
  std::string json = "[";
  for (int64_t id : ids) {
    if (json.size() > 1) json += ',';
    json += std::to_string(id);
  }
  json += ']';
  return json;
}

}  // namespace kiln::sqlite
