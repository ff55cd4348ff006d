#include "common/gpu_targets.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace kiln {

std::vector<std::string> ParseComputeCapabilities(absl::string_view output) {
  std::vector<std::string> targets;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipWhitespace())) {
    std::vector<absl::string_view> parts = absl::StrSplit(absl::StripAsciiWhitespace(line), '.');
    int major = 0;
    int minor = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &major) || !absl::SimpleAtoi(parts[1], &minor) ||
        major < 1 || major > 99 || minor < 0 || minor > 9) {
      continue;
    }
    std::string target = absl::StrCat("cuda:", major * 10 + minor);
    if (std::find(targets.begin(), targets.end(), target) == targets.end()) targets.push_back(std::move(target));
  }
  return targets;
}

std::vector<std::string> DetectGpuTargets() {
  const std::filesystem::path nvidia_smi = FindOnPath("nvidia-smi");
  if (nvidia_smi.empty()) return {};
  absl::StatusOr<CommandResult> result = RunCommand(
      {nvidia_smi.string(), "--query-gpu=compute_cap", "--format=csv,noheader"}, absl::Seconds(10));
  if (!result.ok() || !result->succeeded) return {};
  return ParseComputeCapabilities(result->output);
}

}  // namespace kiln
