// gRPC 1.51's Windows TCP server (tcp_server_windows.cc) applies no socket
// mutator to the connections it accepts, so kilnd has no place to count or
// refuse them: tcp_max_connections is not enforced here, and the idle limit
// (tcp_idle_seconds) is what bounds connections. kilnd says so at start.

#include "service/connection_cap.h"

namespace kiln::service {

const bool ConnectionCap::kEnforced = false;

void ConnectionCap::SetPort(int port) {
  absl::MutexLock lock(&mutex_);
  port_ = port;
}

bool ConnectionCap::Admit(int) { return true; }

uint64_t ConnectionCap::refused() const { return 0; }

void InstallConnectionCap(std::shared_ptr<ConnectionCap>, grpc::ServerBuilder&) {}

}  // namespace kiln::service
