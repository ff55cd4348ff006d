#ifndef KILN_SERVICE_SERVER_H_
#define KILN_SERVICE_SERVER_H_

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/artifact_store.h"
#include "grpcpp/server.h"
#include "service/connection_cap.h"
#include "service/bundle_subscription.h"
#include "service/kiln_service.h"

namespace kiln::service {

struct ServerOptions {
  // Unix socket path; empty for none. Its directory is made private (0700),
  // or open to the members of local_socket_group (platform::ShareLocalSocket).
  std::string local_socket;
  std::string local_socket_group;
  // "HOST:PORT" (port 0 picks a free one); empty for none. Callers check
  // loopback-vs-remote policy before (ValidateConfig).
  std::string tcp_address;
  // TLS on tcp_address (PEM file paths; empty cert: plaintext). With a client
  // CA and/or a tokens file its callers are tenants, identified by their
  // certificate's common name or their bearer token (client_identity.h).
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  std::string client_tokens;
  // File of PEM public keys whose signed bundles import as they are (trusted_bundle_keys).
  std::string trusted_bundle_keys;
  // Bundles imported by kilnd itself, checked every bundle_refresh
  // (bundle_subscription.h); checked by BundleSourceProblem before.
  std::vector<std::string> bundle_sources;
  absl::Duration bundle_refresh = absl::Hours(1);
  std::vector<std::string> gpu_targets;  // empty: nvidia-smi's
  // With tcp_address: a connection with no call in progress for this long is
  // closed (every listener's: gRPC's setting is the server's), and at most
  // `tcp_max_connections` are open on tcp_address at once (connection_cap.h).
  absl::Duration tcp_idle_limit = absl::Minutes(5);
  int tcp_max_connections = 4096;
  // How many compiles of one tenant may run at once (the rest queue).
  int compiles_per_tenant = 1;
  // The token listener for local clients where there is no Unix socket
  // (Windows): kilnd listens on 127.0.0.1:`local_port` (0: a free port) and
  // writes "127.0.0.1:PORT\nTOKEN\n" to this file, in a directory only its
  // account and `endpoint_readers` may read. Empty for none.
  std::string endpoint_file;
  int local_port = 0;
  std::vector<std::string> endpoint_readers;
  uint64_t max_request_size = 64ull << 20;
  std::string data_dir;  // reported in stats
  // Where the store serves blobs as files to local clients; named to them in
  // ServedFilesPointer(endpoint) for each local endpoint. Empty: not named.
  std::string served_files_dir;
  // How long a client that claimed a missing key may take to start compiling
  // it (or to renew its claim) before clients waiting on it give up on it,
  // and how long renewals may keep it.
  ClaimLimits claim_limits;
};

// The file beside a local endpoint (socket or endpoint file) that names the
// served files directory: "<endpoint>.files".
std::filesystem::path ServedFilesPointer(const std::string& endpoint);

// A running gRPC server: kiln.v1.Kiln plus grpc.health.v1.Health.
class KilnServer {
 public:
  // Binds every listener or fails: FAILED_PRECONDITION when the socket is in
  // use by a live kilnd or its directory is not private, UNAVAILABLE when a
  // port cannot be bound.
  static absl::StatusOr<std::unique_ptr<KilnServer>> Start(const ServerOptions& options,
                                                           cache::ArtifactStore& store,
                                                           compiler::ToolchainRegistry& toolchains,
                                                           CompileCoordinator& coordinator);
  ~KilnServer();

  // The bound TCP port, or 0 without a TCP listener.
  int tcp_port() const { return tcp_port_; }
  // The statistics as a Prometheus page (metrics_listen).
  absl::StatusOr<std::string> MetricsText() const { return service_->MetricsText(); }
  // How long no call has been in progress (exit_when_idle_seconds).
  absl::Duration IdleAt(absl::Time now) const { return service_->IdleAt(now); }
  // gRPC targets clients can use, e.g. "unix:/run/user/1000/kiln/kilnd.sock".
  const std::vector<std::string>& endpoints() const { return endpoints_; }

  // Reports NOT_SERVING, stops accepting calls, lets in-flight calls finish
  // for up to `grace`, then cancels the rest. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  KilnServer() = default;

  std::unique_ptr<KilnService> service_;
  std::unique_ptr<BundleSubscriptions> subscriptions_;  // uses service_: goes first
  std::shared_ptr<ConnectionCap> connection_cap_;  // with tcp_address
  std::unique_ptr<grpc::Server> server_;
  std::string socket_path_;
  std::string endpoint_file_;
  std::vector<std::string> endpoints_;
  int tcp_port_ = 0;
  bool shut_down_ = false;
};

}  // namespace kiln::service

#endif  // KILN_SERVICE_SERVER_H_
