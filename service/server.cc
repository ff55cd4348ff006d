#include "service/server.h"

#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/platform.h"
#include "common/status_macros.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace kiln::service {
namespace {

namespace fs = std::filesystem;

// sockaddr_un.sun_path holds 108 bytes on Linux (104 on macOS).
constexpr size_t kMaxSocketPath = 100;

// Makes `path` bindable: private parent directory, no live server on it, no
// stale socket file left by a crash.
absl::Status PrepareSocketPath(const fs::path& path) {
  if (path.string().size() > kMaxSocketPath) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "local socket path %s is longer than %d characters, the limit of Unix sockets; set "
        "local_socket to a shorter path",
        path.string(), kMaxSocketPath));
  }
  RETURN_IF_ERROR(platform::EnsurePrivateDirectory(path.parent_path()));
  if (!fs::exists(fs::symlink_status(path))) return absl::OkStatus();
  if (platform::LocalSocketAcceptsConnections(path)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "another kilnd is already serving on %s; stop it (kill its pid) or set local_socket",
        path.string()));
  }
  std::error_code error;
  fs::remove(path, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "stale socket %s cannot be removed: %s", path.string(), error.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KilnServer>> KilnServer::Start(
    const ServerOptions& options, cache::ArtifactStore& store,
    compiler::ToolchainRegistry& toolchains, CompileCoordinator& coordinator) {
  std::unique_ptr<KilnServer> server(new KilnServer());
  server->service_ =
      std::make_unique<KilnService>(store, toolchains, coordinator, options.data_dir,
                                    options.claim_timeout);
  // Must precede building the server; serves grpc.health.v1 with no extra code.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  if (!options.local_socket.empty()) {
    RETURN_IF_ERROR(PrepareSocketPath(options.local_socket));
    const std::string target = absl::StrCat("unix:", options.local_socket);
    builder.AddListeningPort(target, grpc::InsecureServerCredentials());
    server->socket_path_ = options.local_socket;
    server->endpoints_.push_back(target);
  }
  if (!options.tcp_address.empty()) {
    builder.AddListeningPort(options.tcp_address, grpc::InsecureServerCredentials(),
                             &server->tcp_port_);
  }
  // Oversized requests are refused by gRPC itself with RESOURCE_EXHAUSTED.
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<uint64_t>(options.max_request_size, std::numeric_limits<int>::max())));
  builder.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot listen on %s%s; is the address in use or not local?",
        options.local_socket.empty() ? "" : absl::StrCat("unix:", options.local_socket, " "),
        options.tcp_address));
  }
  if (!options.tcp_address.empty()) {
    const std::string host = options.tcp_address.substr(0, options.tcp_address.rfind(':'));
    server->endpoints_.push_back(absl::StrCat(host, ":", server->tcp_port_));
  }
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  return server;
}

void KilnServer::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->SetServingStatus(false);
  service_->ReleaseWaitingLookups();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
  if (!socket_path_.empty()) {
    std::error_code ignored;
    fs::remove(socket_path_, ignored);
  }
}

KilnServer::~KilnServer() { Shutdown(absl::ZeroDuration()); }

}  // namespace kiln::service
