#ifndef KILN_COMMON_TCP_LISTENER_H_
#define KILN_COMMON_TCP_LISTENER_H_

// A small blocking TCP listener for plain-text protocols beside gRPC (the
// metrics page): accept with a timeout, read a request head, write a reply.
// The same Berkeley-socket calls on POSIX and Windows (Winsock).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kiln::platform {

class TcpConnection {
 public:
  virtual ~TcpConnection() = default;
  // Reads until `end` has arrived (returning everything up to and with it),
  // at most `max_bytes`; DEADLINE_EXCEEDED after `timeout`, OUT_OF_RANGE when
  // `max_bytes` came without `end`, UNAVAILABLE when the peer closed first.
  virtual absl::StatusOr<std::string> ReadUntil(absl::string_view end, size_t max_bytes,
                                                absl::Duration timeout) = 0;
  virtual absl::Status WriteAll(absl::string_view data) = 0;
};

class TcpListener {
 public:
  // Listens on `host` (an IPv4 or IPv6 literal, or "localhost") and `port`
  // (0: any free one). FAILED_PRECONDITION naming the address when it is taken.
  static absl::StatusOr<std::unique_ptr<TcpListener>> Listen(const std::string& host,
                                                             uint16_t port);
  virtual ~TcpListener() = default;
  virtual uint16_t port() const = 0;
  // The next connection, or nullptr when none came within `timeout`.
  virtual absl::StatusOr<std::unique_ptr<TcpConnection>> Accept(absl::Duration timeout) = 0;
};

}  // namespace kiln::platform

#endif  // KILN_COMMON_TCP_LISTENER_H_
