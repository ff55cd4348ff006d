#ifndef KILN_SERVICE_CLIENT_IDENTITY_H_
#define KILN_SERVICE_CLIENT_IDENTITY_H_

// Who a client of the TLS listener is: the tenant its certificate (common
// name, signed by tls_client_ca) or its bearer token (client_tokens) names.
// A tenant is a trust domain: it sees what it stored itself, and what kilnd
// compiled from inputs it derived keys from, never another tenant's puts.

#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/platform.h"

namespace kiln::service {

// 1..64 characters of [A-Za-z0-9._-]: a tenant's name as it appears in
// certificates, the token file and store namespaces.
bool IsValidTenantName(absl::string_view name);

// The client_tokens file: "TENANT SHA256-HEX" lines (# comments), the digest
// of a token the tenant's clients send. Only digests are kept, so the file
// grants nothing to whoever reads it. Rereads the file when it changed (looked
// at no more than once a second), so a token is revoked by deleting its line.
class ClientTokens {
 public:
  // INVALID_ARGUMENT names the file and line of a malformed entry.
  static absl::StatusOr<std::unique_ptr<ClientTokens>> Load(std::filesystem::path path);

  // The tenant whose token this is; UNAUTHENTICATED otherwise.
  absl::StatusOr<std::string> TenantOf(absl::string_view token);

 private:
  explicit ClientTokens(std::filesystem::path path) : path_(std::move(path)) {}
  // Rereads the file if its stamp changed; a malformed new version is logged
  // and the last good one kept, so a typo does not lock every client out.
  void RefreshLocked();

  const std::filesystem::path path_;
  std::mutex mutex_;
  std::map<std::string, std::string> tenant_of_digest_;  // hex SHA-256 -> tenant
  std::optional<platform::FileStamp> stamp_;
  absl::Time checked_ = absl::InfinitePast();
};

// Parses the text of a client_tokens file; `origin` names it in errors.
absl::StatusOr<std::map<std::string, std::string>> ParseClientTokens(absl::string_view text,
                                                                     absl::string_view origin);

}  // namespace kiln::service

#endif  // KILN_SERVICE_CLIENT_IDENTITY_H_
