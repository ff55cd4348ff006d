#ifndef KILN_SERVICE_CONNECTION_CAP_H_
#define KILN_SERVICE_CONNECTION_CAP_H_

// tcp_max_connections: how many connections kilnd's TCP listener keeps open at
// once. gRPC 1.51 has no such setting (its connection quota came in 2024), but
// its POSIX TCP server hands every socket it accepts to the server's socket
// mutator before using it; there the cap counts the listener's connections and
// refuses one over the cap by shutting it down, so that gRPC's handshake reads
// end of file and closes it. (The mutator must not fail a socket: gRPC 1.51
// then stops accepting on that listener for good.)
//
// gRPC 1.51's Windows TCP server applies no mutator: there the cap is not
// enforced (kEnforced is false) and only the idle limit bounds connections.
// connection_cap_posix.cc and connection_cap_win.cc implement this header.

#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_builder.h"

namespace kiln::service {

class ConnectionCap {
 public:
  // Whether this platform's gRPC lets the cap be enforced.
  static const bool kEnforced;

  // At the cap, a connection that arrives is refused unless one of those
  // counted has closed, which costs a look at each (a millisecond for 4096):
  // they are looked at no more often than `recheck_every`, so that a flood
  // of connections costs little, and a slot freed meanwhile is seen that late.
  explicit ConnectionCap(int max_connections,
                         absl::Duration recheck_every = absl::Milliseconds(10))
      : max_connections_(max_connections), recheck_every_(recheck_every) {}

  // Counts only connections accepted on this local TCP port: the Unix socket
  // and the endpoint file's loopback listener are never capped. Until it is
  // set (a port chosen by the system is known once the server has started),
  // nothing is counted.
  void SetPort(int port);

  // Admits the connection just accepted on `fd`, or refuses it: shuts it down
  // and returns false. Connections of other listeners are always admitted.
  bool Admit(int fd);

  // Connections refused since the start.
  uint64_t refused() const;

 private:
  // Forgets connections whose descriptor has been closed since.
  void ForgetClosed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void NoteRefusal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  // gRPC says nothing when it closes a connection, so the cap keeps what
  // identifies each admitted one, its descriptor and the socket's inode, and
  // a descriptor that is closed or now names another file is a connection gone.
  struct Socket {
    uint64_t device = 0;
    uint64_t inode = 0;
  };

  const int max_connections_;
  const absl::Duration recheck_every_;
  mutable absl::Mutex mutex_;
  int port_ ABSL_GUARDED_BY(mutex_) = 0;
  std::map<int, Socket> open_ ABSL_GUARDED_BY(mutex_);
  absl::Time last_recheck_ ABSL_GUARDED_BY(mutex_) = absl::InfinitePast();
  uint64_t refused_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t unreported_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Time last_report_ ABSL_GUARDED_BY(mutex_) = absl::InfinitePast();
};

// Makes the server `builder` builds hand every connection it accepts to `cap`
// (nothing where kEnforced is false).
void InstallConnectionCap(std::shared_ptr<ConnectionCap> cap, grpc::ServerBuilder& builder);

}  // namespace kiln::service

#endif  // KILN_SERVICE_CONNECTION_CAP_H_
