#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/subprocess.h"
#include "common/tail_buffer.h"

extern char** environ;

namespace kiln {
namespace {

namespace fs = std::filesystem;

struct Pipe {
  int read = -1;
  int write = -1;
};

absl::StatusOr<Pipe> MakePipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot create a pipe: ", strerror(errno)));
  }
  return Pipe{fds[0], fds[1]};
}

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

std::vector<std::string> MergedEnvironment(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> merged;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view text(*entry);
    const std::string name(text.substr(0, text.find('=')));
    if (!overrides.contains(name)) merged.emplace_back(text);
  }
  for (const auto& [name, value] : overrides) merged.push_back(absl::StrCat(name, "=", value));
  return merged;
}

// Initializes `attributes` so that a child starts with an empty signal mask
// and default handling of the stop signals, whatever this process blocked or
// ignored (kilnd blocks them for its own shutdown handling), and `flags`.
void InitChildAttributes(posix_spawnattr_t& attributes, short flags) {
  posix_spawnattr_init(&attributes);
  sigset_t empty_mask;
  sigemptyset(&empty_mask);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int signal_number : {SIGPIPE, SIGTERM, SIGINT}) sigaddset(&defaults, signal_number);
  posix_spawnattr_setsigmask(&attributes, &empty_mask);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setflags(&attributes, flags | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int signal_number = WTERMSIG(status);
    const char* name = sigabbrev_np(signal_number);
    return absl::StrFormat("killed by signal %d (SIG%s)", signal_number, name ? name : "?");
  }
  return absl::StrCat("wait status ", status);
}

class PosixSubprocess : public Subprocess {
 public:
  PosixSubprocess(pid_t pid, int stdin_fd, int stdout_fd, int stderr_fd, size_t tail_bytes)
      : pid_(pid), stdin_fd_(stdin_fd), stdout_fd_(stdout_fd), stderr_tail_(tail_bytes) {
    stderr_reader_ = std::thread([this, stderr_fd] { CollectStderr(stderr_fd); });
  }

  ~PosixSubprocess() override {
    CloseStdin();
    if (!waited_) {
      Kill();
      Wait();
    }
    CloseFd(stdout_fd_);
    if (stderr_reader_.joinable()) stderr_reader_.join();
  }

  int pid() const override { return pid_; }

  absl::Status Write(absl::string_view data) override {
    size_t written = 0;
    while (written < data.size()) {
      const ssize_t n = write(stdin_fd_, data.data() + written, data.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::UnavailableError(
            absl::StrCat("cannot write to process ", pid_, ": ", strerror(errno)));
      }
      written += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  void CloseStdin() override { CloseFd(stdin_fd_); }

  absl::StatusOr<std::string> ReadSome(size_t max_size, absl::Time deadline) override {
    std::string data(max_size, '\0');
    while (true) {
      const int64_t wait_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (wait_ms <= 0) return absl::DeadlineExceededError("the process did not answer in time");
      pollfd poll_fd{stdout_fd_, POLLIN, 0};
      const int ready = poll(&poll_fd, 1, static_cast<int>(std::min<int64_t>(wait_ms, 60000)));
      if (ready <= 0) continue;  // EINTR or not yet
      const ssize_t n = read(stdout_fd_, data.data(), max_size);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      data.resize(n > 0 ? static_cast<size_t>(n) : 0);
      return data;
    }
  }

  uint64_t StderrWritten() override { return stderr_tail_.Appended(); }

  std::string StderrTailSince(uint64_t mark) override { return stderr_tail_.Since(mark); }

  void Kill() override {
    if (!waited_) kill(pid_, SIGKILL);
  }

  std::string Wait() override {
    if (!waited_) {
      int status = 0;
      while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      exit_description_ = DescribeStatus(status);
      succeeded_ = WIFEXITED(status) && WEXITSTATUS(status) == 0;
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
  void CollectStderr(int fd) {
    char buffer[4096];
    while (true) {
      const ssize_t n = read(fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      stderr_tail_.Append(buffer, static_cast<size_t>(n));
    }
    close(fd);
  }

  const pid_t pid_;
  int stdin_fd_;
  int stdout_fd_;
  TailBuffer stderr_tail_;
  std::thread stderr_reader_;
  bool waited_ = false;
  bool succeeded_ = false;
  std::string exit_description_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(const std::vector<std::string>& argv,
                                                              const SpawnOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to run");
  auto in = MakePipe();
  auto out = MakePipe();
  auto err = MakePipe();
  if (!in.ok() || !out.ok() || !err.ok()) return absl::ResourceExhaustedError("out of pipes");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in->read, 0);
  posix_spawn_file_actions_adddup2(&actions, out->write, 1);
  posix_spawn_file_actions_adddup2(&actions, err->write, 2);
  if (!options.working_dir.empty()) {
    posix_spawn_file_actions_addchdir_np(&actions, options.working_dir.c_str());
  }
  posix_spawnattr_t attributes;
  InitChildAttributes(attributes, 0);

  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env = MergedEnvironment(options.env);
  std::vector<char*> envp;
  for (std::string& entry : env) envp.push_back(entry.data());
  envp.push_back(nullptr);

  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0].c_str(), &actions, &attributes, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  CloseFd(in->read);
  CloseFd(out->write);
  CloseFd(err->write);
  if (rc != 0) {
    CloseFd(in->write);
    CloseFd(out->read);
    CloseFd(err->read);
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot run %s: %s", argv[0], strerror(rc)));
  }
  return std::make_unique<PosixSubprocess>(pid, in->write, out->read, err->read,
                                           options.stderr_tail_bytes);
}

absl::Status SpawnDetached(const std::vector<std::string>& argv,
                           const std::vector<std::string>& dropped_prefixes) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to run");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int fd : {0, 1, 2}) {
    posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);
  }
  // A session of its own: no terminal's hangup or Ctrl+C reaches it.
  posix_spawnattr_t attributes;
  InitChildAttributes(attributes, POSIX_SPAWN_SETSID);

  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view text(*entry);
    if (std::none_of(dropped_prefixes.begin(), dropped_prefixes.end(),
                     [&](const std::string& prefix) { return absl::StartsWith(text, prefix); })) {
      envp.push_back(*entry);
    }
  }
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &actions, &attributes, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (rc != 0) {
    return absl::FailedPreconditionError(absl::StrFormat("cannot run %s: %s", argv[0], strerror(rc)));
  }
  // Reaped if it exits while this process still runs, so that no zombie stays.
  std::thread([pid] { waitpid(pid, nullptr, 0); }).detach();
  return absl::OkStatus();
}

fs::path FindOnPath(absl::string_view program) {
  if (program.find('/') != absl::string_view::npos) {
    return access(std::string(program).c_str(), X_OK) == 0 ? fs::path(std::string(program))
                                                          : fs::path();
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    if (dir.empty()) continue;
    const fs::path candidate = fs::path(std::string(dir)) / std::string(program);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

fs::path ExecutablePath() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  return error ? fs::path() : self;
}

}  // namespace kiln
