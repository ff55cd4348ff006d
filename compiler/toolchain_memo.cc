#include "compiler/toolchain_memo.h"

#include <algorithm>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/platform.h"

namespace kiln::compiler {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kHeader = "kiln toolchain probes 1";
constexpr int kFields = 7;

// "<size>:<mtime>" of a file; empty when it cannot be read.
std::string FileStamp(const fs::path& file) {
  std::error_code error;
  const uintmax_t size = fs::file_size(file, error);
  if (error) return "";
  const fs::file_time_type modified = fs::last_write_time(file, error);
  if (error) return "";
  return absl::StrCat(size, ":", modified.time_since_epoch().count());
}

bool Storable(absl::string_view field) {
  return field.find_first_of("\t\r\n") == absl::string_view::npos;
}

}  // namespace

std::string ToolchainIdentity(const fs::path& python_executable, const fs::path& triton_dir) {
  if (triton_dir.empty()) return "";
  std::vector<fs::path> files = {python_executable, triton_dir / "__init__.py"};
  std::vector<fs::path> compiled;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(triton_dir / "_C", error)) {
    if (entry.is_regular_file(error)) compiled.push_back(entry.path());
  }
  if (error || compiled.empty()) return "";
  std::sort(compiled.begin(), compiled.end());
  files.insert(files.end(), compiled.begin(), compiled.end());
  std::vector<std::string> stamps;
  for (const fs::path& file : files) {
    std::string stamp = FileStamp(file);
    if (stamp.empty()) return "";
    stamps.push_back(absl::StrCat(file.filename().string(), "=", stamp));
  }
  return absl::StrJoin(stamps, ";");
}

ToolchainMemo::ToolchainMemo(fs::path file) : file_(std::move(file)) {}

void ToolchainMemo::LoadLocked() {
  if (loaded_) return;
  loaded_ = true;
  if (file_.empty()) return;
  absl::StatusOr<std::string> text = platform::ReadWholeFile(file_);
  if (!text.ok()) return;  // none yet
  std::vector<absl::string_view> lines = absl::StrSplit(*text, '\n', absl::SkipEmpty());
  if (lines.empty() || lines.front() != kHeader) return;  // another version's: probed again
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> fields = absl::StrSplit(lines[i], '\t');
    if (fields.size() != kFields) continue;
    ToolchainInfo info{fields[2], fields[3], fields[0], fields[4],
                       absl::StrSplit(fields[5], ',', absl::SkipEmpty()), fields[6]};
    by_python_[fields[0]] = Remembered{fields[1], std::move(info)};
  }
}

std::optional<ToolchainInfo> ToolchainMemo::Recall(const fs::path& python_executable) {
  std::lock_guard lock(mutex_);
  LoadLocked();
  const auto found = by_python_.find(python_executable.string());
  if (found == by_python_.end()) return std::nullopt;
  const ToolchainInfo& info = found->second.info;
  if (ToolchainIdentity(python_executable, info.triton_dir) != found->second.identity) {
    return std::nullopt;
  }
  ToolchainInfo recalled = info;
  recalled.remembered = true;
  return recalled;
}

void ToolchainMemo::Remember(const ToolchainInfo& info) {
  const std::string identity = ToolchainIdentity(info.python_executable, info.triton_dir);
  const std::string backends = absl::StrJoin(info.backends, ",");
  const std::vector<absl::string_view> fields = {
      info.python_executable, identity,          info.triton_key, info.triton_version,
      info.python_version,    backends,          info.triton_dir};
  if (file_.empty() || identity.empty() || !std::all_of(fields.begin(), fields.end(), Storable)) {
    return;
  }
  std::lock_guard lock(mutex_);
  LoadLocked();
  by_python_[info.python_executable] = Remembered{identity, info};
  std::string text = absl::StrCat(kHeader, "\n");
  for (const auto& [python, remembered] : by_python_) {
    const ToolchainInfo& known = remembered.info;
    absl::StrAppend(&text, absl::StrJoin({python, remembered.identity, known.triton_key,
                                          known.triton_version, known.python_version,
                                          absl::StrJoin(known.backends, ","), known.triton_dir},
                                         "\t"),
                    "\n");
  }
  // Whole or not at all: a stop may come mid-write.
  fs::path temp = file_;
  temp += ".tmp";
  std::error_code error;
  fs::remove(temp, error);
  if (platform::WriteFileDurably(temp, text).ok()) {
    (void)platform::MoveFileOver(temp, file_);
  }
  fs::remove(temp, error);
}

}  // namespace kiln::compiler
