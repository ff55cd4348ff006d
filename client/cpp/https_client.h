#ifndef KILN_CLIENT_HTTPS_CLIENT_H_
#define KILN_CLIENT_HTTPS_CLIENT_H_

// HTTPS requests, HTTP/1.1 over OpenSSL, a connection per request: what
// `kiln push` and `kiln pull` need to speak an OCI registry's distribution API,
// on Linux and Windows alike (OpenSSL's connect BIO holds the sockets), with no
// dependency beyond the OpenSSL that kiln links already. Servers are verified
// against OpenSSL's default CA locations, which SSL_CERT_FILE and SSL_CERT_DIR
// name; there is no plain HTTP.

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
// DEADLINE_EXCEEDED when it stops answering for `idle_timeout`.
absl::StatusOr<HttpsResponse> SendHttps(
    const HttpsRequest& request, std::chrono::seconds idle_timeout = std::chrono::seconds(60));

// `url` parsed: ("HOST", "PORT", "/PATH?QUERY"); INVALID_ARGUMENT unless https.
struct HttpsUrl {
  std::string host;
  std::string port;
  std::string target;
};
absl::StatusOr<HttpsUrl> ParseHttpsUrl(absl::string_view url);

}  // namespace kiln

#endif  // KILN_CLIENT_HTTPS_CLIENT_H_
