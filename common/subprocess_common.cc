// The parts of subprocess.h that are the same on every OS, built on Subprocess.

#include "absl/strings/str_format.h"
#include "common/subprocess.h"

namespace kiln {

absl::StatusOr<std::string> Subprocess::ReadExactly(size_t size, absl::Time deadline) {
  std::string data;
  data.reserve(size);
  while (data.size() < size) {
    absl::StatusOr<std::string> chunk = ReadSome(size - data.size(), deadline);
    if (!chunk.ok()) return chunk.status();
    if (chunk->empty()) return absl::UnavailableError("the process closed its output (it exited)");
    data += *chunk;
  }
  return data;
}

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration timeout, const SpawnOptions& options) {
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Spawn(argv, options);
  if (!process.ok()) return process.status();
  (*process)->CloseStdin();
  CommandResult result;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<std::string> chunk = (*process)->ReadSome(64 * 1024, deadline);
    if (absl::IsDeadlineExceeded(chunk.status())) {
      (*process)->Kill();
      (*process)->Wait();
      result.exit_description =
          absl::StrFormat("timed out after %s", absl::FormatDuration(timeout));
      result.errors = (*process)->StderrTail();
      return result;
    }
    if (!chunk.ok() || chunk->empty()) break;  // end of output
    result.output += *chunk;
  }
  result.exit_description = (*process)->Wait();
  result.succeeded = (*process)->Succeeded();
  result.errors = (*process)->StderrTail();
  return result;
}

std::filesystem::path ExecutableDir() {
  const std::filesystem::path self = ExecutablePath();
  return self.empty() ? std::filesystem::current_path() : self.parent_path();
}

}  // namespace kiln
