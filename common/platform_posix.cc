#include <dlfcn.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/platform.h"
#include "common/platform_internal.h"
#include "common/status_macros.h"

namespace kiln::platform {
namespace {

namespace fs = std::filesystem;

fs::path EnvPathOr(const char* variable, const fs::path& fallback) {
  const char* value = std::getenv(variable);
  if (value != nullptr && value[0] == '/') return fs::path(value);
  return fallback;
}

fs::path HomeDir() {
  const char* home = std::getenv("HOME");
  return home != nullptr && home[0] != '\0' ? fs::path(home) : fs::path("/tmp");
}

std::string ErrnoText() { return std::strerror(errno); }

// Closes a file descriptor on scope exit.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

class FlockLock : public ExclusiveLock {
 public:
  explicit FlockLock(int fd) : fd_(fd) {}
  ~FlockLock() override {
    flock(fd_, LOCK_UN);
    close(fd_);
  }

 private:
  int fd_;
};

}  // namespace

fs::path DefaultDataDir(Scope scope) {
  if (scope == Scope::kMachine) return "/var/cache/kiln";
  return EnvPathOr("XDG_CACHE_HOME", HomeDir() / ".cache") / "kiln";
}

fs::path DefaultConfigPath(Scope scope) {
  if (scope == Scope::kMachine) return "/etc/kiln/kilnd.conf";
  return EnvPathOr("XDG_CONFIG_HOME", HomeDir() / ".config") / "kiln" / "kilnd.conf";
}

fs::path DefaultRuntimeDir(Scope scope) {
  if (scope == Scope::kMachine) return EnvPathOr("KILN_MACHINE_RUNTIME_DIR", "/run/kiln");
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  if (runtime_dir != nullptr && runtime_dir[0] == '/') return fs::path(runtime_dir) / "kiln";
  return fs::path(absl::StrCat("/tmp/kiln-", getuid()));
}

fs::path DefaultSocketPath(Scope scope) { return DefaultRuntimeDir(scope) / "kilnd.sock"; }

fs::path DefaultEndpointFile(Scope) { return {}; }

std::string DefaultLocalEndpoint() { return absl::StrCat("unix:", DefaultSocketPath().string()); }

fs::path KilnPythonDir(Scope scope) { return DefaultDataDir(scope) / "python"; }

absl::Status EnsurePrivateDirectory(const fs::path& dir, const std::vector<std::string>& readers) {
  if (!readers.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "granting %s access to %s is a Windows setting (allowed_user); on Linux, share a machine "
        "kilnd's socket through its directory's group (see deploy/linux/kilnd.system.service)",
        absl::StrJoin(readers, ", "), dir.string()));
  }
  std::error_code error;
  fs::create_directories(dir.parent_path(), error);
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot create directory %s: %s; create it or choose another path", dir.string(),
        ErrnoText()));
  }
  struct stat info {};
  // lstat: a symlink planted in /tmp by another user must not redirect our socket.
  if (lstat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not a directory (or is a symlink); remove it so kilnd can create a private one",
        dir.string()));
  }
  if (info.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is owned by uid %d, not by you (uid %d); another user may be intercepting the "
        "socket: remove it or set XDG_RUNTIME_DIR",
        dir.string(), info.st_uid, geteuid()));
  }
  if ((info.st_mode & 077) != 0 && chmod(dir.c_str(), 0700) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is accessible by other users and chmod 0700 failed: %s", dir.string(), ErrnoText()));
  }
  return absl::OkStatus();
}

absl::Status ShareLocalSocket(const fs::path& path, const std::string& group) {
  std::vector<char> buffer(16384);
  struct group entry {};
  struct group* found = nullptr;
  if (getgrnam_r(group.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 ||
      found == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "local_socket_group: there is no group named '%s'; create it (groupadd --system %s) or "
        "remove the setting",
        group, group));
  }
  const fs::path dir = path.parent_path();
  for (const auto& [target, mode] : {std::pair{dir, 0750}, std::pair{path, 0660}}) {
    if (chown(target.c_str(), static_cast<uid_t>(-1), found->gr_gid) != 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "local_socket_group: cannot give %s to group %s: %s; kilnd's account (uid %d) must be "
          "in that group (usermod -aG %s, or Group= in its systemd unit)",
          target.string(), group, ErrnoText(), geteuid(), group));
    }
    if (chmod(target.c_str(), static_cast<mode_t>(mode)) != 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "local_socket_group: cannot open %s to group %s: %s", target.string(), group,
          ErrnoText()));
    }
  }
  return absl::OkStatus();
}

bool LocalSocketAcceptsConnections(const fs::path& path) {
  sockaddr_un address{};
  const std::string text = path.string();
  if (text.size() >= sizeof(address.sun_path)) return false;
  FileDescriptor fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return false;
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, text.c_str(), text.size() + 1);
  return connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
}

absl::StatusOr<FileStamp> StampOf(const fs::path& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    const std::string message = absl::StrFormat("cannot stat %s: %s", path.string(), ErrnoText());
    return errno == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
  }
  auto nanos = [](const timespec& time) {
    return static_cast<int64_t>(time.tv_sec) * 1000000000 + time.tv_nsec;
  };
  return FileStamp{static_cast<uint64_t>(info.st_size), nanos(info.st_mtim), nanos(info.st_ctim),
                   static_cast<uint64_t>(info.st_ino)};
}

absl::Time ChangeTime(const FileStamp& stamp) { return absl::FromUnixNanos(stamp.changed); }

uint64_t AllocatedBytes(const fs::path& path) {
  struct stat info;
  if (lstat(path.c_str(), &info) != 0) return 0;
  return static_cast<uint64_t>(info.st_blocks) * 512;  // st_blocks counts 512-byte units everywhere
}

absl::Status WriteFileDurably(const fs::path& path, absl::string_view data) {
  FileDescriptor fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (fd.get() < 0) {
    return absl::InternalError(
        absl::StrFormat("cannot create %s: %s", path.string(), ErrnoText()));
  }
  size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = write(fd.get(), data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = absl::StrFormat("cannot write %s: %s", path.string(), ErrnoText());
      if (errno == ENOSPC || errno == EDQUOT) {
        return absl::ResourceExhaustedError(absl::StrCat(why, "; the disk is full"));
      }
      return absl::InternalError(absl::StrCat(why, "; check free disk space"));
    }
    written += static_cast<size_t>(n);
  }
  if (fdatasync(fd.get()) != 0) {
    return absl::InternalError(absl::StrFormat("cannot sync %s: %s", path.string(), ErrnoText()));
  }
  if (close(fd.release()) != 0) {
    return absl::InternalError(absl::StrFormat("cannot close %s: %s", path.string(), ErrnoText()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Replaced> MoveFileOver(const fs::path& from, const fs::path& to) {
  // POSIX renames over open files: holders keep the old inode.
  if (rename(from.c_str(), to.c_str()) != 0) {
    return absl::InternalError(absl::StrFormat("cannot move %s to %s: %s", from.string(),
                                               to.string(), ErrnoText()));
  }
  return Replaced::kYes;
}

absl::Status CreateFileSymlink(const fs::path& target, const fs::path& link) {
  if (symlink(target.c_str(), link.c_str()) != 0) {
    return absl::InternalError(absl::StrFormat("cannot link %s to %s: %s", link.string(),
                                               target.string(), ErrnoText()));
  }
  return absl::OkStatus();
}

bool StdoutIsTerminal() { return isatty(STDOUT_FILENO) != 0; }

void IgnoreBrokenPipes() { signal(SIGPIPE, SIG_IGN); }

void LowerCurrentThreadPriority() {
#ifdef __linux__
  // Linux gives each thread its own nice value (POSIX says it is the process's).
  // Taking the priority back needs privileges: hence "for the rest of its life".
  const auto thread = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, thread);
  if (errno == 0) (void)setpriority(PRIO_PROCESS, thread, std::min(nice + 10, 19));
#endif
}

namespace {

// The lock file at `path`, opened for flock; FAILED_PRECONDITION naming it.
absl::StatusOr<int> OpenLockFile(const fs::path& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot open lock file %s: %s", path.string(), ErrnoText()));
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExclusiveLock>> TryLockFile(const fs::path& path) {
  ASSIGN_OR_RETURN(const int opened, OpenLockFile(path));
  FileDescriptor fd(opened);
  if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is locked by another process: another kilnd already uses this data directory; stop "
        "it or pass a different --data-dir",
        path.string()));
  }
  return std::make_unique<FlockLock>(fd.release());
}

absl::StatusOr<std::unique_ptr<ExclusiveLock>> WaitForFileLock(const fs::path& path,
                                                               absl::Time deadline) {
  ASSIGN_OR_RETURN(const int opened, OpenLockFile(path));
  FileDescriptor fd(opened);
  // Polled rather than blocking, so that the wait ends at the deadline.
  while (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "another process held the lock on %s until the deadline (a client still starting "
          "kilnd?); try again",
          path.string()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return std::make_unique<FlockLock>(fd.release());
}

namespace {

class PosixLibrary : public DynamicLibrary {
 public:
  explicit PosixLibrary(void* handle) : handle_(handle) {}
  ~PosixLibrary() override { dlclose(handle_); }
  void* Symbol(const char* symbol) override { return dlsym(handle_, symbol); }

 private:
  void* handle_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DynamicLibrary>> LoadDynamicLibrary(
    const std::vector<std::string>& names) {
  std::string last_error;
  for (const std::string& name : names) {
    if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      return std::make_unique<PosixLibrary>(handle);
    }
    const char* error = dlerror();
    last_error = error != nullptr ? error : "unknown error";
  }
  return absl::NotFoundError(absl::StrFormat("cannot load %s: %s", absl::StrJoin(names, " or "),
                                             last_error));
}

namespace {
sigset_t ShutdownSignalSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}
}  // namespace

ShutdownSignals::ShutdownSignals() : state_(std::make_unique<State>()) {
  const sigset_t set = ShutdownSignalSet();
  // Threads inherit the mask, so only the waiter below ever sees these signals.
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A client that disconnects mid-write must not kill the service.
  signal(SIGPIPE, SIG_IGN);
  state_->signal_waiter = std::thread([this] {
    const sigset_t signals = ShutdownSignalSet();
    int signal_number = 0;
    while (sigwait(&signals, &signal_number) != 0) {
    }
    {
      std::lock_guard lock(state_->mutex);
      state_->signal_waiter_done = true;
    }
    Request(signal_number == SIGTERM ? "SIGTERM" : "SIGINT");
  });
}

ShutdownSignals::~ShutdownSignals() {
  // The waiter may still be in sigwait (the stop came from Request): wake it
  // with a signal aimed at that thread alone, which is discarded if the
  // thread has already returned from sigwait and exits.
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->signal_waiter_done) pthread_kill(state_->signal_waiter.native_handle(), SIGTERM);
  }
  state_->signal_waiter.join();
}

}  // namespace kiln::platform
