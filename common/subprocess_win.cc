// Child processes on Windows: CreateProcessW with exactly three inherited
// handles, each child in its own job object so that Kill() also ends what the
// child started (a worker's ptxas), and stdout on an overlapped named pipe so
// reads can wait with a deadline.

#include "common/windows_api.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/subprocess.h"
#include "common/tail_buffer.h"
#include "common/windows_text.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// The process environment as Win32 sees it (the C runtime's copy can be stale).
std::string Variable(const wchar_t* name) {
  std::wstring value(32767, L'\0');
  const DWORD length = GetEnvironmentVariableW(name, value.data(), static_cast<DWORD>(value.size()));
  value.resize(length < value.size() ? length : 0);
  return Narrow(value);
}

void CloseIfValid(HANDLE& handle) {
  if (handle != nullptr && handle != INVALID_HANDLE_VALUE) CloseHandle(handle);
  handle = nullptr;
}

// Quotes one argument so that CommandLineToArgvW (and the C runtime) give it
// back unchanged: backslashes are literal except before a quote.
std::wstring QuoteArgument(const std::wstring& argument) {
  if (!argument.empty() && argument.find_first_of(L" \t\n\v\"") == std::wstring::npos) {
    return argument;
  }
  std::wstring quoted = L"\"";
  for (auto it = argument.begin();; ++it) {
    size_t backslashes = 0;
    while (it != argument.end() && *it == L'\\') {
      ++it;
      ++backslashes;
    }
    if (it == argument.end()) {
      quoted.append(backslashes * 2, L'\\');
      break;
    }
    if (*it == L'"') {
      quoted.append(backslashes * 2 + 1, L'\\');
    } else {
      quoted.append(backslashes, L'\\');
    }
    quoted.push_back(*it);
  }
  quoted.push_back(L'"');
  return quoted;
}

// The parent's environment with `overrides` applied, less the variables whose
// names begin with one of `dropped_prefixes`; names compare without case, as
// Windows does. A sorted double-NUL-terminated block.
std::wstring EnvironmentBlock(const std::map<std::string, std::string>& overrides,
                              const std::vector<std::string>& dropped_prefixes = {}) {
  std::map<std::string, std::wstring> variables;  // upper-case name -> "Name=value"
  auto dropped = [&](const std::string& upper_name) {
    return std::any_of(dropped_prefixes.begin(), dropped_prefixes.end(), [&](const std::string& prefix) {
      return absl::StartsWith(upper_name, absl::AsciiStrToUpper(prefix));
    });
  };
  if (wchar_t* block = GetEnvironmentStringsW()) {
    for (const wchar_t* entry = block; *entry != L'\0'; entry += wcslen(entry) + 1) {
      const std::wstring text(entry);
      // Entries like "=C:=C:\dir" (per-drive current directories) start with '='.
      const size_t equals = text.find(L'=', 1);
      if (equals == std::wstring::npos) continue;
      std::string name = absl::AsciiStrToUpper(Narrow(text.substr(0, equals)));
      if (!dropped(name)) variables[std::move(name)] = text;
    }
    FreeEnvironmentStringsW(block);
  }
  for (const auto& [name, value] : overrides) {
    variables[absl::AsciiStrToUpper(name)] = Widen(absl::StrCat(name, "=", value));
  }
  std::wstring result;
  for (const auto& [name, entry] : variables) {
    result += entry;
    result.push_back(L'\0');
  }
  result.push_back(L'\0');
  return result;
}

std::string DescribeExitCode(DWORD code, bool killed) {
  if (killed) return "killed";
  // NTSTATUS error values: the process crashed rather than exited.
  if (code >= 0xC0000000u) {
    const char* name = code == 0xC0000005u   ? " (access violation)"
                       : code == 0xC00000FDu ? " (stack overflow)"
                       : code == 0xC0000409u ? " (fail fast / stack buffer overrun)"
                                             : "";
    return absl::StrFormat("crashed with exception 0x%08X%s", code, name);
  }
  return absl::StrCat("exit code ", code);
}

class WindowsSubprocess : public Subprocess {
 public:
  WindowsSubprocess(PROCESS_INFORMATION process, HANDLE job, HANDLE stdin_write,
                    HANDLE stdout_read, HANDLE stderr_read, size_t tail_bytes)
      : process_(process.hProcess),
        pid_(static_cast<int>(process.dwProcessId)),
        job_(job),
        stdin_write_(stdin_write),
        stdout_read_(stdout_read),
        read_event_(CreateEventW(nullptr, TRUE, FALSE, nullptr)),
        stderr_tail_(tail_bytes) {
    CloseHandle(process.hThread);
    stderr_reader_ = std::thread([this, stderr_read] { CollectStderr(stderr_read); });
  }

  ~WindowsSubprocess() override {
    CloseStdin();
    if (!waited_) {
      Kill();
      Wait();
    }
    CloseIfValid(stdout_read_);
    if (stderr_reader_.joinable()) stderr_reader_.join();
    CloseIfValid(read_event_);
    CloseIfValid(job_);
    CloseIfValid(process_);
  }

  int pid() const override { return pid_; }

  absl::Status Write(absl::string_view data) override {
    size_t written = 0;
    while (written < data.size()) {
      const DWORD chunk = static_cast<DWORD>(std::min<size_t>(data.size() - written, 1u << 20));
      DWORD n = 0;
      if (!WriteFile(stdin_write_, data.data() + written, chunk, &n, nullptr)) {
        return absl::UnavailableError(
            absl::StrCat("cannot write to process ", pid_, ": ", LastErrorText()));
      }
      written += n;
    }
    return absl::OkStatus();
  }

  void CloseStdin() override { CloseIfValid(stdin_write_); }

  absl::StatusOr<std::string> ReadSome(size_t max_size, absl::Time deadline) override {
    std::string data(std::min<size_t>(max_size, 1u << 20), '\0');
    OVERLAPPED overlapped{};
    overlapped.hEvent = read_event_;
    ResetEvent(read_event_);
    DWORD n = 0;
    if (!ReadFile(stdout_read_, data.data(), static_cast<DWORD>(data.size()), nullptr,
                  &overlapped)) {
      const DWORD error = GetLastError();
      if (error == ERROR_BROKEN_PIPE) return std::string();  // the child closed stdout
      if (error != ERROR_IO_PENDING) {
        return absl::UnavailableError(
            absl::StrCat("cannot read from process ", pid_, ": ", ErrorText(error)));
      }
      const int64_t wait_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
      if (WaitForSingleObject(read_event_, static_cast<DWORD>(std::min<int64_t>(
                                               wait_ms, INFINITE - 1))) != WAIT_OBJECT_0) {
        // Cancel, then collect: the read may have completed meanwhile.
        CancelIoEx(stdout_read_, &overlapped);
      }
    }
    if (!GetOverlappedResult(stdout_read_, &overlapped, &n, TRUE)) {
      const DWORD error = GetLastError();
      if (error == ERROR_BROKEN_PIPE) return std::string();
      if (error == ERROR_OPERATION_ABORTED) {
        return absl::DeadlineExceededError("the process did not answer in time");
      }
      return absl::UnavailableError(
          absl::StrCat("cannot read from process ", pid_, ": ", ErrorText(error)));
    }
    data.resize(n);
    return data;
  }

  uint64_t StderrWritten() override { return stderr_tail_.Appended(); }

  std::string StderrTailSince(uint64_t mark) override { return stderr_tail_.Since(mark); }

  void Kill() override {
    if (waited_) return;
    killed_ = true;
    if (job_ != nullptr) {
      TerminateJobObject(job_, 1);
    } else {
      TerminateProcess(process_, 1);
    }
  }

  std::string Wait() override {
    if (!waited_) {
      WaitForSingleObject(process_, INFINITE);
      DWORD code = 0;
      GetExitCodeProcess(process_, &code);
      exit_description_ = DescribeExitCode(code, killed_);
      succeeded_ = !killed_ && code == 0;
      waited_ = true;
      // Its stderr is complete once every holder of the pipe has exited.
      if (stderr_reader_.joinable()) stderr_reader_.join();
    }
    return exit_description_;
  }

  bool Succeeded() override {
    Wait();
    return succeeded_;
  }

 private:
  void CollectStderr(HANDLE pipe) {
    char buffer[4096];
    DWORD n = 0;
    while (ReadFile(pipe, buffer, sizeof(buffer), &n, nullptr) && n > 0) {
      stderr_tail_.Append(buffer, static_cast<size_t>(n));
    }
    CloseHandle(pipe);
  }

  HANDLE process_;
  const int pid_;
  HANDLE job_;
  HANDLE stdin_write_;
  HANDLE stdout_read_;
  HANDLE read_event_;
  TailBuffer stderr_tail_;
  std::thread stderr_reader_;
  bool waited_ = false;
  bool killed_ = false;
  bool succeeded_ = false;
  std::string exit_description_;
};

// Ends of the child's three standard handles: ours are not inheritable, the
// child's are.
struct StandardPipes {
  HANDLE stdin_read = nullptr, stdin_write = nullptr;
  HANDLE stdout_read = nullptr, stdout_write = nullptr;
  HANDLE stderr_read = nullptr, stderr_write = nullptr;

  void CloseChildEnds() {
    CloseIfValid(stdin_read);
    CloseIfValid(stdout_write);
    CloseIfValid(stderr_write);
  }
  void CloseAll() {
    CloseChildEnds();
    CloseIfValid(stdin_write);
    CloseIfValid(stdout_read);
    CloseIfValid(stderr_read);
  }
};

absl::Status MakePipes(StandardPipes& pipes) {
  SECURITY_ATTRIBUTES inheritable{sizeof(SECURITY_ATTRIBUTES), nullptr, TRUE};
  if (!CreatePipe(&pipes.stdin_read, &pipes.stdin_write, &inheritable, 0) ||
      !CreatePipe(&pipes.stderr_read, &pipes.stderr_write, &inheritable, 0)) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot create a pipe: ", LastErrorText()));
  }
  // Anonymous pipes cannot be read with a timeout; a named pipe opened
  // overlapped on our side can.
  static std::atomic<unsigned> counter{0};
  const std::wstring name = Widen(absl::StrFormat(
      "\\\\.\\pipe\\kiln-%u-%u-%u", GetCurrentProcessId(), counter.fetch_add(1), GetTickCount()));
  pipes.stdout_read = CreateNamedPipeW(
      name.c_str(), PIPE_ACCESS_INBOUND | FILE_FLAG_OVERLAPPED | FILE_FLAG_FIRST_PIPE_INSTANCE,
      PIPE_TYPE_BYTE | PIPE_WAIT | PIPE_REJECT_REMOTE_CLIENTS, 1, 0, 64 * 1024, 0, nullptr);
  if (pipes.stdout_read == INVALID_HANDLE_VALUE) {
    pipes.stdout_read = nullptr;
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot create a named pipe: ", LastErrorText()));
  }
  pipes.stdout_write = CreateFileW(name.c_str(), GENERIC_WRITE, 0, &inheritable, OPEN_EXISTING,
                                   FILE_ATTRIBUTE_NORMAL, nullptr);
  if (pipes.stdout_write == INVALID_HANDLE_VALUE) {
    pipes.stdout_write = nullptr;
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot open the named pipe: ", LastErrorText()));
  }
  for (HANDLE ours : {pipes.stdin_write, pipes.stdout_read, pipes.stderr_read}) {
    SetHandleInformation(ours, HANDLE_FLAG_INHERIT, 0);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(const std::vector<std::string>& argv,
                                                              const SpawnOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to run");
  StandardPipes pipes;
  if (absl::Status status = MakePipes(pipes); !status.ok()) {
    pipes.CloseAll();
    return status;
  }
  // Only the three standard handles reach the child, even while other
  // threads are spawning children of their own.
  HANDLE inherited[] = {pipes.stdin_read, pipes.stdout_write, pipes.stderr_write};
  SIZE_T attribute_size = 0;
  InitializeProcThreadAttributeList(nullptr, 1, 0, &attribute_size);
  std::vector<unsigned char> attribute_buffer(attribute_size);
  auto* attributes = reinterpret_cast<LPPROC_THREAD_ATTRIBUTE_LIST>(attribute_buffer.data());
  InitializeProcThreadAttributeList(attributes, 1, 0, &attribute_size);
  UpdateProcThreadAttribute(attributes, 0, PROC_THREAD_ATTRIBUTE_HANDLE_LIST, inherited,
                            sizeof(inherited), nullptr, nullptr);
  STARTUPINFOEXW startup{};
  startup.StartupInfo.cb = sizeof(startup);
  startup.StartupInfo.dwFlags = STARTF_USESTDHANDLES;
  startup.StartupInfo.hStdInput = pipes.stdin_read;
  startup.StartupInfo.hStdOutput = pipes.stdout_write;
  startup.StartupInfo.hStdError = pipes.stderr_write;
  startup.lpAttributeList = attributes;

  std::wstring command_line;
  for (const std::string& arg : argv) {
    if (!command_line.empty()) command_line.push_back(L' ');
    command_line += QuoteArgument(Widen(arg));
  }
  std::wstring environment = EnvironmentBlock(options.env);
  const std::wstring working_dir = options.working_dir.native();
  PROCESS_INFORMATION process{};
  const BOOL created = CreateProcessW(
      nullptr, command_line.data(), nullptr, nullptr, TRUE,
      CREATE_SUSPENDED | CREATE_NO_WINDOW | CREATE_UNICODE_ENVIRONMENT |
          EXTENDED_STARTUPINFO_PRESENT,
      environment.data(), working_dir.empty() ? nullptr : working_dir.c_str(),
      &startup.StartupInfo, &process);
  const DWORD create_error = GetLastError();
  DeleteProcThreadAttributeList(attributes);
  pipes.CloseChildEnds();
  if (!created) {
    pipes.CloseAll();
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot run %s: %s", argv[0], ErrorText(create_error)));
  }
  // In its own job before it runs a single instruction, so nothing it starts
  // escapes Kill(). Where jobs cannot nest (older Windows, when we already run
  // in a job), the child stays in ours and Kill() ends the child alone.
  HANDLE job = CreateJobObjectW(nullptr, nullptr);
  JOBOBJECT_EXTENDED_LIMIT_INFORMATION limits{};
  limits.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
  if (job != nullptr &&
      (!SetInformationJobObject(job, JobObjectExtendedLimitInformation, &limits, sizeof(limits)) ||
       !AssignProcessToJobObject(job, process.hProcess))) {
    CloseHandle(job);
    job = nullptr;
  }
  ResumeThread(process.hThread);
  return std::make_unique<WindowsSubprocess>(process, job, pipes.stdin_write, pipes.stdout_read,
                                             pipes.stderr_read, options.stderr_tail_bytes);
}

absl::Status SpawnDetached(const std::vector<std::string>& argv,
                           const std::vector<std::string>& dropped_prefixes) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to run");
  std::wstring command_line;
  for (const std::string& arg : argv) {
    if (!command_line.empty()) command_line.push_back(L' ');
    command_line += QuoteArgument(Widen(arg));
  }
  std::wstring environment = EnvironmentBlock({}, dropped_prefixes);
  // Standard streams on NUL, and no other handle inherited: a child given
  // none would keep the caller's pipes open under Wine, and whoever reads the
  // caller's output would wait for kilnd to exit.
  SECURITY_ATTRIBUTES inheritable{sizeof(SECURITY_ATTRIBUTES), nullptr, TRUE};
  HANDLE null_device = CreateFileW(L"NUL", GENERIC_READ | GENERIC_WRITE,
                                   FILE_SHARE_READ | FILE_SHARE_WRITE, &inheritable, OPEN_EXISTING, 0,
                                   nullptr);
  if (null_device == INVALID_HANDLE_VALUE) {
    return absl::FailedPreconditionError(absl::StrCat("cannot open NUL: ", LastErrorText()));
  }
  SIZE_T attribute_size = 0;
  InitializeProcThreadAttributeList(nullptr, 1, 0, &attribute_size);
  std::vector<unsigned char> attribute_buffer(attribute_size);
  auto* attributes = reinterpret_cast<LPPROC_THREAD_ATTRIBUTE_LIST>(attribute_buffer.data());
  InitializeProcThreadAttributeList(attributes, 1, 0, &attribute_size);
  UpdateProcThreadAttribute(attributes, 0, PROC_THREAD_ATTRIBUTE_HANDLE_LIST, &null_device,
                            sizeof(null_device), nullptr, nullptr);
  STARTUPINFOEXW startup{};
  startup.StartupInfo.cb = sizeof(startup);
  startup.StartupInfo.dwFlags = STARTF_USESTDHANDLES;
  startup.StartupInfo.hStdInput = startup.StartupInfo.hStdOutput = startup.StartupInfo.hStdError =
      null_device;
  startup.lpAttributeList = attributes;
  constexpr DWORD kDetached = DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP |
                              CREATE_UNICODE_ENVIRONMENT | EXTENDED_STARTUPINFO_PRESENT;
  // Out of this process's job where the job allows it: a job that kills its
  // processes when it closes (a CI runner's, a terminal's) would end kilnd too.
  PROCESS_INFORMATION process{};
  auto create = [&](DWORD flags) {
    return CreateProcessW(nullptr, command_line.data(), nullptr, nullptr, TRUE, flags,
                          environment.data(), nullptr, &startup.StartupInfo, &process);
  };
  BOOL created = create(kDetached | CREATE_BREAKAWAY_FROM_JOB);
  if (!created && GetLastError() == ERROR_ACCESS_DENIED) created = create(kDetached);
  const DWORD create_error = GetLastError();
  DeleteProcThreadAttributeList(attributes);
  CloseHandle(null_device);
  if (!created) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot run %s: %s", argv[0], ErrorText(create_error)));
  }
  CloseHandle(process.hThread);
  CloseHandle(process.hProcess);
  return absl::OkStatus();
}

fs::path FindOnPath(absl::string_view program) {
  const std::string name(program);
  auto is_file = [](const fs::path& path) {
    std::error_code error;
    return fs::is_regular_file(path, error);
  };
  // "python" is found as python.exe: try each of %PATHEXT%'s extensions.
  std::vector<std::string> extensions = {""};
  if (fs::path(name).extension().empty()) {
    std::string pathext = Variable(L"PATHEXT");
    if (pathext.empty()) pathext = ".COM;.EXE;.BAT;.CMD";
    for (absl::string_view ext : absl::StrSplit(pathext, ';')) {
      if (!ext.empty()) extensions.push_back(absl::AsciiStrToLower(ext));
    }
  }
  auto find_in = [&](const fs::path& dir) -> fs::path {
    for (const std::string& ext : extensions) {
      const fs::path candidate = dir / (name + ext);
      if (is_file(candidate)) return candidate;
    }
    return {};
  };
  if (name.find_first_of("/\\") != std::string::npos) return find_in(fs::path());
  const std::string path = Variable(L"PATH");
  for (absl::string_view dir : absl::StrSplit(path, ';')) {
    if (dir.empty()) continue;
    if (fs::path found = find_in(fs::path(Widen(std::string_view(dir.data(), dir.size()))));
        !found.empty()) {
      return found;
    }
  }
  return {};
}

fs::path ExecutablePath() {
  std::wstring buffer(32768, L'\0');
  const DWORD length = GetModuleFileNameW(nullptr, buffer.data(), static_cast<DWORD>(buffer.size()));
  if (length == 0) return {};
  buffer.resize(length);
  return fs::path(buffer);
}

}  // namespace kiln
