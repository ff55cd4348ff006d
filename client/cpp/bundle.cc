#include "bundle.h"

#include <fstream>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/platform.h"
#include "common/sha256.h"

namespace kiln {
namespace {

constexpr absl::string_view kMagic = "KILNBUNDLE 1\n";
constexpr absl::string_view kTrailer = "END ";

void AppendLength(std::string& out, uint32_t length) {
  for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<char>((length >> shift) & 0xff));
}

uint32_t ReadLength(absl::string_view in) {
  uint32_t length = 0;
  for (int i = 3; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(in[static_cast<size_t>(i)]);
  return length;
}

}  // namespace

void BundleWriter::Add(const v1::BundleEntry& entry) {
  const std::string record = entry.SerializeAsString();
  AppendLength(content_, static_cast<uint32_t>(record.size()));
  content_ += record;
  ++entries_;
}

absl::Status BundleWriter::Finish(const std::filesystem::path& path) {
  const std::string digest = DigestBytes(Sha256(content_));
  const std::filesystem::path temp = path.string() + ".partial";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << content_ << kTrailer << digest;
    if (!out.flush()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cannot write %s; check the directory and free space", temp.string()));
    }
  }
  std::error_code error;
  std::filesystem::rename(temp, path, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot move %s to %s: %s", temp.string(), path.string(), error.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::BundleEntry>> ReadBundle(const std::filesystem::path& path) {
  absl::StatusOr<std::string> content = platform::ReadWholeFile(path);
  if (!content.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", path.string()));
  }
  const auto damaged = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is damaged (%s): nothing was imported; copy or export it again", path.string(), what));
  };
  if (!absl::StartsWith(*content, kMagic)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is not a Kiln bundle (make one with `kiln export`)", path.string()));
  }
  const size_t trailer_size = kTrailer.size() + kSha256Size;
  if (content->size() < kMagic.size() + trailer_size ||
      absl::string_view(*content).substr(content->size() - trailer_size, kTrailer.size()) != kTrailer) {
    return damaged("it ends early");
  }
  const absl::string_view body = absl::string_view(*content).substr(0, content->size() - trailer_size);
  if (DigestBytes(Sha256(body)) != content->substr(content->size() - kSha256Size)) {
    return damaged("its checksum does not match");
  }
  std::vector<v1::BundleEntry> entries;
  for (absl::string_view rest = body.substr(kMagic.size()); !rest.empty();) {
    if (rest.size() < 4 || rest.size() - 4 < ReadLength(rest)) return damaged("an entry ends early");
    v1::BundleEntry entry;
    if (!entry.ParseFromArray(rest.data() + 4, static_cast<int>(ReadLength(rest)))) {
      return damaged("an entry does not parse");
    }
    rest.remove_prefix(4 + ReadLength(rest));
    for (const v1::Blob& blob : entry.blobs()) {
      if (blob.sha256() != DigestBytes(Sha256(blob.data())) || blob.size() != blob.data().size()) {
        return damaged(absl::StrCat("blob ", blob.name(), " of ", entry.namespace_(), "/",
                                    entry.key(), " does not match its SHA-256"));
      }
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

}  // namespace kiln
