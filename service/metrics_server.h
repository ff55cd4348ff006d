#ifndef KILN_SERVICE_METRICS_SERVER_H_
#define KILN_SERVICE_METRICS_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/tcp_listener.h"

namespace kiln::service {

// metrics_listen: answers HTTP GET /metrics with `page()` (Prometheus text),
// from a thread of its own, one connection at a time (a scraper every few
// seconds, not a web server; a client that sends too slowly is dropped after
// two seconds). Anything else gets 404 or 405; it reads no request body.
class MetricsServer {
 public:
  using Page = std::function<absl::StatusOr<std::string>()>;
  // `address`: PORT (loopback) or HOST:PORT.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              Page page);
  ~MetricsServer();
  uint16_t port() const { return listener_->port(); }

 private:
  MetricsServer(std::unique_ptr<platform::TcpListener> listener, Page page);
  void Serve();
  void Answer(platform::TcpConnection& connection);

  std::unique_ptr<platform::TcpListener> listener_;
  Page page_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace kiln::service

#endif  // KILN_SERVICE_METRICS_SERVER_H_
