#ifndef KILN_SERVICE_CONFIG_H_
#define KILN_SERVICE_CONFIG_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/platform.h"

namespace kiln::service {

// Everything kilnd's behaviour depends on. Every field has one name, used both
// as `name = value` in the config file and as `--name=value` on the command
// line (underscores or dashes), where the flag wins.
struct Config {
  // Whom this kilnd serves; picks the defaults of the paths below.
  platform::Scope scope = platform::Scope::kUser;
  std::filesystem::path data_dir;
  std::filesystem::path log_dir;  // empty: data_dir/logs
  // The per-user local socket; "none" disables it (the default on Windows).
  std::string local_socket;
  // A group whose members may connect to local_socket (POSIX; empty: only
  // kilnd's own account may).
  std::string local_socket_group;
  // Where kilnd writes the loopback port and access token local clients use
  // (the Windows transport); "none" disables that listener (the POSIX default).
  std::string endpoint_file;
  int local_port = 0;  // port of that listener; 0 picks a free one
  // Accounts besides kilnd's own that may read the endpoint file (Windows).
  std::vector<std::string> allowed_users;
  // Optional TCP listener: "PORT" (loopback) or "HOST:PORT". Empty: no TCP.
  std::string tcp_listen;
  // Prometheus metrics over HTTP at /metrics: "PORT" (loopback) or "HOST:PORT";
  // empty: none. Another machine's address needs allow_remote.
  std::string metrics_listen;
  // A tcp_listen address off this machine is refused unless this is true,
  // TLS is set and clients must prove who they are (see ValidateConfig).
  bool allow_remote = false;
  // TLS on the tcp_listen listener: PEM files of its certificate chain and key.
  std::string tls_cert;
  std::string tls_key;
  // PEM CA bundle: clients may (with client_tokens) or must present a
  // certificate it signed; the certificate's common name is the tenant.
  std::string tls_client_ca;
  // File of "TENANT SHA256-HEX-OF-TOKEN" lines: a client sending one of those
  // tokens (authorization: Bearer TOKEN) is that tenant. Reread when changed.
  std::string client_tokens;
  // File of PEM Ed25519 public keys: bundles signed by one of them import as
  // they are (but for native code); others bring only kernels kilnd compiles.
  // Read at each import.
  std::string trusted_bundle_keys;
  // Bundles kilnd imports by itself and keeps up to date (bundle_subscription.h):
  // OCI references and absolute directories, checked at start and then
  // every bundle_refresh.
  std::vector<std::string> bundle_sources;
  int bundle_refresh_seconds = 3600;
  // This machine's GPU targets ("cuda:89"): what a bundle index is taken
  // for. Empty: those nvidia-smi names, asked when first needed.
  std::vector<std::string> gpu_targets;
  // Connections to kilnd with no call in progress for this long are closed
  // (some after half of it; clients connect again when they next call), and
  // at most this many are open on the tcp_listen listener at once; more are
  // refused (POSIX only: connection_cap.h). Both apply only with tcp_listen.
  int tcp_idle_seconds = 300;
  int tcp_max_connections = 4096;
  // Compiles of one tenant running at once; 0: half of compile_workers.
  int tenant_compiles = 0;
  // Bytes one tenant's entries may hold; 0: a quarter of max_cache_size.
  uint64_t tenant_max_size = 0;
  uint64_t max_cache_size = 10ull << 30;
  // The fleet's shared cache of compile results and launchers (shared_tier.h):
  // redis://[:PASSWORD@]HOST[:PORT][/DB]; empty: none. Keys start with redis_prefix.
  std::string redis_url;
  std::string redis_prefix = "kiln:";
  // A file holding the fleet's secret, which signs its Redis entries; empty: unsigned.
  std::string redis_secret_file;
  uint64_t max_request_size = 64ull << 20;
  uint64_t inline_threshold = 0;  // 0: the store's measured default
  int zstd_level = 1;
  // Python interpreters with triton installed, registered at start.
  std::vector<std::string> toolchains;
  int compile_workers = 0;  // per toolchain; 0 = CPU count
  int compile_timeout_seconds = 600;
  int worker_idle_seconds = 600;
  int exit_when_idle_seconds = 0;  // 0: never
  int claim_timeout_seconds = 60;
  std::string launcher_cc;         // C compiler for launcher builds; empty = discover
  std::filesystem::path worker_script;  // empty = kiln_worker.py beside kilnd
  std::string log_level = "info";
  // Not a setting: a Windows service has no console, only its log file.
  bool log_to_console = true;
  uint64_t log_file_size = 10ull << 20;
  int log_files = 3;
};

enum class Command {
  kServe,
  kStats,
  kHelp,
  kVersion,
  // Windows Service Control Manager: kilnd install|uninstall|start|stop|status.
  kInstall,
  kUninstall,
  kStart,
  kStop,
  kStatus,
};

struct CommandLine {
  Command command = Command::kServe;
  Config config;
  std::filesystem::path config_file;  // empty when none was read
  bool json = false;                  // --stats --json
  // Serve as a Windows service (the SCM started us: kilnd install puts this
  // flag in the service's command line).
  bool windows_service = false;
  // kilnd install: the account the service runs as, and its password (only
  // for a real user account; built-in and virtual accounts have none).
  std::string service_account;
  std::string service_password;
};

// Defaults for `scope`: data, log and runtime directories, local transport.
Config DefaultConfig(platform::Scope scope = platform::Scope::kUser);

// Applies `name = value` lines (# comments, blank lines) from `text`.
// INVALID_ARGUMENT names the file, line and problem.
absl::Status ApplyConfigText(absl::string_view text, absl::string_view origin, Config& config);

// Parses kilnd's arguments: reads --config FILE (or the default config file if
// present), then applies the other flags on top.
absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args);

// Checks the combination: e.g. a non-loopback TCP address without allow_remote.
absl::Status ValidateConfig(const Config& config);

// Creates data_dir and log_dir when missing and checks that kilnd may write in
// each, before kilnd opens its log, lock file or database there (whose own
// errors would name those files, not the setting to change).
// FAILED_PRECONDITION names the setting, the path, what is wrong and the fix.
absl::Status PrepareDataDirectories(const Config& config);

// "127.0.0.1:PORT" for a bare port; otherwise the address unchanged.
std::string NormalizeTcpAddress(absl::string_view address);

std::string UsageText();

}  // namespace kiln::service

#endif  // KILN_SERVICE_CONFIG_H_
