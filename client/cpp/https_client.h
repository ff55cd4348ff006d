#ifndef KILN_CLIENT_HTTPS_CLIENT_H_
#define KILN_CLIENT_HTTPS_CLIENT_H_

// HTTPS requests through libcurl: what `kiln push`, `kiln pull` and kilnd's
// subscriptions need to speak an OCI registry's distribution API. On Linux
// libcurl uses OpenSSL and the system's CA bundle; on Windows it uses
// Schannel and the Windows certificate store. SSL_CERT_FILE (and on Linux
// SSL_CERT_DIR; Windows refuses it), where set, name the CAs instead. There
// is no plain HTTP, and redirects are the caller's: a registry's credentials
// must not follow a redirect to the blob storage it names.
//
// A response is checked beyond what libcurl checks, since registries are
// servers Kiln does not control: at most 256 header (or trailer) lines of at
// most 64 KiB in all, and no line holding a bare CR or LF.

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

struct HttpsRequest {
  std::string method = "GET";
  std::string url;  // https://HOST[:PORT]/PATH[?QUERY]
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::filesystem::path body_file;  // sent instead of `body` when set
  // Receives a successful (2xx) response's body as it comes, instead of
  // HttpsResponse::body; an error stops the request.
  std::function<absl::Status(absl::string_view)> on_body;
  // Asked about once a second, and as data comes: true ends the request
  // (CANCELLED), so a stopping kilnd does not wait out a slow registry.
  std::function<bool()> cancelled;
};

struct HttpsResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;                            // at most 1 MiB unless streamed
  std::string Header(const std::string& lower_case_name) const {
    auto found = headers.find(lower_case_name);
    return found == headers.end() ? "" : found->second;
  }
};

// UNAVAILABLE when the server cannot be reached or verified (naming why),
// DEADLINE_EXCEEDED when it stops answering for `idle_timeout`, DATA_LOSS
// when its response breaks the rules above or HTTP's framing,
// INVALID_ARGUMENT for a URL that is not https:// or a request whose URL or
// headers hold a CR, LF or NUL (never sent), CANCELLED when `cancelled` said so.
absl::StatusOr<HttpsResponse> SendHttps(
    const HttpsRequest& request, std::chrono::seconds idle_timeout = std::chrono::seconds(60));

}  // namespace kiln

#endif  // KILN_CLIENT_HTTPS_CLIENT_H_
