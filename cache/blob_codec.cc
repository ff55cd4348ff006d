// The blob codec: zstd when it saves space, and decoding with a size check.

#include "cache/blob_codec.h"

#include <zstd.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln::cache::store_internal {
namespace {

// Compression must save at least this fraction to be worth a decompress on every read.
constexpr double kMinCompressionGain = 0.10;
constexpr size_t kMinCompressibleSize = 256;

}  // namespace

EncodedBlob EncodeIfItGains(std::string content, int zstd_level) {
  const size_t size = content.size();
  if (zstd_level > 0 && size >= kMinCompressibleSize) {
    std::string compressed(ZSTD_compressBound(size), '\0');
    const size_t length = ZSTD_compress(compressed.data(), compressed.size(), content.data(),
                                        content.size(), zstd_level);
    if (!ZSTD_isError(length) &&
        static_cast<double>(length) <= static_cast<double>(size) * (1 - kMinCompressionGain)) {
      compressed.resize(length);
      return {kZstd, std::move(compressed)};
    }
  }
  return {kRaw, std::move(content)};
}

absl::StatusOr<std::string> Decode(int64_t codec, std::string stored, uint64_t size) {
  if (codec != kZstd) return stored;
  std::string content(size, '\0');
  const size_t produced = ZSTD_decompress(content.data(), size, stored.data(), stored.size());
  if (ZSTD_isError(produced) || produced != size) {
    return absl::DataLossError(absl::StrCat("zstd frame does not decode to ", size, " bytes"));
  }
  return content;
}

}  // namespace kiln::cache::store_internal
