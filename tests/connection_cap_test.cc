// tcp_max_connections over real loopback sockets (POSIX: the cap is not
// enforced on Windows, see connection_cap.h). kilnd's use of it through gRPC
// is tested end to end in tests/python/test_remote_tls.py.
#include "service/connection_cap.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace kiln::service {
namespace {

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket(const Socket&) = delete;
  int fd() const { return fd_; }
  void Close() { close(std::exchange(fd_, -1)); }

 private:
  int fd_;
};

struct Listener {
  Socket socket{::socket(AF_INET, SOCK_STREAM, 0)};
  int port = 0;

  Listener() {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    EXPECT_EQ(bind(socket.fd(), reinterpret_cast<sockaddr*>(&address), length), 0);
    EXPECT_EQ(listen(socket.fd(), 16), 0);
    getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&address), &length);
    port = ntohs(address.sin_port);
  }

  // A client connected to this listener, and the server's end of it.
  std::pair<Socket, Socket> Connect() const {
    Socket client(::socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(connect(client.fd(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    return {std::move(client), Socket(accept(socket.fd(), nullptr, nullptr))};
  }
};

// Whether the peer of `client` ended the connection within `timeout_ms`.
bool ClosedByServer(const Socket& client, int timeout_ms = 1000) {
  pollfd entry{client.fd(), POLLIN, 0};
  if (poll(&entry, 1, timeout_ms) != 1) return false;
  char byte = 0;
  return recv(client.fd(), &byte, 1, 0) == 0;
}

TEST(ConnectionCapTest, RefusesPastTheCapAndAdmitsAgainOnceAConnectionCloses) {
  ASSERT_TRUE(ConnectionCap::kEnforced);
  Listener listener;
  ConnectionCap cap(2, absl::ZeroDuration());  // looks for closed ones at every arrival
  cap.SetPort(listener.port);
  std::vector<std::pair<Socket, Socket>> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(listener.Connect());
    EXPECT_TRUE(cap.Admit(held.back().second.fd()));
  }
  auto [refused_client, refused] = listener.Connect();
  EXPECT_FALSE(cap.Admit(refused.fd()));
  EXPECT_TRUE(ClosedByServer(refused_client)) << "a refused connection is shut down at once";
  EXPECT_FALSE(ClosedByServer(held[0].first, 100)) << "admitted ones are left alone";
  EXPECT_EQ(cap.refused(), 1u);

  // gRPC closes a connection without telling the cap: it sees the descriptor
  // closed (here the next client's socket takes its number; in kilnd, often
  // the next connection accepted does, which the cap sees too).
  held[0].second.Close();
  auto [next_client, next] = listener.Connect();
  EXPECT_TRUE(cap.Admit(next.fd()));
  auto [over_client, over] = listener.Connect();
  EXPECT_FALSE(cap.Admit(over.fd())) << "two open again: the cap holds";
  EXPECT_EQ(cap.refused(), 2u);
}

TEST(ConnectionCapTest, AFloodAtTheCapLooksForClosedConnectionsOnlyNowAndThen) {
  Listener listener;
  ConnectionCap cap(1, absl::Hours(1));
  cap.SetPort(listener.port);
  auto [client, admitted] = listener.Connect();
  ASSERT_TRUE(cap.Admit(admitted.fd()));
  auto [refused_client, refused] = listener.Connect();
  EXPECT_FALSE(cap.Admit(refused.fd()));  // looked, and found the one open
  admitted.Close();
  Socket filler(::socket(AF_INET, SOCK_STREAM, 0));  // takes the closed descriptor's number
  auto [next_client, next] = listener.Connect();
  EXPECT_FALSE(cap.Admit(next.fd())) << "looked again within the hour";
}

TEST(ConnectionCapTest, CountsOnlyItsOwnPortsConnections) {
  Listener capped, other;
  ConnectionCap cap(1);
  cap.SetPort(capped.port);
  auto [client, admitted] = capped.Connect();
  ASSERT_TRUE(cap.Admit(admitted.fd()));
  // The endpoint file's loopback listener and the Unix socket are not capped.
  for (int i = 0; i < 3; ++i) {
    auto [other_client, other_server] = other.Connect();
    EXPECT_TRUE(cap.Admit(other_server.fd()));
  }
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  Socket unix_one(pair[0]), unix_other(pair[1]);
  EXPECT_TRUE(cap.Admit(unix_one.fd()));
  EXPECT_EQ(cap.refused(), 0u);
}

TEST(ConnectionCapTest, CountsNothingUntilItsPortIsKnown) {
  Listener listener;
  ConnectionCap cap(1);
  std::vector<std::pair<Socket, Socket>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(listener.Connect());
    EXPECT_TRUE(cap.Admit(held.back().second.fd()));
  }
}

}  // namespace
}  // namespace kiln::service
