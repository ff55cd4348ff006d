#include "service/metrics_server.h"

#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/platform.h"
#include "spdlog/spdlog.h"

namespace kiln::service {
namespace {

constexpr size_t kMaxRequestHead = 8192;
constexpr absl::Duration kReadTimeout = absl::Seconds(2);

std::string Response(absl::string_view status, absl::string_view content_type,
                     absl::string_view body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    Page page) {
  const std::optional<platform::HostPort> split = platform::SplitHostPort(address);
  if (!split.has_value()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "metrics_listen '%s' is not PORT or HOST:PORT, e.g. 127.0.0.1:9464", address));
  }
  absl::StatusOr<std::unique_ptr<platform::TcpListener>> listener =
      platform::TcpListener::Listen(split->host, split->port);
  if (!listener.ok()) {
    return absl::Status(listener.status().code(),
                        absl::StrCat("metrics_listen: ", listener.status().message()));
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(*std::move(listener), std::move(page)));
}

MetricsServer::MetricsServer(std::unique_ptr<platform::TcpListener> listener, Page page)
    : listener_(std::move(listener)), page_(std::move(page)), thread_([this] { Serve(); }) {}

MetricsServer::~MetricsServer() {
  stopping_ = true;
  thread_.join();
}

void MetricsServer::Serve() {
  while (!stopping_) {
    // Wakes every 200 ms to notice a stop.
    absl::StatusOr<std::unique_ptr<platform::TcpConnection>> connection =
        listener_->Accept(absl::Milliseconds(200));
    if (!connection.ok()) {
      spdlog::warn("metrics: {}", connection.status().ToString());
      continue;
    }
    if (*connection != nullptr) Answer(**connection);
  }
}

void MetricsServer::Answer(platform::TcpConnection& connection) {
  absl::StatusOr<std::string> head = connection.ReadUntil("\r\n\r\n", kMaxRequestHead, kReadTimeout);
  if (!head.ok()) {
    if (absl::IsOutOfRange(head.status())) {
      (void)connection.WriteAll(Response("431 Request Header Fields Too Large", "text/plain", ""));
    }
    return;
  }
  const absl::string_view request_line = absl::string_view(*head).substr(0, head->find("\r\n"));
  std::string reply;
  if (!absl::StartsWith(request_line, "GET ")) {
    reply = Response("405 Method Not Allowed", "text/plain", "kilnd's metrics page takes GET\n");
  } else if (absl::StartsWith(request_line, "GET /metrics ") ||
             absl::StartsWith(request_line, "GET /metrics?")) {
    absl::StatusOr<std::string> page = page_();
    reply = page.ok() ? Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", *page)
                      : Response("500 Internal Server Error", "text/plain",
                                 absl::StrCat(page.status().message(), "\n"));
  } else {
    reply = Response("404 Not Found", "text/plain", "kilnd serves its metrics at /metrics\n");
  }
  (void)connection.WriteAll(reply);  // a scraper gone meanwhile is no error of ours
}

}  // namespace kiln::service
