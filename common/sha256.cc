#include "common/sha256.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <utility>

#include "absl/strings/escaping.h"

namespace kiln {

Sha256Digest Sha256(absl::string_view data) {
  Sha256Digest digest{};
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest.data(), &length, EVP_sha256(), nullptr);
  return digest;
}

Sha256Stream::Sha256Stream() : context_(EVP_MD_CTX_new()) {
  EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(context_), EVP_sha256(), nullptr);
}

Sha256Stream::~Sha256Stream() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(context_)); }

Sha256Stream::Sha256Stream(Sha256Stream&& other) noexcept : context_(other.context_) {
  other.context_ = nullptr;
}

Sha256Stream& Sha256Stream::operator=(Sha256Stream&& other) noexcept {
  std::swap(context_, other.context_);
  return *this;
}

void Sha256Stream::Update(absl::string_view data) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(context_), data.data(), data.size());
}

Sha256Digest Sha256Stream::Finish() {
  Sha256Digest digest{};
  unsigned int length = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(context_), digest.data(), &length);
  EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(context_), EVP_sha256(), nullptr);
  return digest;
}

Sha256Digest HmacSha256(absl::string_view key, absl::string_view data) {
  Sha256Digest digest{};
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest.data(), &length);
  return digest;
}

bool SameDigest(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string DigestBytes(const Sha256Digest& digest) {
  return std::string(reinterpret_cast<const char*>(digest.data()), digest.size());
}

std::string DigestHex(absl::string_view digest_bytes) {
  return absl::BytesToHexString(digest_bytes);
}

}  // namespace kiln
