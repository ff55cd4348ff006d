#ifndef KILN_COMMON_PLATFORM_H_
#define KILN_COMMON_PLATFORM_H_

// The platform layer: everything that differs between Windows and POSIX hides
// behind these declarations. platform_posix.cc implements them for Linux;
// a Windows port adds platform_win.cc, not #ifdefs in callers.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kiln::platform {

// Whom a kilnd serves: one user (a per-user process, the systemd user unit),
// or the machine (a Windows service, the systemd system unit).
enum class Scope { kUser, kMachine };

// Kiln's data directory (SQLite index, blobs; on Windows also logs\, run\ and
// python\ below it). User: $XDG_CACHE_HOME/kiln or ~/.cache/kiln, Windows
// %LOCALAPPDATA%\kiln. Machine: /var/cache/kiln, Windows %ProgramData%\kiln.
std::filesystem::path DefaultDataDir(Scope scope = Scope::kUser);

// The config file read when no --config is given (it may not exist). User:
// $XDG_CONFIG_HOME/kiln/kilnd.conf or ~/.config/kiln/kilnd.conf, Windows
// %LOCALAPPDATA%\kiln\kilnd.conf. Machine: /etc/kiln/kilnd.conf, Windows
// %ProgramData%\kiln\kilnd.conf.
std::filesystem::path DefaultConfigPath(Scope scope = Scope::kUser);

// The private directory of the local transport (socket or endpoint file).
// User: $XDG_RUNTIME_DIR/kiln, else /tmp/kiln-<uid>; Windows
// %LOCALAPPDATA%\kiln\run. Machine: $KILN_MACHINE_RUNTIME_DIR, else /run/kiln
// (a system unit whose RuntimeDirectory differs, and test harnesses, which
// must not find the machine's kilnd, set it); Windows %ProgramData%\kiln\run.
std::filesystem::path DefaultRuntimeDir(Scope scope = Scope::kUser);

// The local transport clients use by default. POSIX: a Unix socket,
// DefaultRuntimeDir()/kilnd.sock, whose directory admits only its owner.
// Windows: Python's gRPC cannot use AF_UNIX there, so kilnd listens on
// 127.0.0.1 and writes the port and an access token to an endpoint file
// (DefaultRuntimeDir()\kilnd.endpoint) that only the allowed accounts can
// read. Each returns an empty path where the platform does not use it.
std::filesystem::path DefaultSocketPath(Scope scope = Scope::kUser);
std::filesystem::path DefaultEndpointFile(Scope scope = Scope::kUser);

// The gRPC target of the per-user local socket ("unix:/run/user/1000/kiln/kilnd.sock"),
// or empty on Windows, where clients read DefaultEndpointFile() instead.
std::string DefaultLocalEndpoint();

// The folder, under DefaultDataDir(scope), holding Python headers and import
// libraries Kiln provides for embedded Pythons that ship without them
// (<dir>\3.12\include, <dir>\3.12\libs).
std::filesystem::path KilnPythonDir(Scope scope = Scope::kUser);

// Creates `dir` (and parents) readable only by the current user, or checks that
// an existing one is a real directory owned by this user with no group/other
// access (Windows: sets a protected DACL granting only this account). On
// Windows, `readers` names further accounts ("DOMAIN\\user") given read
// access: the users a machine service serves. POSIX refuses `readers` (a Linux
// machine service shares its socket through the directory's group).
// FAILED_PRECONDITION says what is wrong and how to fix it.
absl::Status EnsurePrivateDirectory(const std::filesystem::path& dir,
                                    const std::vector<std::string>& readers = {});

// Lets members of `group` reach the Unix socket at `path`, which a machine
// kilnd serves its users on: the socket 0660 and its directory 0750, both of
// that group (kilnd's own account must be in it). Windows refuses: there,
// allowed_user names who may use a machine kilnd.
absl::Status ShareLocalSocket(const std::filesystem::path& path, const std::string& group);

// True when something accepts connections on the local socket at `path`; a
// socket file left by a crashed process answers false.
bool LocalSocketAcceptsConnections(const std::filesystem::path& path);

// Writes `data` to a new file at `path` and flushes it to stable storage
// before returning, so a later rename publishes complete content only.
// RESOURCE_EXHAUSTED when the disk is full.
absl::Status WriteFileDurably(const std::filesystem::path& path, absl::string_view data);

// The whole content of the file at `path`: NOT_FOUND when there is none,
// DATA_LOSS when it cannot be read to the end.
absl::StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path);

// One version of a file's content, identified without reading it: writing
// the file through any handle changes a field (POSIX: size, modification and
// status-change times, inode; Windows: size, last-write and change times, file
// index). Setting the modification time back changes the change time.
struct FileStamp {
  uint64_t size = 0;
  int64_t modified = 0;  // opaque ticks: compared, never converted
  int64_t changed = 0;
  uint64_t file_id = 0;
  bool operator==(const FileStamp&) const = default;
};

// The stamp of the file at `path`; NOT_FOUND when there is none.
absl::StatusOr<FileStamp> StampOf(const std::filesystem::path& path);

// When the file last changed, as the stamp says. File systems keep times in
// coarse ticks, so a second change within the same tick can keep the stamp:
// trust a stamp only for a file that last changed well before it was taken.
absl::Time ChangeTime(const FileStamp& stamp);

// What the file, directory or link at `path` itself (a link is not
// followed) takes on disk, as `du` counts it: its allocated blocks. 0 when
// there is nothing there. Windows: the size rounded up to the 4 KiB cluster
// (small files that live in the MFT count a cluster too; close enough to keep
// a size cap honest).
uint64_t AllocatedBytes(const std::filesystem::path& path);

// What MoveFileOver did.
enum class Replaced { kYes, kTargetInUse };

// Atomically moves `from` over `to`. On Windows a file another handle holds
// open without FILE_SHARE_DELETE (a loaded launcher DLL, a reader) cannot be
// replaced: that is kTargetInUse, and `from` is left in place. Other failures
// are INTERNAL, naming both paths.
absl::StatusOr<Replaced> MoveFileOver(const std::filesystem::path& from,
                                     const std::filesystem::path& to);

// Makes `link` a new symbolic link to the file `target`. UNIMPLEMENTED where
// this account may not make one (Windows without the privilege or Developer
// Mode): callers use links as a shortcut to a file, never as the only way.
absl::Status CreateFileSymlink(const std::filesystem::path& target,
                               const std::filesystem::path& link);

// Publishes `temp` as `target`, a file named for its content's digest: when
// the target is in use, the file already there has the same content, so it is
// kept and `temp` is removed. The rule the Python client's materialization
// follows too.
absl::Status PublishContentAddressedFile(const std::filesystem::path& temp,
                                         const std::filesystem::path& target);

// "HOST:PORT" or "[IPV6]:PORT" as its host (without brackets) and port;
// nullopt when it is not that form or the port is not 0..65535.
struct HostPort {
  std::string host;
  uint16_t port = 0;
};
std::optional<HostPort> SplitHostPort(absl::string_view address);

// The addresses `host` has for TCP (DNS, hosts file or a literal), as a gRPC
// "ipv4:"/"ipv6:" target lists them ("10.0.0.1:7733", "[::1]:7733"), in the
// resolver's order without repeats. UNAVAILABLE naming `host` when it has none.
struct TcpAddresses {
  std::vector<std::string> ipv4;
  std::vector<std::string> ipv6;
};
absl::StatusOr<TcpAddresses> ResolveTcpAddresses(const std::string& host, uint16_t port);

// True when standard output is an interactive terminal (a console on Windows).
bool StdoutIsTerminal();

// A write to a pipe or socket whose reader is gone fails with an error rather
// than end the process (SIGPIPE on POSIX; Windows has no such signal): for
// programs that write to peers they do not control (a registry, a credential
// helper).
void IgnoreBrokenPipes();

// Lowers the calling thread's CPU priority for the rest of its life (its nice
// value 10 higher, at most 19, on Linux; below normal on Windows): for threads
// doing work nobody waits for right now, so they yield to those serving
// requests. Best effort.
void LowerCurrentThreadPriority();

// An exclusive advisory lock held for the object's lifetime; released by the
// OS if the process dies.
class ExclusiveLock {
 public:
  virtual ~ExclusiveLock() = default;
};

// Takes the lock on `path` without waiting. FAILED_PRECONDITION if another
// process holds it.
absl::StatusOr<std::unique_ptr<ExclusiveLock>> TryLockFile(const std::filesystem::path& path);

// Takes the lock on `path` (the same lock TryLockFile takes), waiting while
// another process holds it. DEADLINE_EXCEEDED at `deadline`, naming the file;
// FAILED_PRECONDITION when it cannot be opened.
absl::StatusOr<std::unique_ptr<ExclusiveLock>> WaitForFileLock(const std::filesystem::path& path,
                                                               absl::Time deadline);

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

// Turns the OS's stop requests (SIGTERM/SIGINT; Ctrl+C, console close and
// logoff on Windows) and in-process ones (a Windows service's stop control)
// into one blocking wait. Construct it before starting any thread, so that no
// other thread receives the signals.
class ShutdownSignals {
 public:
  ShutdownSignals();
  ~ShutdownSignals();
  ShutdownSignals(const ShutdownSignals&) = delete;
  ShutdownSignals& operator=(const ShutdownSignals&) = delete;

  // Asks Wait() to return `reason`; the first request wins.
  void Request(const std::string& reason);
  // Blocks until a stop is requested; returns its reason ("SIGTERM").
  std::string Wait();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kiln::platform

#endif  // KILN_COMMON_PLATFORM_H_
