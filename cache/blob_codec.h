#ifndef KILN_CACHE_BLOB_CODEC_H_
#define KILN_CACHE_BLOB_CODEC_H_

// How a blob's content is stored (the blobs.codec column): the choice of
// compression and the decoding back to content. Pure functions over bytes;
// internal to the artifact store (artifact_store*.cc, store_*.cc).

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kiln::cache::store_internal {

enum Codec : int64_t { kRaw = 0, kZstd = 1 };

struct EncodedBlob {
  Codec codec = kRaw;
  std::string stored;  // the bytes as stored
};

// `content` compressed with zstd at `zstd_level` when that saves enough to be
// worth a decompress on every read; as it is otherwise, or when `zstd_level` is 0.
EncodedBlob EncodeIfItGains(std::string content, int zstd_level);

// A blob's stored bytes as its content (decompressed when stored with zstd).
// DATA_LOSS when a zstd frame does not decode to `size` bytes.
absl::StatusOr<std::string> Decode(int64_t codec, std::string stored, uint64_t size);

}  // namespace kiln::cache::store_internal

#endif  // KILN_CACHE_BLOB_CODEC_H_
