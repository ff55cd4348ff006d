#include "https_client.h"

#include <curl/curl.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kiln {
namespace {

constexpr size_t kKeptBodyBytes = 1 << 20;
// A response's header section (or its trailer's): registries send a dozen
// lines, a few KiB.
constexpr int kMaxHeaderLines = 256;
constexpr size_t kMaxHeaderBytes = 64 << 10;

// One request's state, which libcurl's callbacks fill. A callback that finds
// the response breaking a rule keeps why in `refusal` and stops the transfer.
struct Exchange {
  const HttpsRequest* request = nullptr;
  HttpsResponse response;
  int section_lines = 0;
  size_t section_bytes = 0;
  std::optional<absl::Status> refusal;
  std::ifstream body_file;
  absl::string_view body_left;  // of request->body, when no file is sent
};

int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto& exchange = *static_cast<Exchange*>(user);
  return exchange.request->cancelled() ? 1 : 0;
}

size_t OnHeaderLine(char* data, size_t size, size_t count, void* user) {
  auto& exchange = *static_cast<Exchange*>(user);
  const absl::string_view line(data, size * count);
  const auto refuse = [&](std::string why) {
    exchange.refusal = absl::DataLossError(std::move(why));
    return size_t{0};
  };
  // libcurl splits lines at LF alone, so a line must end in CRLF and hold no
  // other CR or LF: another parser would see a line of its own there (a
  // Location smuggling a header).
  absl::string_view text = line;
  if (!absl::ConsumeSuffix(&text, "\r\n") || text.find_first_of("\r\n") != absl::string_view::npos) {
    return refuse("the server sent a header line holding a bare CR or LF");
  }
  if (text.empty()) {  // the end of a section: the headers', an interim response's or the trailer's
    exchange.section_lines = 0;
    exchange.section_bytes = 0;
    return line.size();
  }
  exchange.section_bytes += line.size();
  if (++exchange.section_lines > kMaxHeaderLines || exchange.section_bytes > kMaxHeaderBytes) {
    return refuse(absl::StrFormat("the server sent more than %d header lines or %d KiB of them",
                                  kMaxHeaderLines, kMaxHeaderBytes >> 10));
  }
  if (absl::StartsWith(text, "HTTP/")) {  // a status line: what came before was an interim response
    exchange.response.headers.clear();
    // OnBody needs the code before libcurl's CURLINFO_RESPONSE_CODE is final.
    const std::vector<absl::string_view> parts = absl::StrSplit(text, absl::MaxSplits(' ', 2));
    if (parts.size() < 2 || !absl::SimpleAtoi(parts[1], &exchange.response.status)) {
      return refuse(absl::StrCat("not an HTTP status line: ", text.substr(0, 80)));
    }
    return line.size();
  }
  const size_t colon = text.find(':');
  if (colon != absl::string_view::npos) {
    exchange.response.headers[absl::AsciiStrToLower(text.substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(text.substr(colon + 1)));
  }
  return line.size();
}

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto& exchange = *static_cast<Exchange*>(user);
  const absl::string_view piece(data, size * count);
  HttpsResponse& response = exchange.response;
  if (exchange.request->on_body && response.status / 100 == 2) {
    absl::Status used = exchange.request->on_body(piece);
    if (!used.ok()) {
      exchange.refusal = std::move(used);
      return 0;
    }
  } else if (response.body.size() < kKeptBodyBytes) {
    absl::StrAppend(&response.body, piece.substr(0, kKeptBodyBytes - response.body.size()));
  }
  return piece.size();
}

size_t OnUpload(char* buffer, size_t size, size_t count, void* user) {
  auto& exchange = *static_cast<Exchange*>(user);
  const size_t room = size * count;
  if (exchange.body_file.is_open()) {
    exchange.body_file.read(buffer, static_cast<std::streamsize>(room));
    if (exchange.body_file.bad()) return CURL_READFUNC_ABORT;
    return static_cast<size_t>(exchange.body_file.gcount());
  }
  const size_t taken = std::min(room, exchange.body_left.size());
  std::copy_n(exchange.body_left.data(), taken, buffer);
  exchange.body_left.remove_prefix(taken);
  return taken;
}

bool BreaksLines(absl::string_view text) {
  return text.find_first_of(absl::string_view("\r\n\0", 3)) != absl::string_view::npos;
}

std::string HostOf(absl::string_view url) {
  absl::ConsumePrefix(&url, "https://");
  return std::string(url.substr(0, url.find('/')));
}

void InitializeCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct CurlDeleter {
  void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};

}  // namespace

absl::StatusOr<HttpsResponse> SendHttps(const HttpsRequest& request, std::chrono::seconds idle_timeout) {
  if (!absl::StartsWith(request.url, "https://") || HostOf(request.url).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(request.url, ": only https:// URLs with a host are fetched"));
  }
  const std::string host = HostOf(request.url);
  // libcurl refuses a CR or LF in a header it is given, but not in a URL's
  // path; neither is ever sent.
  bool clean = !BreaksLines(request.method) && !BreaksLines(request.url);
  for (const auto& [name, value] : request.headers) clean = clean && !BreaksLines(name) && !BreaksLines(value);
  if (!clean) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a request to %s would hold a CR, LF or NUL in its URL or a header; not sent", host));
  }
  InitializeCurlOnce();
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  if (curl == nullptr) return absl::ResourceExhaustedError("libcurl could not make a handle");
  CURL* handle = curl.get();

  Exchange exchange;
  exchange.request = &request;
  uint64_t body_size = request.body.size();
  if (!request.body_file.empty()) {
    std::error_code error;
    body_size = std::filesystem::file_size(request.body_file, error);
    exchange.body_file.open(request.body_file, std::ios::binary);
    if (error || !exchange.body_file) {
      return absl::InvalidArgumentError(absl::StrCat("cannot read ", request.body_file.string()));
    }
  } else {
    exchange.body_left = request.body;
  }

  std::unique_ptr<curl_slist, CurlDeleter> headers;
  // A header left off (an Authorization) would turn into a misleading
  // refusal from the registry, so a failed append fails the request.
  const auto add_header = [&](const std::string& line) {
    curl_slist* longer = curl_slist_append(headers.get(), line.c_str());
    if (longer == nullptr) return false;
    (void)headers.release();
    headers.reset(longer);
    return true;
  };
  // libcurl would otherwise wait a second for "100 Continue" before each
  // upload, which registries do not all send.
  bool all_headers = add_header("Expect:");
  for (const auto& [name, value] : request.headers) {
    // "Name:" with nothing after it would remove the header; "Name;" sends it empty.
    all_headers = all_headers && add_header(value.empty() ? absl::StrCat(name, ";") : absl::StrCat(name, ": ", value));
  }
  if (!all_headers) {
    return absl::ResourceExhaustedError(absl::StrFormat("out of memory making the headers of a request to %s", host));
  }

  char error_text[CURL_ERROR_SIZE] = {};
  curl_easy_setopt(handle, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(handle, CURLOPT_PROTOCOLS_STR, "https");
  curl_easy_setopt(handle, CURLOPT_ERRORBUFFER, error_text);
  curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);  // kilnd's threads: no SIGALRM for DNS timeouts
  curl_easy_setopt(handle, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, OnHeaderLine);
  curl_easy_setopt(handle, CURLOPT_HEADERDATA, &exchange);
  curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(handle, CURLOPT_WRITEDATA, &exchange);
  curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT, static_cast<long>(idle_timeout.count()));
  // Stalled: under one byte a second for the whole idle time.
  curl_easy_setopt(handle, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(handle, CURLOPT_LOW_SPEED_TIME, static_cast<long>(idle_timeout.count()));
  curl_easy_setopt(handle, CURLOPT_SSLVERSION, static_cast<long>(CURL_SSLVERSION_TLSv1_2));
  // Schannel (Windows) fails a certificate whose revocation list cannot be
  // fetched, which a registry behind a firewall or a private CA often has;
  // a revoked one still fails. OpenSSL's libcurl does not check revocation.
  curl_easy_setopt(handle, CURLOPT_SSL_OPTIONS, static_cast<long>(CURLSSLOPT_REVOKE_BEST_EFFORT));
  if (const char* file = std::getenv("SSL_CERT_FILE"); file != nullptr && *file != '\0') {
    if (curl_easy_setopt(handle, CURLOPT_CAINFO, file) != CURLE_OK) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "SSL_CERT_FILE names %s, but this build's TLS cannot read a CA file; unset it", file));
    }
  }
  if (const char* directory = std::getenv("SSL_CERT_DIR"); directory != nullptr && *directory != '\0') {
    // Schannel (Windows) has no directory of CAs. Leaving the variable unread
    // would trust other CAs than the user named, so it is refused instead.
    if (curl_easy_setopt(handle, CURLOPT_CAPATH, directory) != CURLE_OK) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "SSL_CERT_DIR names %s, but this build's TLS cannot read a directory of CAs; name a PEM file "
          "in SSL_CERT_FILE instead, or add the CA to the system's certificate store",
          directory));
    }
  }

  if (request.cancelled) {
    curl_easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, OnProgress);
    curl_easy_setopt(handle, CURLOPT_XFERINFODATA, &exchange);
    curl_easy_setopt(handle, CURLOPT_NOPROGRESS, 0L);
  }
  if (request.method == "HEAD") {
    curl_easy_setopt(handle, CURLOPT_NOBODY, 1L);
  } else if (request.method != "GET") {
    curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  if (body_size > 0 || request.method == "PUT" || request.method == "POST" || request.method == "PATCH") {
    // An upload (sent as `method`, with its Content-Length) whatever the method.
    curl_easy_setopt(handle, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(handle, CURLOPT_READFUNCTION, OnUpload);
    curl_easy_setopt(handle, CURLOPT_READDATA, &exchange);
    curl_easy_setopt(handle, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body_size));
  }

  const CURLcode done = curl_easy_perform(handle);
  if (exchange.refusal.has_value()) return *std::move(exchange.refusal);
  const std::string detail = error_text[0] != '\0' ? error_text : curl_easy_strerror(done);
  switch (done) {
    case CURLE_OK:
      break;
    case CURLE_ABORTED_BY_CALLBACK:
      return absl::CancelledError(absl::StrFormat("the request to %s was cancelled", host));
    case CURLE_OPERATION_TIMEDOUT:
      return absl::DeadlineExceededError(absl::StrFormat("%s stopped answering (%s)", host, detail));
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
      return absl::UnavailableError(absl::StrFormat("cannot connect to %s: %s", host, detail));
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CONNECT_ERROR:
      return absl::UnavailableError(absl::StrFormat(
          "%s's certificate is not trusted, or TLS failed (%s); add its CA to the system's trusted "
          "CAs, or name it in SSL_CERT_FILE",
          host, detail));
    case CURLE_RECV_ERROR:
      if (absl::StrContains(detail, "chunked")) {
        return absl::DataLossError(absl::StrFormat("%s sent malformed chunked encoding (%s)", host, detail));
      }
      return absl::UnavailableError(absl::StrFormat("%s: %s", host, detail));
    case CURLE_OUT_OF_MEMORY:  // also what libcurl says of a header line over its 100 KiB
      return absl::DataLossError(absl::StrFormat(
          "%s sent a header line longer than 64 KiB, or this process ran out of memory (%s)", host, detail));
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_TOO_MANY_REDIRECTS:
      return absl::DataLossError(absl::StrFormat("%s sent what is not a valid HTTP response (%s)", host, detail));
    default:
      return absl::UnavailableError(absl::StrFormat("%s: %s", host, detail));
  }
  long status = 0;
  curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &status);
  exchange.response.status = static_cast<int>(status);
  return std::move(exchange.response);
}

}  // namespace kiln
