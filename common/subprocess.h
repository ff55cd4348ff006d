#ifndef KILN_COMMON_SUBPROCESS_H_
#define KILN_COMMON_SUBPROCESS_H_

// Child processes with pipes: the platform layer's process spawning.
// subprocess_posix.cc implements it with posix_spawn; Windows adds
// subprocess_win.cc with CreateProcess.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kiln {

struct SpawnOptions {
  // Variables set on top of the parent's environment.
  std::map<std::string, std::string> env;
  std::filesystem::path working_dir;  // empty: the parent's
  // Keep at most this many trailing bytes of stderr (for error reports).
  size_t stderr_tail_bytes = 64 * 1024;
};

class Subprocess {
 public:
  // Starts argv[0] (searched on PATH if it has no slash) with stdin and stdout
  // as pipes to us; stderr is collected in the background. FAILED_PRECONDITION
  // when the program cannot be started, naming it.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(const std::vector<std::string>& argv,
                                                           const SpawnOptions& options = {});
  virtual ~Subprocess() = default;

  virtual int pid() const = 0;
  // Writes all of `data` to the child's stdin. UNAVAILABLE if the child is gone.
  virtual absl::Status Write(absl::string_view data) = 0;
  // Closes the child's stdin, so it sees end of input.
  virtual void CloseStdin() = 0;
  // Reads what is available, up to `max_size` bytes, waiting until `deadline`
  // for at least one. An empty result means the child closed stdout.
  virtual absl::StatusOr<std::string> ReadSome(size_t max_size, absl::Time deadline) = 0;
  // Reads exactly `size` bytes of the child's stdout. DEADLINE_EXCEEDED at
  // `deadline`; UNAVAILABLE if the child closed stdout (usually: it died).
  absl::StatusOr<std::string> ReadExactly(size_t size, absl::Time deadline);
  // The last bytes the child wrote to stderr so far.
  std::string StderrTail() { return StderrTailSince(0); }
  // How many bytes the child wrote to stderr so far: a mark for StderrTailSince.
  virtual uint64_t StderrWritten() = 0;
  // The last bytes of what the child wrote to stderr after `mark`.
  virtual std::string StderrTailSince(uint64_t mark) = 0;
  // Kills the child at once (SIGKILL / TerminateProcess).
  virtual void Kill() = 0;
  // Waits for exit; returns a description such as "exit code 1" or "killed by
  // signal 9 (SIGKILL)". Idempotent.
  virtual std::string Wait() = 0;
  // True when it exited with status 0.
  virtual bool Succeeded() = 0;
};

struct CommandResult {
  bool succeeded = false;
  std::string exit_description;  // "exit code 1", "timed out after 60 s", ...
  std::string output;            // stdout
  std::string errors;            // stderr tail
};

// Runs a command to completion with no input, killing it at `timeout`.
// FAILED_PRECONDITION only when it cannot be started at all.
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration timeout, const SpawnOptions& options = {});

// Starts `argv` (argv[0] a path) as a process that outlives this one and
// belongs to no terminal or console: a session of its own (POSIX), a process
// group with no console (Windows). It has no standard streams (the null
// device on POSIX), and its environment is this process's less the variables
// whose names begin with one of `dropped_prefixes`. Nothing here waits for it
// to exit (POSIX: a thread reaps it). FAILED_PRECONDITION when it cannot be started, naming it.
absl::Status SpawnDetached(const std::vector<std::string>& argv,
                           const std::vector<std::string>& dropped_prefixes);

// The absolute path of an executable found on PATH, or empty.
std::filesystem::path FindOnPath(absl::string_view program);

// The running executable, or empty if the system cannot say.
std::filesystem::path ExecutablePath();
// Its directory (the working directory if the system cannot say).
std::filesystem::path ExecutableDir();

}  // namespace kiln

#endif  // KILN_COMMON_SUBPROCESS_H_
