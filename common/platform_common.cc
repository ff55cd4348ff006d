// The parts of the platform layer that are the same on every OS, built on the
// per-OS primitives.

#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/platform.h"
#include "common/platform_internal.h"

namespace kiln::platform {

absl::StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::string content(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  in.read(content.data(), static_cast<std::streamsize>(content.size()));
  if (!in) return absl::DataLossError(absl::StrCat("cannot read ", path.string()));
  return content;
}

absl::Status PublishContentAddressedFile(const std::filesystem::path& temp,
                                         const std::filesystem::path& target) {
  absl::StatusOr<Replaced> replaced = MoveFileOver(temp, target);
  if (!replaced.ok()) return replaced.status();
  if (*replaced == Replaced::kTargetInUse) {
    std::error_code error;
    std::filesystem::remove(temp, error);
  }
  return absl::OkStatus();
}

void ShutdownSignals::Request(const std::string& reason) {
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->reason.empty()) return;
    state_->reason = reason.empty() ? "stop requested" : reason;
  }
  state_->requested.notify_all();
}

std::string ShutdownSignals::Wait() {
  std::unique_lock lock(state_->mutex);
  state_->requested.wait(lock, [this] { return !state_->reason.empty(); });
  return state_->reason;
}

}  // namespace kiln::platform
