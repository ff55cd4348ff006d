#ifndef KILN_CACHE_BLOB_STORAGE_H_
#define KILN_CACHE_BLOB_STORAGE_H_

// How the artifact store keeps a blob's bytes and reads them back: hashed,
// compressed where that gains (blob_codec.h), inline in its index row when
// small, else a file named for its content (blobs/<hh>/<64 hex>) written
// durably to blobs/tmp/ before the row that names it commits and moved into
// place after. Every read is checked against the digest, but a blob file
// unchanged since its content last matched it (trusted_stamps.h) is not
// hashed again.
//
// Internal to the artifact store: its rows are the index's; this part knows
// only the bytes and files. Thread-safe.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cache/blob_codec.h"
#include "cache/trusted_stamps.h"

namespace kiln::cache {

// Where a blob's stored bytes are (the blobs.location column).
enum class BlobLocation : int64_t { kInline = 0, kFile = 1 };

// A blob ready to be stored: hashed, encoded, and (a file blob) written to
// its temp file.
struct PreparedBlob {
  std::string name;
  std::string digest;     // raw SHA-256 of the content
  std::string store_key;  // its placeholder, once stored as a row of its own; else empty
  uint64_t size = 0;
  store_internal::Codec codec = store_internal::kRaw;
  std::string stored;  // the bytes as stored; empty for file blobs once written
  uint64_t stored_size = 0;
  BlobLocation location = BlobLocation::kInline;
  std::filesystem::path temp_path;  // file blobs: written durably, renamed into place on publish
};

class BlobStorage {
 public:
  struct Options {
    std::filesystem::path data_dir;
    // Stored sizes from this one on are files; smaller ones stay inline.
    uint64_t inline_threshold_bytes = 0;
    int zstd_level = 1;  // 0 stores blobs uncompressed
    // A file changed this long before it is checked is trusted from then on
    // while its stamp is unchanged (TrustedStamps).
    absl::Duration trust_files_changed_before = absl::Seconds(2);
  };
  explicit BlobStorage(Options options);

  // Makes blobs/tmp/ and empties it of what a killed process left (no row
  // ever names those). FAILED_PRECONDITION when the directory cannot be made.
  absl::Status Initialize();

  // Hashes and encodes `content` (named `name`), writing it to a temp file
  // when it is to be a file. INVALID_ARGUMENT when `expected_digest` (raw;
  // empty: none) is not the content's.
  absl::StatusOr<PreparedBlob> Prepare(std::string name, std::string content,
                                       absl::string_view expected_digest);
  // The temp files of prepared blobs that were not, or could not be, published.
  static void RemoveTempFiles(const std::vector<PreparedBlob>& prepared);
  // Moves a file blob's temp file to its place, once its row is written.
  absl::Status Publish(const PreparedBlob& blob) const;

  // Where the file of the blob with (raw) `digest` is.
  std::filesystem::path PathOf(absl::string_view digest) const;

  // How much a read checks: lookups trust a blob file that is unchanged
  // since its content last matched its digest; verify hashes everything.
  enum class IntegrityCheck { kTrustUnchangedFiles, kHashEverything };
  // The content of a stored blob, from its row's codec and location (and
  // inline bytes). DATA_LOSS when it does not match `digest` and `size`;
  // the file's error when it cannot be read.
  absl::StatusOr<std::string> Read(int64_t codec, BlobLocation location,
                                   absl::string_view inline_data, absl::string_view digest,
                                   uint64_t size, IntegrityCheck check);

 private:
  const Options options_;
  std::atomic<uint64_t> temp_file_counter_{0};
  // Blob files, by digest, that need no hashing while their stamp is unchanged.
  TrustedStamps trusted_files_;
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_BLOB_STORAGE_H_
