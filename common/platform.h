#ifndef KILN_COMMON_PLATFORM_H_
#define KILN_COMMON_PLATFORM_H_

// The platform layer: everything that differs between Windows and POSIX hides
// behind these declarations. platform_posix.cc implements them for Linux;
// a Windows port adds platform_win.cc, not #ifdefs in callers.

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln::platform {

// Where kilnd keeps its database and blob files when the config names none:
// $XDG_CACHE_HOME/kiln or ~/.cache/kiln (Windows: %LOCALAPPDATA%\kiln).
std::filesystem::path DefaultDataDir();

// The config file read when no --config is given (it may not exist):
// $XDG_CONFIG_HOME/kiln/kilnd.conf or ~/.config/kiln/kilnd.conf.
std::filesystem::path DefaultConfigPath();

// The per-user directory that holds the local socket: $XDG_RUNTIME_DIR/kiln,
// else /tmp/kiln-<uid>. Only the owner may enter it.
std::filesystem::path DefaultSocketDir();

// The gRPC target of the per-user local socket, e.g. "unix:/run/user/1000/kiln/kilnd.sock".
std::string DefaultLocalEndpoint();

// Creates `dir` (and parents) readable only by the current user, or checks that
// an existing one is a real directory owned by this user with no group/other
// access. FAILED_PRECONDITION says what is wrong and how to fix it.
absl::Status EnsurePrivateDirectory(const std::filesystem::path& dir);

// True when something accepts connections on the local socket at `path`; a
// socket file left by a crashed process answers false.
bool LocalSocketAcceptsConnections(const std::filesystem::path& path);

// Writes `data` to a new file at `path` and flushes it to stable storage
// before returning, so a later rename publishes complete content only.
absl::Status WriteFileDurably(const std::filesystem::path& path, absl::string_view data);

// An exclusive advisory lock held for the object's lifetime; released by the
// OS if the process dies.
class ExclusiveLock {
 public:
  virtual ~ExclusiveLock() = default;
};

// Takes the lock on `path` without waiting. FAILED_PRECONDITION if another
// process holds it.
absl::StatusOr<std::unique_ptr<ExclusiveLock>> TryLockFile(const std::filesystem::path& path);

// A shared library loaded at run time (dlopen / LoadLibrary), unloaded with
// the object.
class DynamicLibrary {
 public:
  virtual ~DynamicLibrary() = default;
  // The address of `symbol`, or null.
  virtual void* Symbol(const char* symbol) = 0;
};

// Loads the first of `names` that the system's loader finds. NOT_FOUND names
// them all and the loader's last error.
absl::StatusOr<std::unique_ptr<DynamicLibrary>> LoadDynamicLibrary(
    const std::vector<std::string>& names);

// Turns the OS's stop requests (SIGTERM/SIGINT; console close on Windows) into
// a blocking wait. Construct it before starting any thread, so that no other
// thread receives the signals.
class ShutdownSignals {
 public:
  ShutdownSignals();
  ShutdownSignals(const ShutdownSignals&) = delete;
  ShutdownSignals& operator=(const ShutdownSignals&) = delete;

  // Blocks until a stop is requested; returns its name ("SIGTERM").
  std::string Wait();
};

}  // namespace kiln::platform

#endif  // KILN_COMMON_PLATFORM_H_
