#include "cache/blob_storage.h"

#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/platform.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;

}  // namespace

BlobStorage::BlobStorage(Options options)
    : options_(std::move(options)), trusted_files_(options_.trust_files_changed_before) {}

absl::Status BlobStorage::Initialize() {
  const fs::path tmp = options_.data_dir / "blobs" / "tmp";
  std::error_code error;
  fs::create_directories(tmp, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot create cache directory %s: %s; choose a writable --data-dir",
        options_.data_dir.string(), error.message()));
  }
  for (const fs::directory_entry& temp : fs::directory_iterator(tmp, error)) {
    // Left by a process killed mid-put; the index never referenced them.
    // Swept before the first put can start one of its own.
    fs::remove(temp.path(), error);
  }
  return absl::OkStatus();
}

absl::StatusOr<PreparedBlob> BlobStorage::Prepare(std::string name, std::string content,
                                                  absl::string_view expected_digest) {
  PreparedBlob blob;
  blob.name = std::move(name);
  blob.digest = DigestBytes(Sha256(content));
  blob.size = content.size();
  if (!expected_digest.empty() && expected_digest != blob.digest) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "blob '%s': data has SHA-256 %s but the request claims %s; the upload was damaged or "
        "the client hashed different bytes",
        blob.name, DigestHex(blob.digest), DigestHex(expected_digest)));
  }
  store_internal::EncodedBlob encoded =
      store_internal::EncodeIfItGains(std::move(content), options_.zstd_level);
  blob.codec = encoded.codec;
  blob.stored = std::move(encoded.stored);
  blob.stored_size = blob.stored.size();
  if (blob.stored_size >= options_.inline_threshold_bytes) {
    blob.location = BlobLocation::kFile;
    blob.temp_path = options_.data_dir / "blobs" / "tmp" /
                     absl::StrCat(DigestHex(blob.digest).substr(0, 16), ".",
                                  temp_file_counter_.fetch_add(1), ".tmp");
    RETURN_IF_ERROR(platform::WriteFileDurably(blob.temp_path, blob.stored));
    blob.stored.clear();
  }
  return blob;
}

void BlobStorage::RemoveTempFiles(const std::vector<PreparedBlob>& prepared) {
  std::error_code ignored;
  for (const PreparedBlob& blob : prepared) {
    if (!blob.temp_path.empty()) fs::remove(blob.temp_path, ignored);
  }
}

absl::Status BlobStorage::Publish(const PreparedBlob& blob) const {
  const fs::path target = PathOf(blob.digest);
  std::error_code error;
  // The directory is counted among what no record holds (StoreAccounting).
  fs::create_directories(target.parent_path(), error);
  // Blob files are named for their content: if a reader holds the target open
  // (Windows refuses to replace it), the file there already has these bytes.
  return platform::PublishContentAddressedFile(blob.temp_path, target);
}

fs::path BlobStorage::PathOf(absl::string_view digest) const {
  const std::string hex = DigestHex(digest);
  return options_.data_dir / "blobs" / hex.substr(0, 2) / hex;
}

absl::StatusOr<std::string> BlobStorage::Read(int64_t codec, BlobLocation location,
                                              absl::string_view inline_data,
                                              absl::string_view digest, uint64_t size,
                                              IntegrityCheck check) {
  std::string stored;
  std::optional<platform::FileStamp> stamp;  // of a blob file read whole between two equal stamps
  if (location == BlobLocation::kFile) {
    const fs::path path = PathOf(digest);
    ASSIGN_OR_RETURN(const platform::FileStamp before, platform::StampOf(path));
    ASSIGN_OR_RETURN(stored, platform::ReadWholeFile(path));
    ASSIGN_OR_RETURN(const platform::FileStamp after, platform::StampOf(path));
    if (after == before) {
      if (check == IntegrityCheck::kTrustUnchangedFiles && trusted_files_.Unchanged(digest, before)) {
        // Unchanged since its content was checked: no need to hash it again.
        return store_internal::Decode(codec, std::move(stored), size);
      }
      stamp = before;
    }
  } else {
    stored.assign(inline_data.data(), inline_data.size());
  }
  ASSIGN_OR_RETURN(std::string content, store_internal::Decode(codec, std::move(stored), size));
  if (content.size() != size || DigestBytes(Sha256(content)) != digest) {
    return absl::DataLossError("content does not match its SHA-256");
  }
  if (stamp.has_value()) trusted_files_.Remember(digest, *stamp);
  return content;
}

}  // namespace kiln::cache
