#include "https_client.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <fstream>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/platform.h"
#include "common/status_macros.h"

namespace kiln {
namespace {

constexpr size_t kKeptBodyBytes = 1 << 20;
constexpr size_t kMaxHeaderBytes = 64 << 10;
// A response's header lines (or its trailer's): registries send a dozen.
constexpr int kMaxHeaderLines = 256;
constexpr size_t kChunkBytes = 1 << 20;


std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "connection closed";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

// One request's connection: reads buffered, so headers and chunk sizes can
// be read a line at a time.
class Connection {
 public:
  Connection(std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> context, BIO* bio)
      : context_(std::move(context)), bio_(bio, BIO_free_all) {}

  absl::Status Write(absl::string_view data) {
    while (!data.empty()) {
      const int written = BIO_write(bio_.get(), data.data(), static_cast<int>(data.size()));
      if (written <= 0) return absl::UnavailableError(absl::StrCat("sending: ", OpenSslError()));
      data.remove_prefix(static_cast<size_t>(written));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> ReadLine() {
    while (true) {
      const size_t end = buffer_.find("\r\n");
      if (end != std::string::npos) {
        std::string line = buffer_.substr(0, end);
        buffer_.erase(0, end + 2);
        return line;
      }
      if (buffer_.size() > kMaxHeaderBytes) {
        return absl::DataLossError("the server sent a line longer than 64 KiB");
      }
      ASSIGN_OR_RETURN(bool more, Fill());
      if (!more) return absl::UnavailableError("the server closed the connection mid-response");
    }
  }

  // Up to `count` bytes (fewer at the end of the stream; none: it ended).
  absl::StatusOr<std::string> Read(size_t count) {
    if (buffer_.empty()) {
      ASSIGN_OR_RETURN(bool more, Fill());
      if (!more) return std::string();
    }
    const size_t taken = std::min(count, buffer_.size());
    std::string data = buffer_.substr(0, taken);
    buffer_.erase(0, taken);
    return data;
  }

 private:
  absl::StatusOr<bool> Fill() {
    char chunk[64 << 10];
    const int read = BIO_read(bio_.get(), chunk, sizeof(chunk));
    if (read > 0) {
      buffer_.append(chunk, static_cast<size_t>(read));
      return true;
    }
    if (BIO_should_retry(bio_.get())) {
      return absl::DeadlineExceededError("the server stopped answering");
    }
    ERR_clear_error();
    return false;  // closed
  }

  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> context_;
  std::unique_ptr<BIO, decltype(&BIO_free_all)> bio_;
  std::string buffer_;
};

absl::StatusOr<std::unique_ptr<Connection>> Connect(const HttpsUrl& url,
                                                    std::chrono::seconds idle_timeout) {
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> context(SSL_CTX_new(TLS_client_method()),
                                                            SSL_CTX_free);
  if (context == nullptr) return absl::InternalError("OpenSSL: " + OpenSslError());
  SSL_CTX_set_min_proto_version(context.get(), TLS1_2_VERSION);
  SSL_CTX_set_verify(context.get(), SSL_VERIFY_PEER, nullptr);
  SSL_CTX_set_default_verify_paths(context.get());
  BIO* bio = BIO_new_ssl_connect(context.get());
  if (bio == nullptr) return absl::InternalError("OpenSSL: " + OpenSslError());
  auto connection = std::make_unique<Connection>(std::move(context), bio);
  SSL* ssl = nullptr;
  BIO_get_ssl(bio, &ssl);
  SSL_set_mode(ssl, SSL_MODE_AUTO_RETRY);
  const std::string where = absl::StrContains(url.host, ':')
                                ? absl::StrCat("[", url.host, "]:", url.port)  // IPv6
                                : absl::StrCat(url.host, ":", url.port);
  BIO_set_conn_hostname(bio, where.c_str());
  // The name the certificate must carry: a DNS name, or an IP address.
  X509_VERIFY_PARAM* verify = SSL_get0_param(ssl);
  if (X509_VERIFY_PARAM_set1_ip_asc(verify, url.host.c_str()) != 1) {
    ERR_clear_error();
    SSL_set_tlsext_host_name(ssl, url.host.c_str());
    SSL_set1_host(ssl, url.host.c_str());
  }
  if (BIO_do_connect(bio) <= 0) {
    const long verdict = SSL_get_verify_result(ssl);
    if (verdict != X509_V_OK) {
      return absl::UnavailableError(absl::StrFormat(
          "%s's certificate is not trusted (%s); name its CA in SSL_CERT_FILE", where,
          X509_verify_cert_error_string(verdict)));
    }
    return absl::UnavailableError(
        absl::StrFormat("cannot connect to %s: %s", where, OpenSslError()));
  }
  int socket = -1;
  BIO_get_fd(bio, &socket);
  if (socket >= 0) {
    platform::SetSocketIoTimeout(socket, absl::FromChrono(idle_timeout)).IgnoreError();
  }
  return connection;
}

// A header (or trailer) section's lines into `headers` (names in lower case;
// none kept when null). A section over kMaxHeaderBytes or kMaxHeaderLines, or
// a line holding a bare CR or LF (which another parser would take for a line
// of its own: a Location smuggling a header), is refused.
absl::Status ReadHeaderLines(Connection& connection, std::map<std::string, std::string>* headers) {
  size_t bytes = 0;
  for (int lines = 0;; ++lines) {
    ASSIGN_OR_RETURN(std::string line, connection.ReadLine());
    if (line.empty()) return absl::OkStatus();
    bytes += line.size() + 2;
    if (lines >= kMaxHeaderLines || bytes > kMaxHeaderBytes) {
      return absl::DataLossError(absl::StrFormat(
          "the server sent more than %d header lines or %d KiB of them", kMaxHeaderLines, kMaxHeaderBytes >> 10));
    }
    if (line.find_first_of("\r\n") != std::string::npos) {
      return absl::DataLossError("the server sent a header line holding a bare CR or LF");
    }
    const size_t colon = line.find(':');
    if (colon == std::string::npos || headers == nullptr) continue;
    (*headers)[absl::AsciiStrToLower(line.substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
}

absl::Status ReadBody(Connection& connection, const HttpsResponse& response,
                      const std::function<absl::Status(absl::string_view)>& use) {
  if (absl::AsciiStrToLower(response.Header("transfer-encoding")) == "chunked") {
    while (true) {
      ASSIGN_OR_RETURN(std::string size_line, connection.ReadLine());
      uint64_t size = 0;
      const std::string hex(absl::StripAsciiWhitespace(size_line.substr(0, size_line.find(';'))));
      if (!absl::SimpleHexAtoi(hex, &size)) {
        return absl::DataLossError("the server sent a malformed chunk size");
      }
      if (size == 0) break;
      while (size > 0) {
        ASSIGN_OR_RETURN(std::string data, connection.Read(std::min<uint64_t>(size, kChunkBytes)));
        if (data.empty()) return absl::UnavailableError("the server closed the connection mid-body");
        size -= data.size();
        RETURN_IF_ERROR(use(data));
      }
      ASSIGN_OR_RETURN(std::string end_of_chunk, connection.ReadLine());
      if (!end_of_chunk.empty()) {
        return absl::DataLossError("the server sent a chunk that does not end where its size says");
      }
    }
    return ReadHeaderLines(connection, nullptr);  // trailers
  }
  const std::string length_text = response.Header("content-length");
  uint64_t length = 0;
  const bool has_length = absl::SimpleAtoi(length_text, &length);
  while (!has_length || length > 0) {
    ASSIGN_OR_RETURN(std::string data,
                     connection.Read(has_length ? std::min<uint64_t>(length, kChunkBytes) : kChunkBytes));
    if (data.empty()) {
      if (has_length) return absl::UnavailableError("the server closed the connection mid-body");
      break;
    }
    if (has_length) length -= data.size();
    RETURN_IF_ERROR(use(data));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HttpsUrl> ParseHttpsUrl(absl::string_view url) {
  if (!absl::ConsumePrefix(&url, "https://")) {
    return absl::InvalidArgumentError(absl::StrCat(url, ": only https:// URLs are fetched"));
  }
  HttpsUrl parsed;
  const size_t slash = url.find('/');
  const absl::string_view authority = url.substr(0, slash);
  parsed.target = slash == absl::string_view::npos ? "/" : std::string(url.substr(slash));
  const std::optional<platform::HostPort> split = platform::SplitHostPort(authority);
  if (split.has_value()) {
    parsed.host = split->host;
    parsed.port = absl::StrCat(split->port);
  } else {
    parsed.host = std::string(authority);
    parsed.port = "443";
  }
  if (parsed.host.empty()) return absl::InvalidArgumentError(absl::StrCat(url, ": no host"));
  return parsed;
}

absl::StatusOr<HttpsResponse> SendHttps(const HttpsRequest& request,
                                        std::chrono::seconds idle_timeout) {
  ASSIGN_OR_RETURN(HttpsUrl url, ParseHttpsUrl(request.url));
  // What is written goes out as it is: a CR, LF or NUL in it (a Location, a
  // token from elsewhere) would end a line early and add one of its own.
  const auto breaks_lines = [](absl::string_view text) {
    return text.find_first_of(absl::string_view("\r\n\0", 3)) != absl::string_view::npos;
  };
  bool clean = !breaks_lines(request.method) && !breaks_lines(request.url);
  for (const auto& [name, value] : request.headers) clean = clean && !breaks_lines(name) && !breaks_lines(value);
  if (!clean) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a request to %s:%s would hold a CR, LF or NUL in its URL or a header; not sent", url.host, url.port));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Connection> connection, Connect(url, idle_timeout));
  uint64_t body_size = request.body.size();
  std::ifstream body_file;
  if (!request.body_file.empty()) {
    std::error_code error;
    body_size = std::filesystem::file_size(request.body_file, error);
    body_file.open(request.body_file, std::ios::binary);
    if (error || !body_file) {
      return absl::InvalidArgumentError(absl::StrCat("cannot read ", request.body_file.string()));
    }
  }
  std::string head = absl::StrFormat("%s %s HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n",
                                     request.method, url.target, url.host, url.port);
  for (const auto& [name, value] : request.headers) absl::StrAppend(&head, name, ": ", value, "\r\n");
  if (body_size > 0 || request.method == "PUT" || request.method == "POST") {
    absl::StrAppend(&head, "Content-Length: ", body_size, "\r\n");
  }
  absl::StrAppend(&head, "\r\n");
  RETURN_IF_ERROR(connection->Write(head));
  if (!request.body_file.empty()) {
    std::string chunk(kChunkBytes, '\0');
    while (body_file) {
      body_file.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      RETURN_IF_ERROR(connection->Write(absl::string_view(chunk.data(), static_cast<size_t>(body_file.gcount()))));
    }
  } else {
    RETURN_IF_ERROR(connection->Write(request.body));
  }

  HttpsResponse response;
  ASSIGN_OR_RETURN(std::string status_line, connection->ReadLine());
  std::vector<absl::string_view> parts = absl::StrSplit(status_line, absl::MaxSplits(' ', 2));
  if (parts.size() < 2 || !absl::StartsWith(parts[0], "HTTP/1.") ||
      !absl::SimpleAtoi(parts[1], &response.status)) {
    return absl::DataLossError(absl::StrCat("not an HTTP response: ", status_line.substr(0, 80)));
  }
  RETURN_IF_ERROR(ReadHeaderLines(*connection, &response.headers));
  if (request.method == "HEAD" || response.status == 204 || response.status == 304) return response;
  const bool streamed = request.on_body && response.status / 100 == 2;
  RETURN_IF_ERROR(ReadBody(*connection, response, [&](absl::string_view data) -> absl::Status {
    if (streamed) return request.on_body(data);
    if (response.body.size() < kKeptBodyBytes) {
      absl::StrAppend(&response.body, data.substr(0, kKeptBodyBytes - response.body.size()));
    }
    return absl::OkStatus();
  }));
  return response;
}

}  // namespace kiln
