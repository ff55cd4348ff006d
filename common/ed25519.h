#ifndef KILN_COMMON_ED25519_H_
#define KILN_COMMON_ED25519_H_

// Ed25519 signatures (OpenSSL), for bundles a publisher signs and a kilnd
// trusts by the public keys its configuration names. Keys are PEM files as
// `openssl genpkey -algorithm ed25519 -out key.pem` and
// `openssl pkey -in key.pem -pubout -out key.pub.pem` write them.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

inline constexpr size_t kEd25519SignatureSize = 64;

// A public key and its id: the hex SHA-256 of its 32 raw bytes, which a
// signature names so that the verifier finds its key among those it trusts.
class Ed25519PublicKey {
 public:
  // From a PEM public key (or a private key, whose public half it takes).
  // INVALID_ARGUMENT naming `source` when it is not an Ed25519 key.
  static absl::StatusOr<Ed25519PublicKey> FromPem(absl::string_view pem, absl::string_view source);

  const std::string& id() const { return id_; }
  // Whether `signature` is this key's signature of `message`.
  bool Verifies(absl::string_view message, absl::string_view signature) const;

 private:
  Ed25519PublicKey() = default;
  std::shared_ptr<void> key_;  // EVP_PKEY
  std::string id_;
};

class Ed25519PrivateKey {
 public:
  // From a PEM private key. INVALID_ARGUMENT naming `source` when it is not
  // an unencrypted Ed25519 private key.
  static absl::StatusOr<Ed25519PrivateKey> FromPem(absl::string_view pem, absl::string_view source);

  // The id of its public key (Ed25519PublicKey::id).
  const std::string& id() const { return id_; }
  // The signature of `message` (kEd25519SignatureSize bytes).
  absl::StatusOr<std::string> Sign(absl::string_view message) const;

 private:
  Ed25519PrivateKey() = default;
  std::shared_ptr<void> key_;  // EVP_PKEY
  std::string id_;
};

}  // namespace kiln

#endif  // KILN_COMMON_ED25519_H_
