#include "common/tcp_listener.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

// Winsock has the Berkeley calls under other names for a few: the shims below.
#ifdef _WIN32
#include "common/windows_api.h"
#include <ws2tcpip.h>
#else
#include <arpa/inet.h>
#include <cerrno>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#endif

namespace kiln::platform {
namespace {

#ifdef _WIN32
using Socket = SOCKET;
constexpr Socket kNoSocket = INVALID_SOCKET;
void CloseSocket(Socket socket) { closesocket(socket); }
int PollOne(Socket socket, short events, int timeout_ms) {
  WSAPOLLFD entry{socket, events, 0};
  return WSAPoll(&entry, 1, timeout_ms);
}
int LastSocketError() { return WSAGetLastError(); }
constexpr int kSendFlags = 0;
#else
using Socket = int;
constexpr Socket kNoSocket = -1;
void CloseSocket(Socket socket) { close(socket); }
int PollOne(Socket socket, short events, int timeout_ms) {
  pollfd entry{socket, events, 0};
  return poll(&entry, 1, timeout_ms);
}
int LastSocketError() { return errno; }
constexpr int kSendFlags = MSG_NOSIGNAL;  // a peer gone mid-reply is an error, not SIGPIPE
#endif

int Millis(absl::Duration duration) {
  return static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(duration)));
}

class OpenSocket {
 public:
  explicit OpenSocket(Socket socket) : socket_(socket) {}
  ~OpenSocket() {
    if (socket_ != kNoSocket) CloseSocket(socket_);
  }
  OpenSocket(const OpenSocket&) = delete;
  OpenSocket& operator=(const OpenSocket&) = delete;
  Socket get() const { return socket_; }
  Socket release() { return std::exchange(socket_, kNoSocket); }

 private:
  Socket socket_;
};

class Connection final : public TcpConnection {
 public:
  explicit Connection(Socket socket) : socket_(socket) {}

  absl::StatusOr<std::string> ReadUntil(absl::string_view end, size_t max_bytes,
                                        absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    std::string received;
    char buffer[4096];
    while (absl::string_view(received).find(end) == absl::string_view::npos) {
      if (received.size() >= max_bytes) {
        return absl::OutOfRangeError(absl::StrCat("more than ", max_bytes, " bytes"));
      }
      const int ready = PollOne(socket_.get(), POLLIN, Millis(deadline - absl::Now()));
      if (ready == 0) return absl::DeadlineExceededError("the peer sent too slowly");
      if (ready < 0) return absl::UnavailableError(absl::StrCat("poll: ", LastSocketError()));
      const int got = static_cast<int>(recv(socket_.get(), buffer, sizeof(buffer), 0));
      if (got <= 0) return absl::UnavailableError("the peer closed the connection");
      received.append(buffer, static_cast<size_t>(got));
    }
    return received.substr(0, absl::string_view(received).find(end) + end.size());
  }

  absl::Status WriteAll(absl::string_view data) override {
    while (!data.empty()) {
      const int sent = static_cast<int>(
          send(socket_.get(), data.data(), static_cast<int>(std::min<size_t>(data.size(), 1 << 20)),
               kSendFlags));
      if (sent <= 0) return absl::UnavailableError(absl::StrCat("send: ", LastSocketError()));
      data.remove_prefix(static_cast<size_t>(sent));
    }
    return absl::OkStatus();
  }

 private:
  OpenSocket socket_;
};

class Listener final : public TcpListener {
 public:
  Listener(Socket socket, uint16_t port) : socket_(socket), port_(port) {}

  uint16_t port() const override { return port_; }

  absl::StatusOr<std::unique_ptr<TcpConnection>> Accept(absl::Duration timeout) override {
    const int ready = PollOne(socket_.get(), POLLIN, Millis(timeout));
    if (ready == 0) return nullptr;
    if (ready < 0) return absl::InternalError(absl::StrCat("poll: ", LastSocketError()));
    const Socket accepted = accept(socket_.get(), nullptr, nullptr);
    if (accepted == kNoSocket) return nullptr;  // the peer gave up meanwhile
    return std::make_unique<Connection>(accepted);
  }

 private:
  OpenSocket socket_;
  uint16_t port_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Listen(const std::string& host,
                                                                  uint16_t port) {
#ifdef _WIN32
  // Winsock counts its users; this one lasts as long as the process.
  static const bool winsock_started = [] {
    WSADATA wsa{};
    return WSAStartup(MAKEWORD(2, 2), &wsa) == 0;
  }();
  if (!winsock_started) return absl::UnavailableError("Winsock did not start");
#endif
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("cannot listen on %s: no such address", host));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, freeaddrinfo);
  OpenSocket socket(::socket(found->ai_family, found->ai_socktype, found->ai_protocol));
  if (socket.get() == kNoSocket) {
    return absl::InternalError(absl::StrCat("socket: ", LastSocketError()));
  }
#ifndef _WIN32
  // A restarted kilnd may bind while the last one's connections linger.
  const int reuse = 1;
  setsockopt(socket.get(), SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof(reuse));
#endif
  if (bind(socket.get(), found->ai_addr, static_cast<int>(found->ai_addrlen)) != 0 ||
      listen(socket.get(), 16) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot listen on %s:%d (error %d): is another program using that port?", host, port,
        LastSocketError()));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(socket.get(), reinterpret_cast<sockaddr*>(&bound), &length);
  const uint16_t bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::make_unique<Listener>(socket.release(), bound_port);
}

}  // namespace kiln::platform
