#ifndef KILN_COMMON_SHA256_H_
#define KILN_COMMON_SHA256_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace kiln {

inline constexpr size_t kSha256Size = 32;
using Sha256Digest = std::array<uint8_t, kSha256Size>;

// SHA-256 of `data` (OpenSSL; uses the CPU's SHA extensions where present).
Sha256Digest Sha256(absl::string_view data);

// HMAC-SHA256 of `data` under `key`: proves the writer held the key.
Sha256Digest HmacSha256(absl::string_view key, absl::string_view data);

// Whether two digests are equal, in time independent of where they differ.
bool SameDigest(absl::string_view a, absl::string_view b);

// The digest as raw bytes, the form used on the wire and in the database.
std::string DigestBytes(const Sha256Digest& digest);

// Lowercase hex, the form used in file names and logs.
std::string DigestHex(absl::string_view digest_bytes);

}  // namespace kiln

#endif  // KILN_COMMON_SHA256_H_
