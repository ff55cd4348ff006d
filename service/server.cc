#include "service/server.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fmt_absl.h"
#include "common/platform.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "service/bundle_import.h"
#include "grpcpp/server_builder.h"
#include "service/malformed_requests.h"
#include "spdlog/spdlog.h"

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

// 32 random bytes as hex: what a local client proves it could read the
// endpoint file with.
std::string NewAccessToken() {
  std::random_device random;  // the OS's CSPRNG (getrandom, RtlGenRandom)
  std::string token;
  for (int i = 0; i < 8; ++i) absl::StrAppend(&token, absl::Hex(random(), absl::kZeroPad8));
  return token;
}

// Refuses to take over the endpoint file of a kilnd that still answers there.
absl::Status PrepareEndpointFile(const fs::path& path, const std::vector<std::string>& readers) {
  RETURN_IF_ERROR(platform::EnsurePrivateDirectory(path.parent_path(), readers));
  std::ifstream in(path);
  std::string address;
  if (in && std::getline(in, address) && !address.empty()) {
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    if (channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::milliseconds(300))) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "another kilnd is already serving at %s (from %s); stop it or set endpoint_file",
          address, path.string()));
    }
  }
  return absl::OkStatus();
}

// Replaces the file at `path` with `content` whole, so a client never reads half of it.
absl::Status ReplaceFile(const fs::path& path, absl::string_view content) {
  const fs::path temp = path.string() + ".tmp";
  std::error_code ignored;
  fs::remove(temp, ignored);
  RETURN_IF_ERROR(platform::WriteFileDurably(temp, content));
  absl::StatusOr<platform::Replaced> replaced = platform::MoveFileOver(temp, path);
  if (!replaced.ok()) return replaced.status();
  if (*replaced == platform::Replaced::kTargetInUse) {
    fs::remove(temp, ignored);
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot replace %s: another process holds it open; close it and start kilnd again",
        path.string()));
  }
  return absl::OkStatus();
}

absl::Status WriteEndpointFile(const fs::path& path, int port, const std::string& token) {
  return ReplaceFile(path, absl::StrCat("127.0.0.1:", port, "\n", token, "\n"));
}

// Tells local clients where kilnd's served files are: "<endpoint>.files"
// beside the socket or endpoint file, in the same private directory, holding
// the directory's path. Clients read it without a call (ServedFilesPointer).
absl::Status WriteServedFilesPointer(const std::string& endpoint, const std::string& dir) {
  return ReplaceFile(ServedFilesPointer(endpoint), absl::StrCat(dir, "\n"));
}

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view setting) {
  absl::StatusOr<std::string> pem = platform::ReadWholeFile(path);
  if (!pem.ok() || pem->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s %s is not a readable PEM file; check the path and that kilnd's account may read it",
        setting, path));
  }
  return pem;
}

// The credentials of the tcp_address listener: TLS when a certificate is set.
// A client certificate is asked for and, when sent, must be signed by the
// client CA; one without is still let through the handshake, so that a
// token can identify it instead or the refusal can say what to send.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(
    const ServerOptions& options) {
  if (options.tls_cert.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(options.tls_client_ca.empty()
                                            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                            : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.private_key, ReadPem(options.tls_key, "tls_key"));
  ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(options.tls_cert, "tls_cert"));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_client_ca.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(options.tls_client_ca, "tls_client_ca"));
  }
  return grpc::SslServerCredentials(ssl);
}

// A TLS handshake and HTTP/2's preface take milliseconds; a peer that has not
// finished them by then is not a client.
constexpr absl::Duration kHandshakeLimit = absl::Seconds(20);

int Millis(absl::Duration duration) {
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(duration),
                                            std::numeric_limits<int>::max()));
}

// The port of "HOST:PORT"; 0 when the system picks it.
int ExplicitPort(const std::string& address) {
  int port = 0;
  if (!absl::SimpleAtoi(absl::string_view(address).substr(address.rfind(':') + 1), &port)) return 0;
  return port;
}

// Bounds what peers that connect and never call can hold: each connection is
// closed once no call has been in progress for the idle limit (gRPC's server
// idle timer starts when a connection is set up, so one that never calls goes
// too), one that has not finished TLS and HTTP/2's preface sooner, and
// connections past the cap are refused as they come. The arguments are the
// server's, so local clients' idle connections close too: their channels
// connect again on their next call, as after any disconnection.
void LimitTcpConnections(const ServerOptions& options, std::shared_ptr<ConnectionCap> cap,
                         grpc::ServerBuilder& builder) {
  // gRPC's idle timer ticks once a period and closes a connection at a tick
  // that finds no call since the last one: between one and two periods after
  // its last call (one for a connection that never called, in gRPC 1.51). A
  // period of half the limit keeps the limit a bound.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             std::max(1, Millis(options.tcp_idle_limit / 2)));
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             Millis(std::min(kHandshakeLimit, options.tcp_idle_limit)));
  cap->SetPort(ExplicitPort(options.tcp_address));  // or, when 0, once the server has started
  InstallConnectionCap(std::move(cap), builder);
  if (!ConnectionCap::kEnforced) {
    spdlog::info("tcp_max_connections is not enforced on this platform (its gRPC gives kilnd no "
                 "hook on accepted connections); idle ones still close after tcp_idle_seconds");
  }
}

// Clients check that kilnd still answers a call that waits (a compile, a
// claim) with HTTP/2 PINGs: the Python client's own transport once a call has
// been quiet for 2 s, gRPC keepalive every 2 s on a farm's. gRPC's default
// policy takes a PING less than 5 minutes after another, with no data sent
// between, for abuse, and after two such closes the connection: every compile
// longer than a few seconds would fail. A PING a second is what kilnd allows;
// more often is still abuse. Without calls, gRPC allows one each 2 hours.
void AllowLivenessPings(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
}

}  // namespace

fs::path ServedFilesPointer(const std::string& endpoint) { return endpoint + ".files"; }

absl::StatusOr<std::unique_ptr<KilnServer>> KilnServer::Start(
    const ServerOptions& options, cache::ArtifactStore& store,
    compiler::ToolchainRegistry& toolchains, CompileCoordinator& coordinator) {
  std::unique_ptr<KilnServer> server(new KilnServer());
  TcpAccess tcp_access;
  tcp_access.tokenless_allowed = !options.tcp_address.empty();
  tcp_access.tls = !options.tls_cert.empty();
  tcp_access.client_certificates = !options.tls_client_ca.empty();
  tcp_access.compiles_per_tenant = options.compiles_per_tenant;
  if (!options.client_tokens.empty()) {
    ASSIGN_OR_RETURN(tcp_access.client_tokens, ClientTokens::Load(options.client_tokens));
  }
  ASSIGN_OR_RETURN(const std::shared_ptr<grpc::ServerCredentials> tcp_credentials,
                   TcpCredentials(options));
  if (!options.endpoint_file.empty()) {
    RETURN_IF_ERROR(PrepareEndpointFile(options.endpoint_file, options.endpoint_readers));
    tcp_access.token = NewAccessToken();
    tcp_access.endpoint_file = options.endpoint_file;
  }
  if (!options.tcp_address.empty()) {
    server->connection_cap_ = std::make_shared<ConnectionCap>(options.tcp_max_connections);
    tcp_access.connection_cap = server->connection_cap_;
  }
  server->service_ = std::make_unique<KilnService>(
      store, toolchains, coordinator, options.data_dir, options.claim_limits, tcp_access);
  server->service_->set_trusted_bundle_keys(options.trusted_bundle_keys);
  if (!options.data_dir.empty()) {
    // Bundles a kilnd that stopped was receiving (their imports stored nothing that stays).
    std::error_code error;
    std::filesystem::remove_all(ImportsDir(options.data_dir), error);
  }
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
    LimitTcpConnections(options, server->connection_cap_, builder);
    builder.AddListeningPort(options.tcp_address, tcp_credentials, &server->tcp_port_);
  }
  int local_port = 0;
  if (!options.endpoint_file.empty()) {
    // Loopback only: the token listener is never reachable from other machines.
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", options.local_port),
                             grpc::InsecureServerCredentials(), &local_port);
  }
  // Oversized requests are refused by gRPC itself with RESOURCE_EXHAUSTED.
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<uint64_t>(options.max_request_size, std::numeric_limits<int>::max())));
  builder.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  AnswerMalformedRequestsWithInvalidArgument(builder);
  AllowLivenessPings(builder);
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot listen on %s%s; is the address in use or not local?",
        options.local_socket.empty() ? "" : absl::StrCat("unix:", options.local_socket, " "),
        options.tcp_address));
  }
  if (!options.local_socket_group.empty()) {
    RETURN_IF_ERROR(platform::ShareLocalSocket(options.local_socket, options.local_socket_group));
  }
  if (!options.tcp_address.empty()) {
    server->connection_cap_->SetPort(server->tcp_port_);
    const std::string host = options.tcp_address.substr(0, options.tcp_address.rfind(':'));
    server->endpoints_.push_back(absl::StrCat(host, ":", server->tcp_port_));
  }
  if (!options.endpoint_file.empty()) {
    if (local_port == 0) {
      return absl::UnavailableError(absl::StrFormat(
          "cannot listen on 127.0.0.1:%d for local clients; is the port in use? set local_port",
          options.local_port));
    }
    RETURN_IF_ERROR(WriteEndpointFile(options.endpoint_file, local_port, tcp_access.token));
    server->endpoint_file_ = options.endpoint_file;
    server->endpoints_.push_back(absl::StrCat("127.0.0.1:", local_port));
  }
  if (!options.served_files_dir.empty()) {
    for (const std::string* endpoint : {&server->socket_path_, &server->endpoint_file_}) {
      if (endpoint->empty()) continue;
      if (absl::Status status = WriteServedFilesPointer(*endpoint, options.served_files_dir);
          !status.ok()) {
        // Clients then ask kilnd for every hit: slower, never wrong.
        spdlog::warn("local clients will not find served files: {}", status.message());
      }
    }
  }
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  KilnService* service = server->service_.get();
  server->subscriptions_ = std::make_unique<BundleSubscriptions>(BundleSubscriptionOptions{
      .sources = options.bundle_sources,
      .refresh = options.bundle_refresh,
      .data_dir = options.data_dir,
      .gpu_targets = options.gpu_targets,
      .triton_versions =
          [&toolchains]() -> std::optional<std::vector<std::string>> {
            if (toolchains.AnyProbeUnderWay()) return std::nullopt;
            std::vector<std::string> versions;
            for (const compiler::ToolchainInfo& info : toolchains.List()) versions.push_back(info.triton_version);
            return versions;
          },
      .import = [service](const std::filesystem::path& file) { return service->ImportBundleAsOwner(file); },
  });
  service->set_subscriptions(server->subscriptions_.get());
  return server;
}

void KilnServer::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->SetServingStatus(false);
  if (subscriptions_ != nullptr) subscriptions_->Stop();
  service_->ReleaseWaitingLookups();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
  std::error_code ignored;
  for (const std::string& endpoint : {socket_path_, endpoint_file_}) {
    if (endpoint.empty()) continue;
    // Clients then fail fast (or start a kilnd) instead of trying a dead
    // endpoint, and stop reading this kilnd's served files.
    fs::remove(endpoint, ignored);
    fs::remove(ServedFilesPointer(endpoint), ignored);
  }
}

KilnServer::~KilnServer() { Shutdown(absl::ZeroDuration()); }

}  // namespace kiln::service
