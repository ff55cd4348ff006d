// kilnd: the Kiln service. Serves until SIGTERM/SIGINT (Ctrl+C, or the
// service's stop control on Windows), then finishes in-flight requests and
// closes the database.

#include <algorithm>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/synchronization/notification.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/subprocess.h"
#include "compiler/launcher_builder.h"
#include "compiler/toolchains.h"
#include "service/bundle_subscription.h"
#include "service/compile_coordinator.h"
#include "cache/artifact_store.h"
#include "cache/redis/redis_tier.h"
#include "common/fmt_absl.h"
#include "common/platform.h"
#include "common/status_macros.h"
#include "kiln/client.h"
#include "service/config.h"
#include "service/metrics_server.h"
#include "service/server.h"
#include "service/service_host.h"
#include "spdlog/sinks/rotating_file_sink.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace {

namespace fs = std::filesystem;
using kiln::service::Config;

// In-flight requests get this long to finish after a stop request: a stop
// takes seconds at most (systemd and Windows' service manager kill a service
// that takes longer), and compiles are abandoned rather than waited for.
constexpr absl::Duration kShutdownGrace = absl::Seconds(1);

// Finds the C compilers that launcher builds use, for the coordinator, and
// again whenever a toolchain registers later: Triton for Windows bundles
// TinyCC, and a toolchain probed in the background is known only once its
// probe ends.
class LauncherCompilers {
 public:
  LauncherCompilers(const Config& config, kiln::service::CompileCoordinator& coordinator)
      : config_(config), coordinator_(coordinator) {}

  // A toolchain probed in the background: its Triton may bring a compiler.
  void ExpectToolchain() {
    std::lock_guard lock(mutex_);
    ++toolchains_expected_;
  }
  void ToolchainRegistered(const absl::StatusOr<kiln::compiler::ToolchainInfo>& info) {
    std::lock_guard lock(mutex_);
    --toolchains_expected_;
    if (info.ok()) triton_dirs_.push_back(info->triton_dir);
    if (started_) FindLocked();
  }

  // Finds them for the first time, with the toolchains registered so far.
  void Start() {
    std::lock_guard lock(mutex_);
    started_ = true;
    FindLocked();
  }

 private:
  void FindLocked() {
    absl::StatusOr<kiln::compiler::BuildEnvironment> environment =
        kiln::compiler::DiscoverBuildEnvironment(
            config_.launcher_cc,
            {kiln::platform::KilnPythonDir(config_.scope), kiln::ExecutableDir() / "python"},
            triton_dirs_);
    if (!environment.ok()) {
      if (toolchains_expected_ > 0) {
        spdlog::info("launcher builds wait for the toolchains being probed: {}",
                     environment.status().message());
      } else {
        spdlog::warn("launcher builds disabled: {}", environment.status().message());
      }
      coordinator_.UseLauncherBuilder(nullptr, environment.status());
      return;
    }
    for (const kiln::compiler::CCompiler& compiler : environment->compilers) {
      spdlog::info("launcher builds may use {} ({})", compiler.path.string(), compiler.version);
    }
    coordinator_.UseLauncherBuilder(
        std::make_unique<kiln::compiler::LauncherBuilder>(
            *std::move(environment), absl::Seconds(config_.compile_timeout_seconds)),
        absl::OkStatus());
  }

  const Config& config_;
  kiln::service::CompileCoordinator& coordinator_;
  std::mutex mutex_;
  std::vector<fs::path> triton_dirs_;  // guarded by mutex_
  int toolchains_expected_ = 0;        // guarded by mutex_
  bool started_ = false;               // guarded by mutex_
};

absl::Status ConfigureLogging(const Config& config) {
  const spdlog::level::level_enum level = spdlog::level::from_str(config.log_level);
  if (level == spdlog::level::off && config.log_level != "off") {
    return absl::InvalidArgumentError(
        "log_level must be one of trace, debug, info, warn, error, critical, off");
  }
  std::vector<spdlog::sink_ptr> sinks;
  if (config.log_to_console) sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  const fs::path log_file = config.log_dir / "kilnd.log";
  try {
    sinks.push_back(std::make_shared<spdlog::sinks::rotating_file_sink_mt>(
        log_file.string(), config.log_file_size, static_cast<size_t>(config.log_files)));
  } catch (const spdlog::spdlog_ex& error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open log file ", log_file.string(), ": ", error.what()));
  }
  auto logger = std::make_shared<spdlog::logger>("kilnd", sinks.begin(), sinks.end());
  logger->set_level(level);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

// Owns everything that must be gone before the data-dir lock is released.
// The fleet's secret for signing Redis entries (empty without a file). Short
// secrets are refused: the signature is only as strong as the secret.
absl::StatusOr<std::string> ReadFleetSecret(const std::string& path) {
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> content = kiln::platform::ReadWholeFile(path);
  if (!content.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot read redis_secret_file %s: %s", path, content.status().message()));
  }
  const std::string secret(absl::StripAsciiWhitespace(*content));
  constexpr size_t kMinimum = 32;
  if (secret.size() < kMinimum) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "redis_secret_file %s holds %d bytes; a fleet's secret needs at least %d (make one with "
        "`openssl rand -hex 32 > %s` and give every kilnd of the fleet the same file)",
        path, secret.size(), kMinimum, path));
  }
  return secret;
}

absl::Status ServeWithLock(const Config& config, kiln::platform::ShutdownSignals& signals,
                           const std::function<void()>& ready) {
  kiln::cache::StoreOptions store_options;
  store_options.data_dir = config.data_dir;
  store_options.max_size_bytes = config.max_cache_size;
  // A farm tenant can then evict only its own entries (as long as the caps of
  // the tenants at work fit max_cache_size together).
  store_options.capped_domain_prefix = std::string(kiln::service::kTenantDomainPrefix);
  store_options.max_domain_bytes =
      config.tenant_max_size > 0 ? config.tenant_max_size : config.max_cache_size / 4;
  store_options.zstd_level = config.zstd_level;
  if (config.inline_threshold > 0) store_options.inline_threshold_bytes = config.inline_threshold;
  store_options.served_file_readers = config.allowed_users;
  // Served files are for kilnd's own account, whose calls come as kLocalDomain.
  store_options.served_namespace_prefix =
      kiln::service::ScopedNamespace({std::string(kiln::service::kLocalDomain), true}, "");
  ASSIGN_OR_RETURN(std::unique_ptr<kiln::cache::ArtifactStore> store,
                   kiln::cache::ArtifactStore::Open(store_options));

  kiln::compiler::PoolOptions pool_options;
  pool_options.worker_script = config.worker_script.empty()
                                   ? kiln::ExecutableDir() / "kiln_worker.py"
                                   : config.worker_script;
  pool_options.max_workers = config.compile_workers;
  pool_options.job_timeout = absl::Seconds(config.compile_timeout_seconds);
  pool_options.idle_timeout = absl::Seconds(config.worker_idle_seconds);
  if (!fs::exists(pool_options.worker_script)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "compile worker script ", pool_options.worker_script.string(),
        " is missing; reinstall kilnd or set worker_script"));
  }
  kiln::compiler::ToolchainRegistry toolchains(pool_options,
                                               config.data_dir / "toolchain-probes");
  const int workers = config.compile_workers > 0
                          ? config.compile_workers
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Threads beyond the workers let cache hits and joins proceed while every
  // worker is busy.
  std::unique_ptr<kiln::cache::SharedTier> shared_tier;
  if (!config.redis_url.empty()) {
    kiln::cache::RedisOptions redis;
    redis.url = config.redis_url;
    redis.prefix = config.redis_prefix;
    ASSIGN_OR_RETURN(redis.secret, ReadFleetSecret(config.redis_secret_file));
    ASSIGN_OR_RETURN(shared_tier, kiln::cache::OpenRedisTier(redis));
    spdlog::info("compile results and launchers shared through Redis (keys {}*, {})",
                 config.redis_prefix,
                 redis.secret.empty() ? "entries unsigned: set redis_secret_file" : "entries signed");
  }
  kiln::service::CompileCoordinator coordinator(
      *store, toolchains, nullptr, absl::UnavailableError("kilnd is still starting"),
      std::max(8, 4 * workers), shared_tier.get(), absl::Seconds(config.compile_timeout_seconds));
  LauncherCompilers launcher_compilers(config, coordinator);
  // Probes under way end, and their callbacks (which use the two above),
  // before those go, however this returns.
  struct StopWorkersAtReturn {
    kiln::compiler::ToolchainRegistry& toolchains;
    ~StopWorkersAtReturn() { toolchains.StopWorkers(); }
  } stop_workers_at_return{toolchains};
  // A toolchain probed at an earlier start registers at once; another is
  // probed in the background, so that kilnd serves at once (a client's
  // compile meanwhile runs in the client, as stock Triton's).
  // Each interpreter once: a second registration of one under way would wait for nothing.
  std::vector<fs::path> configured;
  for (const std::string& python : config.toolchains) {
    const fs::path normal = fs::path(python).lexically_normal();
    if (std::find(configured.begin(), configured.end(), normal) == configured.end()) {
      configured.push_back(normal);
    }
  }
  for (const fs::path& python : configured) {
    launcher_compilers.ExpectToolchain();
    const bool registered = toolchains.RegisterInBackground(
        python, "", [python, &launcher_compilers](const auto& info) {
          if (info.ok()) {
            spdlog::info("toolchain: triton {} at {}{}", info->triton_version,
                         info->python_executable,
                         info->remembered ? " (as probed at an earlier start)" : "");
          } else {
            spdlog::error("toolchain {} not registered: {}", python.string(),
                          info.status().message());
          }
          launcher_compilers.ToolchainRegistered(info);
        });
    if (!registered) spdlog::info("toolchain {}: probing it in the background", python.string());
  }
  launcher_compilers.Start();

  kiln::service::ServerOptions server_options;
  server_options.claim_limits = {absl::Seconds(config.claim_timeout_seconds),
                                 absl::Seconds(config.compile_timeout_seconds)};
  if (config.local_socket != "none") {
    server_options.local_socket = config.local_socket;
    server_options.local_socket_group = config.local_socket_group;
  }
  if (config.endpoint_file != "none") {
    server_options.endpoint_file = config.endpoint_file;
    server_options.local_port = config.local_port;
    server_options.endpoint_readers = config.allowed_users;
  }
  if (!config.tcp_listen.empty()) {
    server_options.tcp_address = kiln::service::NormalizeTcpAddress(config.tcp_listen);
    server_options.tls_cert = config.tls_cert;
    server_options.tls_key = config.tls_key;
    server_options.tls_client_ca = config.tls_client_ca;
    server_options.client_tokens = config.client_tokens;
    server_options.tcp_idle_limit = absl::Seconds(config.tcp_idle_seconds);
    server_options.tcp_max_connections = config.tcp_max_connections;
    // Half the workers by default: another tenant always finds one free.
    server_options.compiles_per_tenant =
        config.tenant_compiles > 0 ? config.tenant_compiles : std::max(1, workers / 2);
  }
  server_options.trusted_bundle_keys = config.trusted_bundle_keys;
  server_options.bundle_sources = config.bundle_sources;
  server_options.bundle_refresh = absl::Seconds(config.bundle_refresh_seconds);
  server_options.gpu_targets = config.gpu_targets;
  server_options.max_request_size = config.max_request_size;
  server_options.data_dir = config.data_dir.string();
  server_options.served_files_dir = store->served_files_dir().string();
  ASSIGN_OR_RETURN(std::unique_ptr<kiln::service::KilnServer> server,
                   kiln::service::KilnServer::Start(server_options, *store, toolchains,
                                                    coordinator));
  spdlog::info("kilnd {} serving on {} (data dir {}, cache cap {} bytes)", KILN_VERSION,
               absl::StrJoin(server->endpoints(), ", "), config.data_dir.string(),
               config.max_cache_size);
  if (!server_options.endpoint_file.empty()) {
    spdlog::info("local clients find the port and access token in {}",
                 server_options.endpoint_file);
  }
  std::unique_ptr<kiln::service::MetricsServer> metrics;
  if (!config.metrics_listen.empty()) {
    const std::string address = kiln::service::NormalizeTcpAddress(config.metrics_listen);
    ASSIGN_OR_RETURN(metrics, kiln::service::MetricsServer::Start(
                                  address, [&server] { return server->MetricsText(); }));
    spdlog::info("metrics at http://{}:{}/metrics", address.substr(0, address.rfind(':')),
                 metrics->port());
  }
  ready();

  // A kilnd started for one user (the client's autostart) stops once idle.
  absl::Notification stopping;
  std::thread idle_watch;
  if (config.exit_when_idle_seconds > 0) {
    const absl::Duration limit = absl::Seconds(config.exit_when_idle_seconds);
    idle_watch = std::thread([&] {
      while (!stopping.WaitForNotificationWithTimeout(std::min(limit / 4, absl::Seconds(1)))) {
        if (server->IdleAt(absl::Now()) >= limit) {
          signals.Request(absl::StrFormat("no call for %d s (exit_when_idle_seconds)",
                                          config.exit_when_idle_seconds));
          return;
        }
      }
    });
  }
  const std::string signal_name = signals.Wait();
  // Eviction, sweeps and verification end at their next step, and compiles
  // are abandoned: a stop must not wait for them.
  store->RequestStop();
  coordinator.RequestStop();
  stopping.Notify();
  if (idle_watch.joinable()) idle_watch.join();
  spdlog::info("{} received: finishing in-flight requests", signal_name);
  metrics.reset();
  server->Shutdown(kShutdownGrace);
  server.reset();
  return absl::OkStatus();  // then the coordinator drains, workers exit, the store closes
}

absl::Status Serve(const Config& config, kiln::platform::ShutdownSignals& signals,
                   const std::function<void()>& ready) {
  RETURN_IF_ERROR(kiln::service::ValidateConfig(config));
  for (const std::string& source : config.bundle_sources) {
    if (std::string problem = kiln::service::BundleSourceProblem(source); !problem.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("bundle_sources: ", problem));
    }
  }
  RETURN_IF_ERROR(kiln::service::PrepareDataDirectories(config));
  RETURN_IF_ERROR(ConfigureLogging(config));
  ASSIGN_OR_RETURN(auto lock, kiln::platform::TryLockFile(config.data_dir / "kilnd.lock"));
  RETURN_IF_ERROR(ServeWithLock(config, signals, ready));
  spdlog::info("kilnd stopped cleanly");
  return absl::OkStatus();
}

int PrintStats(const kiln::service::CommandLine& command_line) {
  kiln::ClientOptions options;
  if (!command_line.config.tcp_listen.empty()) {
    options.endpoint = kiln::service::NormalizeTcpAddress(command_line.config.tcp_listen);
  } else if (command_line.config.local_socket != "none") {
    options.endpoint = "unix:" + command_line.config.local_socket;
  } else if (command_line.config.endpoint_file != "none") {
    options.endpoint_file = command_line.config.endpoint_file;
  }
  kiln::Client client(options);
  absl::StatusOr<kiln::v1::GetStatsResponse> stats = client.Stats();
  if (!stats.ok()) {
    std::cerr << "kilnd: " << stats.status().message() << "\n";
    return 3;
  }
  std::cout << (command_line.json ? kiln::FormatStatsJson(*stats) : kiln::FormatStats(*stats));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // First, before any thread exists, so only the waiting thread sees stop signals.
  kiln::platform::ShutdownSignals signals;
  absl::StatusOr<kiln::service::CommandLine> command_line =
      kiln::service::ParseCommandLine(std::vector<std::string>(argv + 1, argv + argc));
  if (!command_line.ok()) {
    std::cerr << "kilnd: " << command_line.status().message() << "\n";
    return 2;
  }
  switch (command_line->command) {
    case kiln::service::Command::kHelp:
      std::cout << kiln::service::UsageText();
      return 0;
    case kiln::service::Command::kVersion:
      std::cout << "kilnd " << KILN_VERSION << "\n";
      return 0;
    case kiln::service::Command::kStats:
      return PrintStats(*command_line);
    case kiln::service::Command::kInstall:
    case kiln::service::Command::kUninstall:
    case kiln::service::Command::kStart:
    case kiln::service::Command::kStop:
    case kiln::service::Command::kStatus:
      return kiln::service::RunServiceCommand(*command_line);
    case kiln::service::Command::kServe:
      break;
  }
  if (command_line->windows_service) {
    command_line->config.log_to_console = false;
    return kiln::service::RunAsService(*command_line, signals, Serve);
  }
  if (absl::Status status = Serve(command_line->config, signals, [] {}); !status.ok()) {
    spdlog::critical("kilnd cannot start: {}", status.message());
    return 1;
  }
  return 0;
}
