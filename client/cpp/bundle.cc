#include "bundle.h"

#include <algorithm>
#include <system_error>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/byte_size.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kUnsignedMagic = "KILNBUNDLE 1\n";
constexpr absl::string_view kSignedMagic = "KILNBUNDLE 2\n";
constexpr absl::string_view kEnd = "END ";
constexpr absl::string_view kSignatureTag = "SIG ";
constexpr uint64_t kEndSize = kEnd.size() + kSha256Size;
constexpr uint64_t kSignatureSize = kSignatureTag.size() + kSha256Size + kEd25519SignatureSize;

std::string Length(uint32_t length) {
  std::string out;
  for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<char>((length >> shift) & 0xff));
  return out;
}

uint32_t ReadLength(absl::string_view in) {
  uint32_t length = 0;
  for (int i = 3; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(in[static_cast<size_t>(i)]);
  return length;
}

}  // namespace

std::string BundleSignedMessage(absl::string_view digest) {
  return absl::StrCat("kiln bundle signature\n", digest);
}

absl::StatusOr<BundleWriter> BundleWriter::Create(const fs::path& path,
                                                  const Ed25519PrivateKey* signer) {
  BundleWriter writer;
  writer.path_ = path;
  writer.partial_ = path.string() + ".partial";
  writer.signer_ = signer;
  writer.out_.open(writer.partial_, std::ios::binary | std::ios::trunc);
  if (!writer.out_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot write %s; check that its directory exists and is writable", writer.partial_.string()));
  }
  writer.Write(signer != nullptr ? kSignedMagic : kUnsignedMagic);
  return writer;
}

BundleWriter::BundleWriter(BundleWriter&& other) noexcept
    : path_(std::move(other.path_)),
      partial_(std::exchange(other.partial_, fs::path())),
      out_(std::move(other.out_)),
      digest_(std::move(other.digest_)),
      signer_(other.signer_),
      entries_(other.entries_),
      finished_(other.finished_) {}

BundleWriter::~BundleWriter() {
  if (finished_ || partial_.empty()) return;
  out_.close();
  std::error_code error;
  fs::remove(partial_, error);  // never left half written
}

void BundleWriter::Write(absl::string_view bytes) {
  digest_.Update(bytes);
  out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

absl::Status BundleWriter::Add(const v1::BundleEntry& entry) {
  const size_t size = entry.ByteSizeLong();
  if (size > kMaxBundleEntryBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s/%s takes %s, over a bundle entry's limit of %s", entry.namespace_(), entry.key(),
        FormatByteSize(size), FormatByteSize(kMaxBundleEntryBytes)));
  }
  Write(Length(static_cast<uint32_t>(size)));
  Write(entry.SerializeAsString());
  ++entries_;
  return absl::OkStatus();
}

absl::Status BundleWriter::Finish() {
  const std::string digest = DigestBytes(digest_.Finish());
  out_ << kEnd << digest;
  if (signer_ != nullptr) {
    absl::StatusOr<std::string> signature = signer_->Sign(BundleSignedMessage(digest));
    if (!signature.ok()) return signature.status();
    out_ << kSignatureTag << absl::HexStringToBytes(signer_->id()) << *signature;
  }
  out_.close();
  if (!out_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot write %s; check free space", partial_.string()));
  }
  std::error_code error;
  fs::rename(partial_, path_, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot move %s to %s: %s", partial_.string(), path_.string(), error.message()));
  }
  finished_ = true;
  return absl::OkStatus();
}

absl::StatusOr<BundleReader> BundleReader::Open(const fs::path& path) {
  BundleReader reader;
  reader.path_ = path;
  std::error_code error;
  reader.size_ = fs::file_size(path, error);
  reader.in_.open(path, std::ios::binary);
  if (error || !reader.in_) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path.string()));
  absl::StatusOr<std::string> magic = reader.Read(std::min<uint64_t>(reader.size_, kSignedMagic.size()));
  if (!magic.ok() || (*magic != kUnsignedMagic && *magic != kSignedMagic)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is not a Kiln bundle (make one with `kiln export`)", path.string()));
  }
  reader.signed_ = *magic == kSignedMagic;
  reader.running_.Update(*magic);
  const uint64_t trailer = kEndSize + (reader.signed_ ? kSignatureSize : 0);
  if (reader.size_ < magic->size() + trailer) return reader.Damaged("it ends early");
  reader.body_end_ = reader.size_ - trailer;
  return reader;
}

absl::Status BundleReader::Damaged(absl::string_view what) const {
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s is damaged (%s); copy or export it again", path_.string(), what));
}

absl::StatusOr<std::string> BundleReader::Read(uint64_t count) {
  std::string bytes(count, '\0');
  in_.read(bytes.data(), static_cast<std::streamsize>(count));
  if (static_cast<uint64_t>(in_.gcount()) != count) return Damaged("it ends early");
  position_ += count;
  return bytes;
}

absl::StatusOr<std::optional<v1::BundleEntry>> BundleReader::Next() {
  if (position_ < body_end_) {
    if (body_end_ - position_ < 4) return Damaged("an entry ends early");
    absl::StatusOr<std::string> length_bytes = Read(4);
    if (!length_bytes.ok()) return length_bytes.status();
    const uint32_t length = ReadLength(*length_bytes);
    if (length > body_end_ - position_) return Damaged("an entry ends early");
    if (length > kMaxBundleEntryBytes) {
      return Damaged(absl::StrFormat("an entry of %d bytes, over the limit of %d", length,
                                     kMaxBundleEntryBytes));
    }
    absl::StatusOr<std::string> record = Read(length);
    if (!record.ok()) return record.status();
    running_.Update(*length_bytes);
    running_.Update(*record);
    v1::BundleEntry entry;
    if (!entry.ParseFromString(*record)) return Damaged("an entry does not parse");
    for (const v1::Blob& blob : entry.blobs()) {
      if (blob.sha256() != DigestBytes(Sha256(blob.data())) || blob.size() != blob.data().size()) {
        return Damaged(absl::StrCat("blob ", blob.name(), " of ", entry.namespace_(), "/",
                                    entry.key(), " does not match its SHA-256"));
      }
    }
    return entry;
  }
  if (!digest_bytes_.empty()) return std::nullopt;
  absl::StatusOr<std::string> end = Read(kEndSize);
  if (!end.ok()) return end.status();
  const std::string digest = DigestBytes(running_.Finish());
  if (absl::string_view(*end).substr(0, kEnd.size()) != kEnd ||
      !SameDigest(absl::string_view(*end).substr(kEnd.size()), digest)) {
    return Damaged("its checksum does not match");
  }
  if (signed_) {
    absl::StatusOr<std::string> record = Read(kSignatureSize);
    if (!record.ok()) return record.status();
    if (absl::string_view(*record).substr(0, kSignatureTag.size()) != kSignatureTag) {
      return Damaged("its signature record is not one");
    }
    signature_ = BundleSignature{
        absl::BytesToHexString(absl::string_view(*record).substr(kSignatureTag.size(), kSha256Size)),
        record->substr(kSignatureTag.size() + kSha256Size)};
  }
  digest_bytes_ = digest;
  return std::nullopt;
}

absl::StatusOr<BundleReader> ForEachBundleEntry(
    const std::filesystem::path& path, absl::FunctionRef<absl::Status(v1::BundleEntry&&)> use) {
  absl::StatusOr<BundleReader> reader = BundleReader::Open(path);
  if (!reader.ok()) return reader.status();
  while (true) {
    absl::StatusOr<std::optional<v1::BundleEntry>> entry = reader->Next();
    if (!entry.ok()) return entry.status();
    if (!entry->has_value()) return reader;
    if (absl::Status used = use(**std::move(entry)); !used.ok()) return used;
  }
}

}  // namespace kiln
