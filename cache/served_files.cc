#include "cache/served_files.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache/disk_usage.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;
using platform::FileStamp;

constexpr absl::string_view kTempSuffix = ".tmp";
constexpr char kIndexDir[] = "index";
constexpr char kLinksDir[] = "links";
// Each tree fans out by the first hex digit of its names: 16 directories. With
// 256, a few dozen kernels cost nearly a directory for every file; 16 hold a
// farm's million entries at some 60k names each, which ext4's and NTFS's
// indexed directories find by name as fast as a few hundred.
constexpr size_t kFanOutDigits = 1;

bool IsSafeExtensionChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

absl::Status WriteFile(const fs::path& path, absl::string_view content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

std::atomic<uint64_t> temp_counter{0};

// A JSON string literal of `text` (UTF-8 passes through; control characters,
// quotes and backslashes are escaped).
std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The paths an index entry PublishIndex wrote names: each follows `": ["`,
// which only ever starts a [path, size] pair since names are escaped.
std::vector<fs::path> IndexedPaths(absl::string_view json) {
  std::vector<fs::path> paths;
  constexpr absl::string_view kPairStart = "\": [\"";
  for (size_t at = json.find(kPairStart); at != absl::string_view::npos;
       at = json.find(kPairStart, at)) {
    at += kPairStart.size();
    std::string path;
    for (; at < json.size() && json[at] != '"'; ++at) {
      // Only \\ and \" occur: paths have no control characters.
      if (json[at] == '\\' && at + 1 < json.size()) ++at;
      path += json[at];
    }
    paths.emplace_back(path);
  }
  return paths;
}

}  // namespace

ServedFiles::ServedFiles(fs::path dir, absl::Duration trust_changed_before)
    : dir_(std::move(dir)), trusted_(trust_changed_before) {}

absl::Status ServedFiles::Initialize(const std::vector<std::string>& readers) {
  RETURN_IF_ERROR(platform::EnsurePrivateDirectory(dir_, readers));
  std::error_code error;
  fs::create_directories(hits_dir(), error);  // without it clients call RecordHits instead
  return absl::OkStatus();
}

std::optional<std::string> ServedFiles::ExtensionOf(absl::string_view name) {
  const size_t dot = name.find('.');
  // Everything from the first dot: ".cubin", ".cpython-312-x86_64-linux-gnu.so".
  const absl::string_view extension = dot == 0 || dot == absl::string_view::npos
                                          ? absl::string_view()
                                          : name.substr(dot);
  if (extension.size() > 64 || absl::EndsWith(extension, kTempSuffix) ||
      !std::all_of(extension.begin(), extension.end(), IsSafeExtensionChar)) {
    return std::nullopt;
  }
  return std::string(extension);
}

fs::path ServedFiles::PathOf(absl::string_view digest, absl::string_view extension) const {
  const std::string hex = DigestHex(digest);
  return dir_ / hex.substr(0, kFanOutDigits) / absl::StrCat(hex, extension);
}

std::optional<fs::path> ServedFiles::Find(absl::string_view digest, absl::string_view extension) {
  fs::path path = PathOf(digest, extension);
  absl::StatusOr<FileStamp> before = platform::StampOf(path);
  if (!before.ok()) return std::nullopt;
  if (trusted_.Unchanged(path.string(), *before)) return path;
  // Written before this kilnd started, changed since it was checked, or too
  // young to trust its stamp: its content decides.
  absl::StatusOr<std::string> content = platform::ReadWholeFile(path);
  absl::StatusOr<FileStamp> after = platform::StampOf(path);
  if (!content.ok() || !after.ok() || *after != *before ||
      DigestBytes(Sha256(*content)) != digest) {
    return std::nullopt;
  }
  trusted_.Remember(path.string(), *before);
  return path;
}

fs::path ServedFiles::KeyedPathOf(absl::string_view subdir, absl::string_view ns,
                                  absl::string_view key, absl::string_view extension) const {
  const std::string hex =
      DigestHex(DigestBytes(Sha256(absl::StrCat(ns, absl::string_view("\0", 1), key))));
  return dir_ / std::string(subdir) / hex.substr(0, kFanOutDigits) /
         absl::StrCat(hex.substr(kFanOutDigits), extension);
}

absl::StatusOr<platform::Replaced> ServedFiles::WriteAndMove(const fs::path& target,
                                                             absl::string_view content) {
  std::error_code error;
  fs::create_directories(target.parent_path(), error);
  const fs::path temp =
      target.parent_path() / absl::StrCat(".", temp_counter.fetch_add(1), kTempSuffix);
  RETURN_IF_ERROR(WriteFile(temp, content));
  const auto before = static_cast<int64_t>(platform::AllocatedBytes(target));
  const auto written = static_cast<int64_t>(platform::AllocatedBytes(temp));
  absl::StatusOr<platform::Replaced> replaced = platform::MoveFileOver(temp, target);
  if (!replaced.ok() || *replaced == platform::Replaced::kTargetInUse) {
    fs::remove(temp, error);
  } else {
    bytes_ += written - before;
  }
  return replaced;
}

absl::StatusOr<ServedFiles::Written> ServedFiles::Publish(absl::string_view digest,
                                                          absl::string_view extension,
                                                          absl::string_view content) {
  fs::path target = PathOf(digest, extension);
  ASSIGN_OR_RETURN(const platform::Replaced replaced, WriteAndMove(target, content));
  if (replaced == platform::Replaced::kTargetInUse) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is held open by another process with other content", target.string()));
  }
  if (absl::StatusOr<FileStamp> stamp = platform::StampOf(target); stamp.ok()) {
    trusted_.Remember(target.string(), *stamp);
  }
  const uint64_t disk_bytes = platform::AllocatedBytes(target);
  return Written{std::move(target), disk_bytes};
}

absl::StatusOr<std::optional<ServedFiles::IndexFootprint>> ServedFiles::PublishIndex(
    absl::string_view ns, absl::string_view key, const std::vector<IndexedFile>& files) {
  const fs::path index = KeyedPathOf(kIndexDir, ns, key, ".json");
  bool changed = false;
  IndexFootprint footprint;
  if (files.size() == 1 && !links_unavailable_.load(std::memory_order_relaxed)) {
    ASSIGN_OR_RETURN(footprint.link_extension, PublishLink(ns, key, files.front(), changed));
  }
  if (footprint.link_extension.has_value()) {
    // A client finds a one-file entry by its link (index.py's lookup_file):
    // an index entry beside it would only be one more file. One an earlier
    // lookup wrote goes.
    std::error_code error;
    if (fs::exists(index, error)) {
      RemoveCounted(index);
      changed = true;
    }
  } else {
    std::string json = "{\"files\": {";
    for (size_t i = 0; i < files.size(); ++i) {
      absl::StrAppend(&json, i == 0 ? "" : ", ", JsonString(files[i].name), ": [",
                      JsonString(files[i].path.string()), ", ", files[i].size, "]");
    }
    json += "}}";
    if (absl::StatusOr<std::string> existing = platform::ReadWholeFile(index);
        !existing.ok() || *existing != json) {
      // An index entry a client holds open (Windows) is replaced at the next chance.
      RETURN_IF_ERROR(WriteAndMove(index, json).status());
      changed = true;
    }
  }
  if (!changed) return std::nullopt;
  footprint.disk_bytes = platform::AllocatedBytes(index);
  if (footprint.link_extension.has_value()) {
    footprint.disk_bytes +=
        platform::AllocatedBytes(KeyedPathOf(kLinksDir, ns, key, *footprint.link_extension));
  }
  return footprint;
}

absl::StatusOr<std::optional<std::string>> ServedFiles::PublishLink(absl::string_view ns,
                                                                   absl::string_view key,
                                                                   const IndexedFile& file,
                                                                   bool& changed) {
  std::optional<std::string> extension = ExtensionOf(file.name);
  if (!extension) return std::nullopt;  // the client finds no link for such a name either
  const fs::path link = KeyedPathOf(kLinksDir, ns, key, *extension);
  std::error_code error;
  // Relative ("../../<h>/<file>"): the links survive the data directory moving.
  const fs::path target = file.path.lexically_relative(link.parent_path());
  if (target.empty()) {
    return absl::InternalError(absl::StrFormat("%s is not under %s", file.path.string(), dir_.string()));
  }
  if (fs::read_symlink(link, error) == target) return extension;
  fs::create_directories(link.parent_path(), error);
  // Made under a temporary name and moved over the old link: a client never
  // finds the name missing or pointing at the wrong file.
  const fs::path temp =
      link.parent_path() / absl::StrCat(".", temp_counter.fetch_add(1), kTempSuffix);
  if (absl::Status made = platform::CreateFileSymlink(target, temp); !made.ok()) {
    if (absl::IsUnimplemented(made)) {
      links_unavailable_ = true;
      spdlog::info("{}; local clients find single-file entries through the index",
                   std::string(made.message()));
      return std::nullopt;
    }
    return made;
  }
  const auto before = static_cast<int64_t>(platform::AllocatedBytes(link));
  const auto made = static_cast<int64_t>(platform::AllocatedBytes(temp));
  absl::StatusOr<platform::Replaced> moved = platform::MoveFileOver(temp, link);
  if (moved.ok()) {
    links_moved_ = true;
    bytes_ += made - before;
    changed = true;
    return extension;
  }
  fs::remove(temp, error);
  // A file system that makes links but has never let one be moved into place
  // (Wine's, for one): the index serves, as where links cannot be made at all.
  if (!links_moved_.load() && !links_unavailable_.exchange(true)) {
    spdlog::info("links cannot be moved into place here ({}); local clients find single-file "
                 "entries through the index",
                 std::string(moved.status().message()));
    return std::nullopt;
  }
  return moved.status();
}

void ServedFiles::RemoveCounted(const fs::path& path, std::vector<Leftover>* leftovers) {
  std::error_code error;
  trusted_.Forget(path.string());
  const uint64_t size = platform::AllocatedBytes(path);
  if (fs::remove(path, error) || !fs::exists(path, error)) {
    bytes_ -= static_cast<int64_t>(size);
    return;
  }
  // A file a client holds open (a loaded launcher module on Windows) stays
  // behind: the owner retries it once its holder lets go.
  if (leftovers != nullptr) {
    bytes_ -= static_cast<int64_t>(size);
    leftovers->push_back({path, size});
  }
}

void ServedFiles::Remove(absl::string_view digest, const std::vector<std::string>& extensions,
                         std::vector<Leftover>* leftovers) {
  for (const std::string& extension : extensions) RemoveCounted(PathOf(digest, extension), leftovers);
}

void ServedFiles::Detach(absl::string_view digest, const std::vector<std::string>& extensions,
                         std::vector<Leftover>& detached) {
  for (const std::string& extension : extensions) {
    const fs::path path = PathOf(digest, extension);
    trusted_.Forget(path.string());
    std::error_code error;
    if (!fs::exists(path, error)) continue;
    const uint64_t size = platform::AllocatedBytes(path);
    bytes_ -= static_cast<int64_t>(size);
    detached.push_back({path, size});
  }
}

void ServedFiles::RemoveIndex(absl::string_view ns, absl::string_view key,
                              const std::optional<std::string>& link_extension) {
  RemoveCounted(KeyedPathOf(kIndexDir, ns, key, ".json"));
  if (link_extension.has_value()) RemoveCounted(KeyedPathOf(kLinksDir, ns, key, *link_extension));
}

void ServedFiles::MeasureDirectories() {
  std::error_code error;
  int64_t measured = static_cast<int64_t>(platform::AllocatedBytes(dir_));
  for (const fs::path& tree : {dir_, dir_ / kIndexDir, dir_ / kLinksDir}) {
    if (tree != dir_) measured += static_cast<int64_t>(platform::AllocatedBytes(tree));
    for (const fs::directory_entry& subdir : fs::directory_iterator(tree, error)) {
      const std::string name = subdir.path().filename().string();
      // The fan-out directories; the trees and hits/ are counted on their own.
      if (name.size() == kFanOutDigits && subdir.is_directory(error)) {
        measured += static_cast<int64_t>(platform::AllocatedBytes(subdir.path()));
      }
    }
  }
  directory_bytes_ = measured;
}

bool ServedFiles::RemoveOrphans(
    absl::FunctionRef<bool(absl::string_view digest, absl::string_view extension)> is_recorded,
    StopRequested stop_requested) {
  std::error_code error;
  // This kilnd's own writes run while the sweep does: their temporary files are
  // newer than it. Only older ones (with a margin for file times' coarse clock)
  // were left by a kilnd killed mid-write; removing a newer one failed the write.
  const fs::file_time_type older_than = fs::file_time_type::clock::now() - std::chrono::seconds(2);
  const auto left_by_an_earlier_kilnd = [&](const fs::path& temp) {
    std::error_code time_error;
    const fs::file_time_type written = fs::last_write_time(temp, time_error);
    return !time_error && written < older_than;
  };
  const fs::path index_dir = dir_ / kIndexDir;
  const fs::path links_dir = dir_ / kLinksDir;
  for (auto it = fs::recursive_directory_iterator(dir_, error);
       it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (stop_requested()) return false;
    const fs::directory_entry& file = *it;
    if (file.path() == index_dir || file.path() == links_dir || file.path() == hits_dir()) {
      it.disable_recursion_pending();
      continue;
    }
    if (!file.is_regular_file(error)) continue;
    const std::string name = file.path().filename().string();
    if (absl::EndsWith(name, kTempSuffix)) {
      if (left_by_an_earlier_kilnd(file.path())) fs::remove(file.path(), error);
      continue;
    }
    const std::string hex = name.substr(0, 2 * kSha256Size);
    if (hex.size() != 2 * kSha256Size ||
        !std::all_of(hex.begin(), hex.end(), absl::ascii_isxdigit) ||
        !is_recorded(absl::HexStringToBytes(hex), absl::string_view(name).substr(hex.size()))) {
      fs::remove(file.path(), error);
    }
  }
  for (auto it = fs::recursive_directory_iterator(index_dir, error);
       it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (stop_requested()) return false;
    const fs::directory_entry& entry = *it;
    if (!entry.is_regular_file(error)) continue;
    if (absl::EndsWith(entry.path().filename().string(), kTempSuffix)) {
      if (left_by_an_earlier_kilnd(entry.path())) fs::remove(entry.path(), error);
      continue;
    }
    absl::StatusOr<std::string> json = platform::ReadWholeFile(entry.path());
    bool stale = !json.ok();
    if (!stale) {
      const std::vector<fs::path> paths = IndexedPaths(*json);
      stale = std::any_of(paths.begin(), paths.end(),
                          [](const fs::path& path) { return !fs::exists(path); });
    }
    if (stale) RemoveCounted(entry.path());
  }
  for (auto it = fs::recursive_directory_iterator(links_dir, error);
       it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (stop_requested()) return false;
    // exists() follows the link: false for one whose file is gone. A temporary
    // link is left alone while its file is there: the link's own time cannot be
    // read portably, so one being made now cannot be told from one left behind.
    if (it->is_symlink(error) && !fs::exists(it->path(), error)) RemoveCounted(it->path());
  }
  return true;
}

}  // namespace kiln::cache
