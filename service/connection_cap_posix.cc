#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <utility>

#include "grpc/support/sync.h"
#include "grpcpp/impl/server_builder_option.h"
#include "service/connection_cap.h"
#include "spdlog/spdlog.h"

// gRPC's socket mutator, as gRPC's src/core/lib/iomgr/socket_mutator.h lays it
// out. That header is not installed, yet GRPC_ARG_SOCKET_MUTATOR's users build
// against this layout; it is the same in 1.51 (Debian's, which kilnd builds
// with) and in later releases. Only the pointer type is gRPC's public one.
namespace {

struct MutateSocketInfo {
  int fd;
  int usage;  // grpc_fd_usage, a C enum: an int
};
constexpr int kServerConnectionUsage = 2;  // GRPC_FD_SERVER_CONNECTION_USAGE

struct MutatorVtable {
  bool (*mutate_fd)(int fd, grpc_socket_mutator* mutator);
  int (*compare)(grpc_socket_mutator* a, grpc_socket_mutator* b);
  void (*destroy)(grpc_socket_mutator* mutator);
  bool (*mutate_fd_2)(const MutateSocketInfo* info, grpc_socket_mutator* mutator);
};

// Starts as every grpc_socket_mutator does (vtable, reference count); gRPC
// holds references while its channel arguments do and calls destroy after.
struct CapMutator {
  const MutatorVtable* vtable;
  gpr_refcount refcount;
  std::shared_ptr<kiln::service::ConnectionCap> cap;
};

CapMutator* AsCapMutator(grpc_socket_mutator* mutator) {
  return reinterpret_cast<CapMutator*>(mutator);
}

// Always true, refused or not: false would make gRPC 1.51 stop accepting on
// the listener for good (tcp_server_posix.cc's `goto error`).
bool MutateFd2(const MutateSocketInfo* info, grpc_socket_mutator* mutator) {
  if (info->usage == kServerConnectionUsage) AsCapMutator(mutator)->cap->Admit(info->fd);
  return true;
}

// Only for a gRPC that would call the old entry point: nothing to count there.
bool MutateFd(int, grpc_socket_mutator*) { return true; }

int Compare(grpc_socket_mutator* a, grpc_socket_mutator* b) { return (a > b) - (a < b); }

void Destroy(grpc_socket_mutator* mutator) { delete AsCapMutator(mutator); }

constexpr MutatorVtable kCapVtable = {MutateFd, Compare, Destroy, MutateFd2};

class CapOption final : public grpc::ServerBuilderOption {
 public:
  explicit CapOption(std::shared_ptr<kiln::service::ConnectionCap> cap) : cap_(std::move(cap)) {}

  void UpdateArguments(grpc::ChannelArguments* args) override {
    auto* mutator = new CapMutator{&kCapVtable, {}, cap_};
    gpr_ref_init(&mutator->refcount, 1);  // the arguments' reference, which they drop
    args->SetSocketMutator(reinterpret_cast<grpc_socket_mutator*>(mutator));
  }
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>*) override {}

 private:
  std::shared_ptr<kiln::service::ConnectionCap> cap_;
};

// The local port of a TCP socket; 0 for any other (a Unix socket).
int LocalTcpPort(int fd) {
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) return 0;
  if (local.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
  if (local.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
  return 0;
}

// A refusal is logged at most this often, with the count since the last line,
// so that a flood of connections does not flood the log.
constexpr absl::Duration kReportEvery = absl::Minutes(1);

}  // namespace

namespace kiln::service {

const bool ConnectionCap::kEnforced = true;

void ConnectionCap::SetPort(int port) {
  absl::MutexLock lock(&mutex_);
  port_ = port;
}

bool ConnectionCap::Admit(int fd) {
  const int port = LocalTcpPort(fd);
  struct stat status {};
  if (port == 0 || fstat(fd, &status) != 0) return true;
  absl::MutexLock lock(&mutex_);
  if (port != port_) return true;
  open_.erase(fd);  // a descriptor just accepted: whatever it held before is closed
  const size_t cap = static_cast<size_t>(max_connections_);
  if (const absl::Time now = absl::Now();
      open_.size() >= cap && now - last_recheck_ >= recheck_every_) {
    ForgetClosed();
    last_recheck_ = now;
  }
  if (open_.size() >= cap) {
    shutdown(fd, SHUT_RDWR);
    NoteRefusal();
    return false;
  }
  open_[fd] = {static_cast<uint64_t>(status.st_dev), static_cast<uint64_t>(status.st_ino)};
  return true;
}

// Only at the cap: below it, a stale entry costs nothing but memory, and a
// reused descriptor replaces its own.
void ConnectionCap::ForgetClosed() {
  for (auto it = open_.begin(); it != open_.end();) {
    struct stat status {};
    const bool same = fstat(it->first, &status) == 0 &&
                      static_cast<uint64_t>(status.st_dev) == it->second.device &&
                      static_cast<uint64_t>(status.st_ino) == it->second.inode;
    it = same ? std::next(it) : open_.erase(it);
  }
}

void ConnectionCap::NoteRefusal() {
  ++refused_;
  ++unreported_;
  const absl::Time now = absl::Now();
  if (now - last_report_ < kReportEvery) return;
  spdlog::warn(
      "the TCP listener holds {} connections, its tcp_max_connections: refusing new ones until "
      "some close ({} refused since this was last logged); raise tcp_max_connections if these are "
      "real clients",
      open_.size(), unreported_);
  last_report_ = now;
  unreported_ = 0;
}

uint64_t ConnectionCap::refused() const {
  absl::MutexLock lock(&mutex_);
  return refused_;
}

void InstallConnectionCap(std::shared_ptr<ConnectionCap> cap, grpc::ServerBuilder& builder) {
  builder.SetOption(std::make_unique<CapOption>(std::move(cap)));
}

}  // namespace kiln::service
