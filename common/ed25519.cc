#include "common/ed25519.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "common/sha256.h"

namespace kiln {
namespace {

using PemReader = EVP_PKEY* (*)(BIO*, EVP_PKEY**, pem_password_cb*, void*);

// Never prompts: a passphrase callback that gives none, so an encrypted key
// fails instead of reading a terminal inside kilnd.
int NoPassphrase(char* /*buffer*/, int /*size*/, int /*rwflag*/, void* /*user*/) { return -1; }

std::shared_ptr<void> ReadPem(absl::string_view pem, PemReader reader) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  if (bio == nullptr) return nullptr;
  EVP_PKEY* key = reader(bio.get(), nullptr, NoPassphrase, nullptr);
  ERR_clear_error();  // a failed parse leaves errors for the next OpenSSL call
  if (key == nullptr) return nullptr;
  if (EVP_PKEY_get_id(key) != EVP_PKEY_ED25519) {
    EVP_PKEY_free(key);
    return nullptr;
  }
  return std::shared_ptr<void>(key, [](void* k) { EVP_PKEY_free(static_cast<EVP_PKEY*>(k)); });
}

std::string KeyId(const std::shared_ptr<void>& key) {
  std::array<uint8_t, 32> raw{};
  size_t length = raw.size();
  EVP_PKEY_get_raw_public_key(static_cast<EVP_PKEY*>(key.get()), raw.data(), &length);
  return DigestHex(DigestBytes(
      Sha256(absl::string_view(reinterpret_cast<const char*>(raw.data()), length))));
}

constexpr absl::string_view kMakeOne =
    "make one with `openssl genpkey -algorithm ed25519 -out key.pem`, and its public key with "
    "`openssl pkey -in key.pem -pubout -out key.pub.pem`";

}  // namespace

absl::StatusOr<Ed25519PublicKey> Ed25519PublicKey::FromPem(absl::string_view pem,
                                                           absl::string_view source) {
  std::shared_ptr<void> key = ReadPem(pem, PEM_read_bio_PUBKEY);
  if (key == nullptr) key = ReadPem(pem, PEM_read_bio_PrivateKey);
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is not an Ed25519 public key in PEM form; %s", source, kMakeOne));
  }
  Ed25519PublicKey result;
  result.key_ = std::move(key);
  result.id_ = KeyId(result.key_);
  return result;
}

bool Ed25519PublicKey::Verifies(absl::string_view message, absl::string_view signature) const {
  if (signature.size() != kEd25519SignatureSize) return false;
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(),
                                                                  EVP_MD_CTX_free);
  const bool verified =
      context != nullptr &&
      EVP_DigestVerifyInit(context.get(), nullptr, nullptr, nullptr,
                           static_cast<EVP_PKEY*>(key_.get())) == 1 &&
      EVP_DigestVerify(context.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                       signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                       message.size()) == 1;
  ERR_clear_error();
  return verified;
}

absl::StatusOr<Ed25519PrivateKey> Ed25519PrivateKey::FromPem(absl::string_view pem,
                                                             absl::string_view source) {
  std::shared_ptr<void> key = ReadPem(pem, PEM_read_bio_PrivateKey);
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is not an unencrypted Ed25519 private key in PEM form; %s", source, kMakeOne));
  }
  Ed25519PrivateKey result;
  result.key_ = std::move(key);
  result.id_ = KeyId(result.key_);
  return result;
}

absl::StatusOr<std::string> Ed25519PrivateKey::Sign(absl::string_view message) const {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(),
                                                                  EVP_MD_CTX_free);
  std::string signature(kEd25519SignatureSize, '\0');
  size_t length = signature.size();
  if (context == nullptr ||
      EVP_DigestSignInit(context.get(), nullptr, nullptr, nullptr,
                         static_cast<EVP_PKEY*>(key_.get())) != 1 ||
      EVP_DigestSign(context.get(), reinterpret_cast<unsigned char*>(signature.data()), &length,
                     reinterpret_cast<const unsigned char*>(message.data()),
                     message.size()) != 1 ||
      length != kEd25519SignatureSize) {
    ERR_clear_error();
    return absl::InternalError("OpenSSL could not make an Ed25519 signature");
  }
  return signature;
}

}  // namespace kiln
