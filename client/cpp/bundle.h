#ifndef KILN_CLIENT_BUNDLE_H_
#define KILN_CLIENT_BUNDLE_H_

// Bundle files of cache entries (`kiln export`, `kiln import`): a cache to
// ship, e.g. in a Docker image or beside a ComfyUI node pack.
//
//   "KILNBUNDLE 1\n" (unsigned) or "KILNBUNDLE 2\n" (signed)
//   ( u32 little-endian length, kiln.v1.BundleEntry ) *
//   "END " SHA-256 of every byte before it
//   version 2: "SIG " key id (the SHA-256 of the signer's raw Ed25519 public
//              key) and the Ed25519 signature of BundleSignedMessage(that SHA-256)
//
// Each blob carries its SHA-256 too. Bundles are written and read a record
// at a time: memory holds one entry (at most kMaxBundleEntryBytes), whatever
// the bundle's size.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/ed25519.h"
#include "common/sha256.h"
#include "kiln/v1/kiln.pb.h"

namespace kiln {

// An entry's record takes at most this: the largest cubins are a few MiB.
inline constexpr uint32_t kMaxBundleEntryBytes = 32u << 20;

// What a bundle's signature signs: its SHA-256 (raw), under a fixed prefix
// so that no other message of the key's reads as a bundle's.
std::string BundleSignedMessage(absl::string_view digest);

class BundleWriter {
 public:
  // Writes to `path`.partial until Finish moves it to `path`; signed by
  // `signer` when given (which must outlive the writer).
  static absl::StatusOr<BundleWriter> Create(const std::filesystem::path& path,
                                             const Ed25519PrivateKey* signer = nullptr);
  // The moved-from writer no longer owns the partial file (its destructor
  // would remove it).
  BundleWriter(BundleWriter&& other) noexcept;
  BundleWriter& operator=(BundleWriter&&) = delete;
  ~BundleWriter();

  // INVALID_ARGUMENT for an entry over kMaxBundleEntryBytes (nothing written).
  absl::Status Add(const v1::BundleEntry& entry);
  size_t entries() const { return entries_; }
  absl::Status Finish();

 private:
  BundleWriter() = default;
  void Write(absl::string_view bytes);

  std::filesystem::path path_;
  std::filesystem::path partial_;
  std::ofstream out_;
  Sha256Stream digest_;
  const Ed25519PrivateKey* signer_ = nullptr;
  size_t entries_ = 0;
  bool finished_ = false;
};

struct BundleSignature {
  std::string key_id;     // hex, as Ed25519PublicKey::id
  std::string signature;  // raw, kEd25519SignatureSize bytes
};

class BundleReader {
 public:
  // INVALID_ARGUMENT when `path` cannot be read or is not a bundle.
  static absl::StatusOr<BundleReader> Open(const std::filesystem::path& path);
  BundleReader(BundleReader&&) = default;

  // The next entry, every blob's digest checked; nullopt at the end, once
  // the bundle's checksum (and signature record) are read and match.
  // INVALID_ARGUMENT naming what is damaged otherwise.
  absl::StatusOr<std::optional<v1::BundleEntry>> Next();

  // Once Next returned nullopt: the bundle's SHA-256 (raw) and its signature
  // (unchecked: whoever trusts keys checks it), if signed.
  const std::string& digest() const { return digest_bytes_; }
  const std::optional<BundleSignature>& signature() const { return signature_; }
  uint64_t size() const { return size_; }

 private:
  BundleReader() = default;
  absl::Status Damaged(absl::string_view what) const;
  absl::StatusOr<std::string> Read(uint64_t count);

  std::filesystem::path path_;
  std::ifstream in_;
  uint64_t size_ = 0;
  uint64_t position_ = 0;
  uint64_t body_end_ = 0;  // where the "END " record starts
  bool signed_ = false;
  Sha256Stream running_;
  std::string digest_bytes_;
  std::optional<BundleSignature> signature_;
};

// Reads the bundle at `path` a record at a time, every digest checked,
// giving each entry to `use` (whose error stops the read). Returns the reader
// once the end is read: the bundle's digest and signature.
absl::StatusOr<BundleReader> ForEachBundleEntry(
    const std::filesystem::path& path, absl::FunctionRef<absl::Status(v1::BundleEntry&&)> use);

}  // namespace kiln

#endif  // KILN_CLIENT_BUNDLE_H_
