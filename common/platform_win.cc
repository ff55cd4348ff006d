// The platform layer on Windows (Win32, wide-character APIs throughout).

#include "common/windows_api.h"

#include <atomic>
#include <cstring>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/platform.h"
#include "common/platform_internal.h"
#include "common/status_macros.h"
#include "common/windows_accounts.h"
#include "common/windows_text.h"

namespace kiln::platform {
namespace {

namespace fs = std::filesystem;

fs::path KnownFolder(REFKNOWNFOLDERID folder) {
  PWSTR known = nullptr;
  fs::path result;
  if (SUCCEEDED(SHGetKnownFolderPath(folder, 0, nullptr, &known))) result = fs::path(known);
  CoTaskMemFree(known);
  return result;
}

// %VARIABLE% when set to an absolute path, else the known folder.
fs::path EnvOrKnownFolder(const wchar_t* variable, REFKNOWNFOLDERID folder) {
  wchar_t value[MAX_PATH];
  const DWORD length = GetEnvironmentVariableW(variable, value, MAX_PATH);
  if (length > 0 && length < MAX_PATH) {
    const fs::path path(value);
    if (path.is_absolute()) return path;
  }
  return KnownFolder(folder);
}

class Handle {
 public:
  explicit Handle(HANDLE handle = INVALID_HANDLE_VALUE) : handle_(handle) {}
  ~Handle() {
    if (valid()) CloseHandle(handle_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : handle_(other.release()) {}
  bool valid() const { return handle_ != INVALID_HANDLE_VALUE && handle_ != nullptr; }
  HANDLE get() const { return handle_; }
  HANDLE release() { return std::exchange(handle_, INVALID_HANDLE_VALUE); }

 private:
  HANDLE handle_;
};

// A SID of this process's token, copied into a buffer that owns it: the
// account (TokenUser) or the default owner of what it creates (TokenOwner;
// the Administrators group in an elevated process).
absl::StatusOr<std::vector<unsigned char>> TokenSid(TOKEN_INFORMATION_CLASS which) {
  HANDLE raw_token = nullptr;
  if (!OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &raw_token)) {
    return absl::InternalError(absl::StrCat("cannot open the process token: ", LastErrorText()));
  }
  Handle token(raw_token);
  DWORD size = 0;
  GetTokenInformation(token.get(), which, nullptr, 0, &size);
  std::vector<unsigned char> buffer(size);
  if (size == 0 || !GetTokenInformation(token.get(), which, buffer.data(), size, &size)) {
    return absl::InternalError(absl::StrCat("cannot read the process user: ", LastErrorText()));
  }
  const PSID sid = which == TokenUser ? reinterpret_cast<TOKEN_USER*>(buffer.data())->User.Sid
                                      : reinterpret_cast<TOKEN_OWNER*>(buffer.data())->Owner;
  std::vector<unsigned char> copy(GetLengthSid(sid));
  CopySid(static_cast<DWORD>(copy.size()), copy.data(), sid);
  return copy;
}

std::string SidText(const void* sid) {
  LPWSTR text = nullptr;
  if (!ConvertSidToStringSidW(const_cast<PSID>(sid), &text)) return "?";
  std::string result = Narrow(text);
  LocalFree(text);
  return result;
}

class FileLock : public ExclusiveLock {
 public:
  explicit FileLock(HANDLE file) : file_(file) {}
  ~FileLock() override {
    OVERLAPPED whole{};
    UnlockFileEx(file_.get(), 0, MAXDWORD, MAXDWORD, &whole);
  }

 private:
  Handle file_;
};

class WindowsLibrary : public DynamicLibrary {
 public:
  explicit WindowsLibrary(HMODULE module) : module_(module) {}
  ~WindowsLibrary() override { FreeLibrary(module_); }
  void* Symbol(const char* symbol) override {
    return reinterpret_cast<void*>(GetProcAddress(module_, symbol));
  }

 private:
  HMODULE module_;
};

}  // namespace

fs::path DefaultDataDir(Scope scope) {
  // The machine's folder comes from the known folder, never the environment:
  // the elevated `kilnd install` and the service's own account must agree on
  // it, and a service's environment is not the installing user's (under Wine
  // a LocalService's %ProgramData% is C:\users\Public).
  const fs::path root = scope == Scope::kMachine
                            ? KnownFolder(FOLDERID_ProgramData)
                            : EnvOrKnownFolder(L"LOCALAPPDATA", FOLDERID_LocalAppData);
  return root / "kiln";
}

fs::path DefaultConfigPath(Scope scope) { return DefaultDataDir(scope) / "kilnd.conf"; }

fs::path DefaultRuntimeDir(Scope scope) { return DefaultDataDir(scope) / "run"; }

fs::path DefaultSocketPath(Scope) { return {}; }

fs::path DefaultEndpointFile(Scope scope) { return DefaultRuntimeDir(scope) / "kilnd.endpoint"; }

std::string DefaultLocalEndpoint() { return ""; }

fs::path KilnPythonDir(Scope scope) { return DefaultDataDir(scope) / "python"; }

absl::Status EnsurePrivateDirectory(const fs::path& dir, const std::vector<std::string>& readers) {
  std::error_code error;
  fs::create_directories(dir, error);
  const DWORD attributes = GetFileAttributesW(dir.c_str());
  if (attributes == INVALID_FILE_ATTRIBUTES) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot create directory %s: %s; create it or choose another path", PathText(dir),
        error ? error.message() : LastErrorText()));
  }
  // A junction or symlink planted by another user must not redirect our files.
  if ((attributes & FILE_ATTRIBUTE_DIRECTORY) == 0 ||
      (attributes & FILE_ATTRIBUTE_REPARSE_POINT) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not a directory (or is a junction or symlink); remove it so kilnd can create a "
        "private one",
        PathText(dir)));
  }
  ASSIGN_OR_RETURN(std::vector<unsigned char> self, TokenSid(TokenUser));
  ASSIGN_OR_RETURN(std::vector<unsigned char> default_owner, TokenSid(TokenOwner));
  PSID owner = nullptr;
  PSECURITY_DESCRIPTOR descriptor = nullptr;
  if (GetNamedSecurityInfoW(dir.c_str(), SE_FILE_OBJECT, OWNER_SECURITY_INFORMATION, &owner,
                            nullptr, nullptr, nullptr, &descriptor) == ERROR_SUCCESS) {
    // What this process creates is owned by its default owner: itself, or
    // Administrators when it runs elevated.
    const bool mine = owner != nullptr &&
                      (EqualSid(owner, self.data()) || EqualSid(owner, default_owner.data()));
    const std::string owner_text = owner != nullptr ? SidText(owner) : "nobody";
    LocalFree(descriptor);
    if (!mine) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s is owned by %s, not by this account (%s); another user may be intercepting kilnd's "
          "endpoint: remove the directory so kilnd can create its own",
          PathText(dir), owner_text, SidText(self.data())));
    }
  }
  std::vector<std::vector<unsigned char>> reader_sids;
  for (const std::string& reader : readers) {
    ASSIGN_OR_RETURN(std::vector<unsigned char> sid, AccountSid(reader));
    reader_sids.push_back(std::move(sid));
  }
  // A protected DACL: nothing inherited from the parent, so only these entries apply.
  std::vector<EXPLICIT_ACCESSW> entries;
  auto grant = [&entries](void* sid, DWORD permissions) {
    EXPLICIT_ACCESSW entry{};
    entry.grfAccessPermissions = permissions;
    entry.grfAccessMode = SET_ACCESS;
    entry.grfInheritance = SUB_CONTAINERS_AND_OBJECTS_INHERIT;
    entry.Trustee.TrusteeForm = TRUSTEE_IS_SID;
    entry.Trustee.TrusteeType = TRUSTEE_IS_UNKNOWN;
    entry.Trustee.ptstrName = static_cast<LPWSTR>(sid);
    entries.push_back(entry);
  };
  grant(self.data(), GENERIC_ALL);
  for (auto& sid : reader_sids) grant(sid.data(), GENERIC_READ | GENERIC_EXECUTE);
  PACL acl = nullptr;
  DWORD result = SetEntriesInAclW(static_cast<ULONG>(entries.size()), entries.data(), nullptr, &acl);
  if (result == ERROR_SUCCESS) {
    result = SetNamedSecurityInfoW(const_cast<LPWSTR>(dir.c_str()), SE_FILE_OBJECT,
                                   DACL_SECURITY_INFORMATION | PROTECTED_DACL_SECURITY_INFORMATION,
                                   nullptr, nullptr, acl, nullptr);
    LocalFree(acl);
  }
  if (result != ERROR_SUCCESS) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot restrict %s to its owner: %s", PathText(dir), ErrorText(result)));
  }
  return absl::OkStatus();
}

absl::Status ShareLocalSocket(const fs::path& path, const std::string& group) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "local_socket_group %s (for %s) is a Linux setting; on Windows, allowed_user names the "
      "accounts that may use a machine kilnd",
      group, PathText(path)));
}

bool LocalSocketAcceptsConnections(const fs::path& path) {
  // kilnd serves Windows clients through the endpoint file by default, but a
  // configured local_socket is an AF_UNIX socket (Windows 10 1803 and later).
  WSADATA wsa{};
  if (WSAStartup(MAKEWORD(2, 2), &wsa) != 0) return false;
  bool accepted = false;
  const std::string text = PathText(path);
  SOCKET probe = socket(AF_UNIX, SOCK_STREAM, 0);
  if (probe != INVALID_SOCKET && text.size() < sizeof(sockaddr_un::sun_path)) {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, text.c_str(), text.size() + 1);
    accepted = connect(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  if (probe != INVALID_SOCKET) closesocket(probe);
  WSACleanup();
  return accepted;
}

absl::Status WriteFileDurably(const fs::path& path, absl::string_view data) {
  Handle file(CreateFileW(path.c_str(), GENERIC_WRITE, 0, nullptr, CREATE_NEW,
                          FILE_ATTRIBUTE_NORMAL, nullptr));
  if (!file.valid()) {
    return absl::InternalError(
        absl::StrFormat("cannot create %s: %s", PathText(path), LastErrorText()));
  }
  size_t written = 0;
  while (written < data.size()) {
    const DWORD chunk =
        static_cast<DWORD>(std::min<size_t>(data.size() - written, 1u << 30));
    DWORD n = 0;
    if (!WriteFile(file.get(), data.data() + written, chunk, &n, nullptr)) {
      const DWORD error = GetLastError();
      const std::string error_text = LastErrorText();
      const std::string why = absl::StrFormat("cannot write %s: %s", PathText(path), error_text);
      if (error == ERROR_DISK_FULL || error == ERROR_HANDLE_DISK_FULL) {
        return absl::ResourceExhaustedError(absl::StrCat(why, "; the disk is full"));
      }
      return absl::InternalError(absl::StrCat(why, "; check free disk space"));
    }
    written += n;
  }
  if (!FlushFileBuffers(file.get())) {
    return absl::InternalError(
        absl::StrFormat("cannot flush %s: %s", PathText(path), LastErrorText()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Replaced> MoveFileOver(const fs::path& from, const fs::path& to) {
  if (MoveFileExW(from.c_str(), to.c_str(), MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)) {
    return Replaced::kYes;
  }
  const DWORD error = GetLastError();
  const DWORD target = GetFileAttributesW(to.c_str());
  const bool target_is_file =
      target != INVALID_FILE_ATTRIBUTES && (target & FILE_ATTRIBUTE_DIRECTORY) == 0;
  // An open handle without FILE_SHARE_DELETE (or a mapped image: a loaded
  // DLL) makes the target unreplaceable until it is closed.
  if (target_is_file && (error == ERROR_ACCESS_DENIED || error == ERROR_SHARING_VIOLATION)) {
    return Replaced::kTargetInUse;
  }
  return absl::InternalError(absl::StrFormat("cannot move %s to %s: %s", PathText(from),
                                             PathText(to), ErrorText(error)));
}

absl::Status CreateFileSymlink(const fs::path& target, const fs::path& link) {
  // Unprivileged creation needs Developer Mode (Windows 10 1703+); older
  // Windows rejects the flag itself, so it is retried without.
  constexpr DWORD kAllowUnprivileged = 0x2;  // SYMBOLIC_LINK_FLAG_ALLOW_UNPRIVILEGED_CREATE
  if (CreateSymbolicLinkW(link.c_str(), target.c_str(), kAllowUnprivileged) ||
      (GetLastError() == ERROR_INVALID_PARAMETER &&
       CreateSymbolicLinkW(link.c_str(), target.c_str(), 0))) {
    return absl::OkStatus();
  }
  const DWORD error = GetLastError();
  const std::string message = absl::StrFormat("cannot link %s to %s: %s", PathText(link),
                                              PathText(target), ErrorText(error));
  return error == ERROR_PRIVILEGE_NOT_HELD || error == ERROR_NOT_SUPPORTED
             ? absl::UnimplementedError(message)
             : absl::InternalError(message);
}

absl::StatusOr<FileStamp> StampOf(const fs::path& path) {
  Handle file(CreateFileW(path.c_str(), FILE_READ_ATTRIBUTES,
                          FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
                          OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, nullptr));
  if (!file.valid()) {
    const DWORD error = GetLastError();
    const std::string message =
        absl::StrFormat("cannot open %s: %s", PathText(path), LastErrorText());
    return error == ERROR_FILE_NOT_FOUND || error == ERROR_PATH_NOT_FOUND
               ? absl::NotFoundError(message)
               : absl::InternalError(message);
  }
  BY_HANDLE_FILE_INFORMATION info{};
  FILE_BASIC_INFO basic{};
  if (!GetFileInformationByHandle(file.get(), &info) ||
      !GetFileInformationByHandleEx(file.get(), FileBasicInfo, &basic, sizeof(basic))) {
    return absl::InternalError(
        absl::StrFormat("cannot read the attributes of %s: %s", PathText(path), LastErrorText()));
  }
  auto join = [](DWORD high, DWORD low) { return (static_cast<uint64_t>(high) << 32) | low; };
  return FileStamp{join(info.nFileSizeHigh, info.nFileSizeLow), basic.LastWriteTime.QuadPart,
                   basic.ChangeTime.QuadPart, join(info.nFileIndexHigh, info.nFileIndexLow)};
}

uint64_t AllocatedBytes(const fs::path& path) {
  constexpr uint64_t kCluster = 4096;
  WIN32_FILE_ATTRIBUTE_DATA info{};
  if (!GetFileAttributesExW(path.c_str(), GetFileExInfoStandard, &info)) return 0;
  if ((info.dwFileAttributes & (FILE_ATTRIBUTE_DIRECTORY | FILE_ATTRIBUTE_REPARSE_POINT)) != 0) {
    return kCluster;
  }
  const uint64_t size = (static_cast<uint64_t>(info.nFileSizeHigh) << 32) | info.nFileSizeLow;
  return (size + kCluster - 1) / kCluster * kCluster;
}

absl::Time ChangeTime(const FileStamp& stamp) {
  // FILETIME ticks: 100 ns since 1601-01-01.
  constexpr int64_t kUnixEpochTicks = 116444736000000000;
  return absl::FromUnixNanos((stamp.changed - kUnixEpochTicks) * 100);
}

bool StdoutIsTerminal() {
  DWORD mode = 0;
  return GetConsoleMode(GetStdHandle(STD_OUTPUT_HANDLE), &mode) != 0;
}

void IgnoreBrokenPipes() {}  // a broken pipe is an error there already

void LowerCurrentThreadPriority() {
  (void)SetThreadPriority(GetCurrentThread(), THREAD_PRIORITY_BELOW_NORMAL);
}

namespace {

// The lock file at `path`, opened for LockFileEx; FAILED_PRECONDITION naming it.
absl::StatusOr<Handle> OpenLockFile(const fs::path& path) {
  Handle file(CreateFileW(path.c_str(), GENERIC_READ | GENERIC_WRITE,
                          FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
                          OPEN_ALWAYS, FILE_ATTRIBUTE_NORMAL, nullptr));
  if (!file.valid()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot open lock file %s: %s", PathText(path), LastErrorText()));
  }
  return file;
}

// The whole file, so that it overlaps any range another program locks (the
// Python client's msvcrt.locking takes byte 0).
bool TryLockWhole(HANDLE file) {
  OVERLAPPED whole{};
  return LockFileEx(file, LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY, 0, MAXDWORD,
                    MAXDWORD, &whole) != 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExclusiveLock>> TryLockFile(const fs::path& path) {
  ASSIGN_OR_RETURN(Handle file, OpenLockFile(path));
  if (!TryLockWhole(file.get())) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is locked by another process: another kilnd already uses this data directory; stop "
        "it (kilnd stop, or end kilnd.exe) or pass a different --data-dir",
        PathText(path)));
  }
  return std::make_unique<FileLock>(file.release());
}

absl::StatusOr<std::unique_ptr<ExclusiveLock>> WaitForFileLock(const fs::path& path,
                                                               absl::Time deadline) {
  ASSIGN_OR_RETURN(Handle file, OpenLockFile(path));
  // Polled rather than blocking, so that the wait ends at the deadline.
  while (!TryLockWhole(file.get())) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "another process held the lock on %s until the deadline (a client still starting "
          "kilnd?); try again",
          PathText(path)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return std::make_unique<FileLock>(file.release());
}

absl::StatusOr<std::unique_ptr<DynamicLibrary>> LoadDynamicLibrary(
    const std::vector<std::string>& names) {
  std::string last_error;
  for (const std::string& name : names) {
    const std::wstring wide = Widen(name);
    if (HMODULE module = LoadLibraryW(wide.c_str())) {
      return std::make_unique<WindowsLibrary>(module);
    }
    last_error = LastErrorText();
  }
  return absl::NotFoundError(
      absl::StrFormat("cannot load %s: %s", absl::StrJoin(names, " or "), last_error));
}

namespace {

// The one ShutdownSignals the console handler reports to.
std::atomic<ShutdownSignals*> console_listener{nullptr};

BOOL WINAPI OnConsoleControl(DWORD event) {
  ShutdownSignals* listener = console_listener.load();
  if (listener == nullptr) return FALSE;
  switch (event) {
    case CTRL_C_EVENT:
      listener->Request("Ctrl+C");
      return TRUE;
    case CTRL_BREAK_EVENT:
      listener->Request("Ctrl+Break");
      return TRUE;
    case CTRL_CLOSE_EVENT:
    case CTRL_SHUTDOWN_EVENT:
      listener->Request(event == CTRL_CLOSE_EVENT ? "console closed" : "system shutdown");
      // Windows ends the process when this returns: give the main thread the
      // few seconds it allows to finish requests and close the database.
      Sleep(4500);
      return TRUE;
    default:
      // CTRL_LOGOFF_EVENT: one user logging off must not stop a machine service.
      return FALSE;
  }
}

}  // namespace

ShutdownSignals::ShutdownSignals() : state_(std::make_unique<State>()) {
  console_listener.store(this);
  SetConsoleCtrlHandler(OnConsoleControl, TRUE);
}

ShutdownSignals::~ShutdownSignals() {
  SetConsoleCtrlHandler(OnConsoleControl, FALSE);
  ShutdownSignals* self = this;
  console_listener.compare_exchange_strong(self, nullptr);
}

}  // namespace kiln::platform
