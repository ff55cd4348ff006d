#ifndef KILN_CACHE_SERVED_FILES_H_
#define KILN_CACHE_SERVED_FILES_H_

// Blobs as plain files that kilnd's local clients read themselves: a local
// lookup answers with paths instead of bytes, so a hit costs a client what a
// hit in Triton's own file cache costs (open and read), however large the
// blobs. Stored blobs may be compressed or inline in SQLite; a served file is
// the uncompressed content under
//   <dir>/<h>/<64 hex><extension>
// named for the content's SHA-256 and the blob name's extension (Triton tells
// artifacts apart by suffix and imports launcher modules by it).
//
// A served file is never handed out unless its content is the blob's: its
// stamp is recorded when kilnd wrote or hashed it, and a file whose stamp
// changed since is hashed again (and rewritten if it no longer matches).
// Served files are a derived copy: losing them loses nothing, they are not
// fsynced, and they go when their blob goes.
//
// Beside them, an index lets local clients find an entry's files without
// asking kilnd at all (the Python client's _index.py reads it):
//   <dir>/index/<h>/<63 hex>.json   {"files": {"<blob name>": ["<path>", <size>]}}
// named by the SHA-256 of "<namespace>\0<key>" in the client's namespace. A
// client uses an entry only while every file is there with its size.
//
// An entry of one file (a launcher module: Triton's get_file) gets a symbolic
// link to it instead, named by the same digest and the file's extension:
//   <dir>/links/<h>/<63 hex><extension>
// so that a client finds it with one stat, as stock Triton's file cache does,
// and it costs one file less. A link whose file is gone dangles, which a
// client sees as a miss. Where this account may not make links (Windows
// without the privilege), such an entry gets an index entry like any other.
//
// Clients report the hits they served themselves in <dir>/hits (hit_journal.h).
//
// The owner records every file written here (which served copies a blob has,
// what an entry's index file and link take), so that removing them, and
// knowing what the directory holds, never needs to read a directory.

#include <atomic>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cache/trusted_stamps.h"
#include "common/platform.h"

namespace kiln::cache {

class ServedFiles {
 public:
  // `trust_changed_before`: as StoreOptions::trust_files_changed_before.
  ServedFiles(std::filesystem::path dir, absl::Duration trust_changed_before);

  const std::filesystem::path& dir() const { return dir_; }
  // Where clients journal their hits (HitJournal); left alone by RemoveOrphans.
  std::filesystem::path hits_dir() const { return dir_ / "hits"; }

  // Creates the directory, readable by this account and `readers` (Windows
  // accounts a machine service serves; see platform::EnsurePrivateDirectory).
  absl::Status Initialize(const std::vector<std::string>& readers);

  // The extension a served file of blob `name` gets, or nullopt when `name`
  // cannot be served as a file (its extension has characters that are not
  // safe in a file name everywhere, such as ':' on Windows).
  static std::optional<std::string> ExtensionOf(absl::string_view name);

  // The served file of blob `digest` (raw SHA-256) under `extension`, when it
  // is there with exactly that content.
  std::optional<std::filesystem::path> Find(absl::string_view digest, absl::string_view extension);

  // A file written, and what it takes on disk (platform::AllocatedBytes).
  struct Written {
    std::filesystem::path path;
    uint64_t disk_bytes = 0;
  };

  // Writes `content`, whose SHA-256 the caller checked is `digest`, as the
  // served file. FAILED_PRECONDITION when another process holds a file with
  // other content open there (Windows). The caller records it (ArtifactStore's
  // served_copies), so that Remove finds it without looking.
  absl::StatusOr<Written> Publish(absl::string_view digest, absl::string_view extension,
                                  absl::string_view content);

  // Writes the index entry of (ns, key) naming `files` (blob name -> served
  // file and size), unless it is there already with that content, and the
  // link of an entry of one file. Returns nullopt when both were there
  // already, else what the entry's index file and link now take on disk and
  // the link's extension (RemoveIndex needs it), for the caller to record.
  struct IndexedFile {
    std::string name;
    std::filesystem::path path;
    uint64_t size = 0;
  };
  struct IndexFootprint {
    uint64_t disk_bytes = 0;
    std::optional<std::string> link_extension;
  };
  absl::StatusOr<std::optional<IndexFootprint>> PublishIndex(absl::string_view ns,
                                                             absl::string_view key,
                                                             const std::vector<IndexedFile>& files);

  // Removes the index entry of (ns, key) and its link (`link_extension`, as
  // PublishIndex returned it): its entry went. A few file system calls,
  // however many entries the store holds.
  void RemoveIndex(absl::string_view ns, absl::string_view key,
                   const std::optional<std::string>& link_extension);

  // A file that could not be removed (one another process holds open, on
  // Windows) and what it takes on disk: no longer counted in bytes(), for the
  // owner to record and remove later (ArtifactStore's leftover_files).
  struct Leftover {
    std::filesystem::path path;
    uint64_t disk_bytes = 0;
  };
  // No longer counts the served files of blob `digest` under each of
  // `extensions` that are there, and appends them to `detached` (the caller
  // removes them).
  void Detach(absl::string_view digest, const std::vector<std::string>& extensions,
              std::vector<Leftover>& detached);
  // Removes the served files of blob `digest` under each of `extensions`;
  // appends those that stay to `leftovers`.
  void Remove(absl::string_view digest, const std::vector<std::string>& extensions,
              std::vector<Leftover>* leftovers = nullptr);

  // Whether a sweep should stop now (kilnd is stopping).
  using StopRequested = absl::FunctionRef<bool()>;
  // Removes served files `is_recorded` does not know of (a kilnd killed between
  // writing one and recording it), index entries naming a file that is gone,
  // dangling links, and temporary files a killed kilnd left. Reads every
  // directory: run after an unclean stop only. Returns false when stopped.
  bool RemoveOrphans(
      absl::FunctionRef<bool(absl::string_view digest, absl::string_view extension)> is_recorded,
      StopRequested stop_requested);

  // What the served files, index entries and links take on disk: the
  // recorded files' bytes the owner counts at start (AddRecordedBytes), then
  // every write and removal, plus the directories (MeasureDirectories). The
  // cache's size cap counts it.
  uint64_t bytes() const {
    return static_cast<uint64_t>(std::max<int64_t>(bytes_.load() + directory_bytes_.load(), 0));
  }
  void AddRecordedBytes(uint64_t bytes) { bytes_ += static_cast<int64_t>(bytes); }
  // What the files and links take, without the directories.
  uint64_t file_bytes() const { return static_cast<uint64_t>(std::max<int64_t>(bytes_.load(), 0)); }
  // Sizes the directories again: a directory grows with the names it holds
  // (some hundred KiB for a few thousand), and never shrinks on ext4.
  void MeasureDirectories();

 private:
  std::filesystem::path PathOf(absl::string_view digest, absl::string_view extension) const;
  // <dir>/<subdir>/<h>/<63 hex><extension>, by the digest of (ns, key).
  std::filesystem::path KeyedPathOf(absl::string_view subdir, absl::string_view ns,
                                    absl::string_view key, absl::string_view extension) const;
  // Removes the file or link at `path`, uncounting what it took; one that
  // stays is appended to `leftovers` when given.
  void RemoveCounted(const std::filesystem::path& path, std::vector<Leftover>* leftovers = nullptr);
  // Points the link of (ns, key) at `file`, unless it does already. Returns
  // whether it made one, and its extension.
  absl::StatusOr<std::optional<std::string>> PublishLink(absl::string_view ns,
                                                         absl::string_view key,
                                                         const IndexedFile& file, bool& changed);
  // Writes `content` to a new temporary file in `dir`, then moves it over `target`.
  absl::StatusOr<platform::Replaced> WriteAndMove(const std::filesystem::path& target,
                                                  absl::string_view content);

  const std::filesystem::path dir_;
  // Served files, by path, that need no hashing while their stamp is unchanged.
  TrustedStamps trusted_;
  // Set once this account turned out unable to make links: not tried again.
  std::atomic<bool> links_unavailable_{false};
  std::atomic<bool> links_moved_{false};  // one link was moved into place: links work here
  std::atomic<int64_t> bytes_{0};            // files and links
  std::atomic<int64_t> directory_bytes_{0};  // as last measured
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_SERVED_FILES_H_
