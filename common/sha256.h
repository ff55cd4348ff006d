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

// SHA-256 of data given a piece at a time (a file streamed through).
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(Sha256Stream&& other) noexcept;
  Sha256Stream& operator=(Sha256Stream&& other) noexcept;
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;

  void Update(absl::string_view data);
  // The digest of everything given so far; the stream starts again empty.
  Sha256Digest Finish();

 private:
  void* context_;  // EVP_MD_CTX
};

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
