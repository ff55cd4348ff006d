#include "service/config.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <random>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/time/time.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"
#include "common/platform.h"
#include "common/status_macros.h"

namespace kiln::service {
namespace {

using Setter = std::function<absl::Status(absl::string_view value, Config& config)>;

struct Setting {
  absl::string_view name;
  absl::string_view help;
  Setter apply;
};

Setter ByteSize(uint64_t Config::*field) {
  return [field](absl::string_view value, Config& config) -> absl::Status {
    ASSIGN_OR_RETURN(config.*field, ParseByteSize(value));
    return absl::OkStatus();
  };
}

Setter Text(std::string Config::*field) {
  return [field](absl::string_view value, Config& config) {
    config.*field = std::string(value);
    return absl::OkStatus();
  };
}

Setter Integer(int Config::*field, int min, int max) {
  return [field, min, max](absl::string_view value, Config& config) {
    int number = 0;
    if (!absl::SimpleAtoi(value, &number) || number < min || number > max) {
      return absl::InvalidArgumentError(
          absl::StrFormat("'%s' is not a whole number from %d to %d", value, min, max));
    }
    config.*field = number;
    return absl::OkStatus();
  };
}

Setter Boolean(bool Config::*field) {
  return [field](absl::string_view value, Config& config) {
    if (!absl::SimpleAtob(value, &(config.*field))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("'%s' is not a boolean; use true or false", value));
    }
    return absl::OkStatus();
  };
}

const std::vector<Setting>& Settings() {
  static const auto* settings = new std::vector<Setting>{
      {"data_dir", "directory of the cache database and blobs",
       [](absl::string_view value, Config& config) {
         config.data_dir = std::filesystem::path(std::string(value));
         return absl::OkStatus();
       }},
      {"log_dir", "directory of the rotating log files (default: DATA_DIR/logs)",
       [](absl::string_view value, Config& config) {
         config.log_dir = std::filesystem::path(std::string(value));
         return absl::OkStatus();
       }},
      {"local_socket", "path of the per-user Unix socket, or 'none'", Text(&Config::local_socket)},
      {"local_socket_group",
       "Linux: a group whose members may use local_socket (a machine kilnd's users)",
       Text(&Config::local_socket_group)},
      {"endpoint_file",
       "where to write the 127.0.0.1 port and access token for local clients, or 'none'",
       Text(&Config::endpoint_file)},
      {"local_port", "port of the endpoint_file listener on 127.0.0.1, 0 for any free one (0)",
       Integer(&Config::local_port, 0, 65535)},
      {"allowed_user", "Windows: an account that may use a machine kilnd (repeatable)",
       [](absl::string_view value, Config& config) {
         config.allowed_users.emplace_back(value);
         return absl::OkStatus();
       }},
      {"tcp_listen", "also listen on TCP: PORT (loopback) or HOST:PORT", Text(&Config::tcp_listen)},
      {"metrics_listen", "serve Prometheus metrics at http://ADDRESS/metrics: PORT (loopback) or HOST:PORT",
       Text(&Config::metrics_listen)},
      {"allow_remote",
       "permit a tcp_listen address other than loopback (needs TLS and client identity)",
       Boolean(&Config::allow_remote)},
      {"tls_cert", "PEM certificate chain of the tcp_listen listener (turns TLS on)",
       Text(&Config::tls_cert)},
      {"tls_key", "PEM private key of tls_cert", Text(&Config::tls_key)},
      {"tls_client_ca",
       "PEM CA bundle signing client certificates; a certificate's common name is its tenant",
       Text(&Config::tls_client_ca)},
      {"client_tokens", "file of 'TENANT SHA256-OF-TOKEN' lines: bearer tokens and their tenants",
       Text(&Config::client_tokens)},
      {"trusted_bundle_keys",
       "file of PEM Ed25519 public keys: bundles they signed import as they are; others "
       "bring only kernels kilnd compiles",
       Text(&Config::trusted_bundle_keys)},
      {"tcp_idle_seconds",
       "with tcp_listen: close connections with no call in progress for this long (some go "
       "after half of it), so that peers that never call free what they hold (300)",
       Integer(&Config::tcp_idle_seconds, 1, 86400)},
      {"tcp_max_connections",
       "connections the tcp_listen listener keeps open at once; more are closed as they "
       "connect (4096; not enforced on Windows)",
       Integer(&Config::tcp_max_connections, 1, 1 << 20)},
      {"tenant_compiles",
       "compiles of one tenant running at once, the rest queued; 0 for half the workers (0)",
       Integer(&Config::tenant_compiles, 0, 1024)},
      {"tenant_max_size",
       "bytes one tenant's entries may hold; its own least recently used go beyond it (0: a "
       "quarter of max_cache_size)",
       ByteSize(&Config::tenant_max_size)},
      {"redis_url",
       "redis://[:PASSWORD@]HOST[:PORT][/DB]: a cache of compile results shared by a fleet of "
       "kilnds",
       Text(&Config::redis_url)},
      {"redis_prefix", "the start of every key kilnd writes in Redis (kiln:)",
       Text(&Config::redis_prefix)},
      {"redis_secret_file",
       "a file holding the fleet's secret (32+ bytes, the same for every kilnd): Redis entries "
       "are signed with it, and unsigned ones are not served",
       Text(&Config::redis_secret_file)},
      {"max_cache_size", "evict least recently used entries above this size (10GiB)",
       ByteSize(&Config::max_cache_size)},
      {"max_request_size", "largest request accepted (64MiB)",
       ByteSize(&Config::max_request_size)},
      {"inline_threshold", "blobs smaller than this stay inside SQLite (48KiB)",
       ByteSize(&Config::inline_threshold)},
      {"zstd_level", "zstd level for stored blobs, 0 to store uncompressed (1)",
       Integer(&Config::zstd_level, 0, 19)},
      {"bundle_sources",
       "bundles to import and keep up to date: OCI references (REGISTRY/REPOSITORY:TAG) or "
       "absolute directories of .kilnbundle files, separated by commas (repeatable); imported "
       "under trusted_bundle_keys as `kiln import` would",
       [](absl::string_view value, Config& config) {
         for (absl::string_view source : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
           config.bundle_sources.emplace_back(absl::StripAsciiWhitespace(source));
         }
         return absl::OkStatus();
       }},
      {"bundle_refresh", "how often bundle_sources are checked: 90s, 30m, 1h or seconds (1h)",
       [](absl::string_view value, Config& config) {
         absl::Duration refresh;
         int seconds = 0;
         if (absl::SimpleAtoi(value, &seconds)) {
           refresh = absl::Seconds(seconds);
         } else if (!absl::ParseDuration(value, &refresh)) {
           return absl::InvalidArgumentError(
               absl::StrFormat("'%s' is not a duration; write 90s, 30m, 1h or a number of seconds", value));
         }
         if (refresh < absl::Seconds(1) || refresh > absl::Hours(24 * 7)) {
           return absl::InvalidArgumentError(
               absl::StrFormat("'%s' is not from 1s to 168h", value));
         }
         config.bundle_refresh_seconds = static_cast<int>(absl::ToInt64Seconds(refresh));
         return absl::OkStatus();
       }},
      {"gpu_targets",
       "this machine's GPU targets, e.g. cuda:89,cuda:90: which bundles of an index bundle_sources "
       "take (default: those nvidia-smi names)",
       [](absl::string_view value, Config& config) {
         for (absl::string_view target : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
           target = absl::StripAsciiWhitespace(target);
           const size_t colon = target.find(':');
           if (colon == absl::string_view::npos || colon == 0 || colon + 1 == target.size() ||
               !std::all_of(target.begin(), target.end(),
                            [](char c) { return absl::ascii_isalnum(c) || c == ':'; })) {
             return absl::InvalidArgumentError(
                 absl::StrFormat("'%s' is not a GPU target; write BACKEND:ARCH, e.g. cuda:89", target));
           }
           config.gpu_targets.emplace_back(target);
         }
         return absl::OkStatus();
       }},
      {"toolchain", "a Python with triton installed to compile with (repeatable)",
       [](absl::string_view value, Config& config) {
         config.toolchains.emplace_back(value);
         return absl::OkStatus();
       }},
      {"compile_workers", "worker processes per toolchain, 0 for the CPU count (0)",
       Integer(&Config::compile_workers, 0, 1024)},
      {"compile_timeout_seconds", "a compile job running longer is killed (600)",
       Integer(&Config::compile_timeout_seconds, 1, 86400)},
      {"claim_timeout_seconds",
       "a client that claimed a missing key and neither renews its claim nor starts compiling "
       "within this long is given up on by the clients waiting for it (60)",
       Integer(&Config::claim_timeout_seconds, 1, 86400)},
      {"worker_idle_seconds",
       "idle workers but the last of each toolchain exit after this long (600)",
       Integer(&Config::worker_idle_seconds, 1, 86400)},
      {"exit_when_idle_seconds",
       "stop after this long with no call in progress, 0 for never (0); the client "
       "starts its per-user kilnd with 1800, as sccache's server stops when idle",
       Integer(&Config::exit_when_idle_seconds, 0, 31536000)},
      {"launcher_cc", "C compiler for launcher modules (default: $CC, then tcc, gcc, clang)",
       Text(&Config::launcher_cc)},
      {"worker_script", "path of kiln_worker.py (default: beside kilnd)",
       [](absl::string_view value, Config& config) {
         config.worker_script = std::filesystem::path(std::string(value));
         return absl::OkStatus();
       }},
      {"log_level", "trace, debug, info, warn, error or off (info)", Text(&Config::log_level)},
      {"log_file_size", "rotate the log file at this size (10MiB)",
       ByteSize(&Config::log_file_size)},
      {"log_files", "rotated log files kept (3)", Integer(&Config::log_files, 1, 100)},
  };
  return *settings;
}

const Setting* FindSetting(absl::string_view name) {
  const std::string normalized = absl::StrReplaceAll(name, {{"-", "_"}});
  for (const Setting& setting : Settings()) {
    if (setting.name == normalized) return &setting;
  }
  return nullptr;
}

absl::Status ApplySetting(absl::string_view name, absl::string_view value,
                          absl::string_view origin, Config& config) {
  const Setting* setting = FindSetting(name);
  if (setting == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unknown setting '%s'; run kilnd --help for the list", origin, name));
  }
  absl::Status status = setting->apply(value, config);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s: %s", origin, setting->name, status.message()));
  }
  return absl::OkStatus();
}

absl::Status ReadConfigFile(const std::filesystem::path& path, Config& config) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot read config file %s; check the path given to --config", path.string()));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ApplyConfigText(text, path.string(), config);
}

bool IsLoopbackHost(absl::string_view host) {
  return host == "localhost" || host == "[::1]" || absl::StartsWith(host, "127.");
}

// Whether a listener setting (PORT or HOST:PORT) reaches beyond this machine.
absl::StatusOr<bool> IsRemoteListener(absl::string_view setting, absl::string_view value,
                                      absl::string_view example_port) {
  const std::string address = NormalizeTcpAddress(value);
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s '%s' is not PORT or HOST:PORT, e.g. 127.0.0.1:%s", setting, value, example_port));
  }
  return !IsLoopbackHost(absl::string_view(address).substr(0, colon));
}

}  // namespace

Config DefaultConfig(platform::Scope scope) {
  Config config;
  config.scope = scope;
  config.data_dir = platform::DefaultDataDir(scope);
  const std::filesystem::path socket = platform::DefaultSocketPath(scope);
  config.local_socket = socket.empty() ? "none" : socket.string();
  const std::filesystem::path endpoint_file = platform::DefaultEndpointFile(scope);
  config.endpoint_file = endpoint_file.empty() ? "none" : endpoint_file.string();
  return config;
}

absl::Status ApplyConfigText(absl::string_view text, absl::string_view origin, Config& config) {
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const size_t equals = line.find('=');
    const std::string where = absl::StrCat(origin, ":", line_number);
    if (equals == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: expected 'name = value', got '%s'", where, line));
    }
    RETURN_IF_ERROR(ApplySetting(absl::StripAsciiWhitespace(line.substr(0, equals)),
                                 absl::StripAsciiWhitespace(line.substr(equals + 1)), where,
                                 config));
  }
  return absl::OkStatus();
}

std::string NormalizeTcpAddress(absl::string_view address) {
  int port = 0;
  if (absl::SimpleAtoi(address, &port)) return absl::StrCat("127.0.0.1:", port);
  return std::string(address);
}

absl::Status ValidateConfig(const Config& config) {
  if (config.local_socket == "none" && config.endpoint_file == "none" &&
      config.tcp_listen.empty()) {
    return absl::InvalidArgumentError(
        "kilnd would listen nowhere: local_socket and endpoint_file are 'none' and tcp_listen is "
        "empty; set one");
  }
  if (!config.local_socket_group.empty() && config.local_socket == "none") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "local_socket_group '%s' shares the local socket, but local_socket is 'none'; set "
        "local_socket (e.g. /run/kiln/kilnd.sock) or remove local_socket_group",
        config.local_socket_group));
  }
  const bool identifies_clients = !config.tls_client_ca.empty() || !config.client_tokens.empty();
  if (!config.tcp_listen.empty()) {
    ASSIGN_OR_RETURN(const bool remote,
                     IsRemoteListener("tcp_listen", config.tcp_listen, "7733"));
    if (remote && !config.allow_remote) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tcp_listen '%s' accepts connections from other machines; kilnd serves only loopback "
          "unless the config file sets allow_remote = true",
          config.tcp_listen));
    }
    if (remote && (config.tls_cert.empty() || !identifies_clients)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tcp_listen '%s' accepts connections from other machines, so it needs TLS and client "
          "identity: set tls_cert and tls_key (the listener's certificate and key), and "
          "tls_client_ca (clients present certificates it signed) and/or client_tokens (a file "
          "of tenants' token hashes); see docs/farm.md",
          config.tcp_listen));
    }
  }
  if (!config.metrics_listen.empty()) {
    ASSIGN_OR_RETURN(const bool remote,
                     IsRemoteListener("metrics_listen", config.metrics_listen, "9464"));
    // The page names namespaces and tenants' traffic: another machine reads it
    // only where the config file says so (no TLS there: keep it on the farm's network).
    if (remote && !config.allow_remote) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "metrics_listen '%s' accepts connections from other machines; kilnd serves its "
          "metrics only on loopback unless the config file sets allow_remote = true",
          config.metrics_listen));
    }
  }
  if (config.tls_cert.empty() != config.tls_key.empty()) {
    return absl::InvalidArgumentError("tls_cert and tls_key go together: set both or neither");
  }
  if (config.tls_cert.empty() && identifies_clients) {
    return absl::InvalidArgumentError(
        "tls_client_ca and client_tokens identify clients over TLS: set tls_cert and tls_key too");
  }
  if (!config.tls_cert.empty() && config.tcp_listen.empty()) {
    return absl::InvalidArgumentError("tls_cert is for the tcp_listen listener: set tcp_listen");
  }
  if (config.max_request_size < (1u << 20)) {
    return absl::InvalidArgumentError(
        "max_request_size below 1MiB cannot carry a kernel's IR; raise it");
  }
  return absl::OkStatus();
}

namespace {

namespace fs = std::filesystem;

// What is wrong with `status`, that of a path where a directory should be.
std::string NotADirectory(const fs::file_status& status) {
  return fs::is_regular_file(status) ? "is a file, not a directory" : "is not a directory";
}

// Why `dir` could not be created: the first of it and its parents that
// exists but is not a directory, or else the error itself.
std::string WhyNotCreated(const fs::path& dir, const std::error_code& error) {
  for (fs::path at = dir;; at = at.parent_path()) {
    std::error_code ignored;
    const fs::file_status status = fs::status(at, ignored);
    if (fs::exists(status) && !fs::is_directory(status)) {
      return at == dir ? NotADirectory(status)
                       : absl::StrFormat("cannot be created: %s %s", at.string(),
                                         NotADirectory(status));
    }
    if (fs::exists(status) || at == at.parent_path()) break;
  }
  return absl::StrFormat("cannot be created (%s)", error.message());
}

// Makes `dir`, the value of `setting`, a directory kilnd may write in.
absl::Status PrepareWritableDirectory(absl::string_view setting, const fs::path& dir) {
  const std::string fix =
      absl::StrFormat("point %s (or --%s) at a directory kilnd may write", setting,
                      absl::StrReplaceAll(setting, {{"_", "-"}}));
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s %s %s; %s", setting, dir.string(), WhyNotCreated(dir, error), fix));
  }
  // Only making something there tells for sure: permission bits do not stop
  // root, while a read-only mount, an immutable flag or an ACL stops anyone.
  std::random_device random;
  const fs::path probe = dir / absl::StrCat(".kilnd-write-check-", absl::Hex(random()));
  if (!fs::create_directory(probe, error) && error) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s %s is not writable by kilnd (%s); %s, or let kilnd's account write "
                        "in it",
                        setting, dir.string(), error.message(), fix));
  }
  fs::remove(probe, error);
  return absl::OkStatus();
}

}  // namespace

absl::Status PrepareDataDirectories(const Config& config) {
  RETURN_IF_ERROR(PrepareWritableDirectory("data_dir", config.data_dir));
  return PrepareWritableDirectory("log_dir", config.log_dir);
}

namespace {

// The service-control words of `kilnd WORD`.
const std::vector<std::pair<absl::string_view, Command>>& ServiceCommands() {
  static const auto* commands = new std::vector<std::pair<absl::string_view, Command>>{
      {"install", Command::kInstall}, {"uninstall", Command::kUninstall},
      {"start", Command::kStart},     {"stop", Command::kStop},
      {"status", Command::kStatus}};
  return *commands;
}

absl::StatusOr<platform::Scope> ParseScope(absl::string_view value) {
  if (value == "user") return platform::Scope::kUser;
  if (value == "machine") return platform::Scope::kMachine;
  return absl::InvalidArgumentError(
      absl::StrFormat("--scope '%s' is not 'user' or 'machine'", value));
}

}  // namespace

absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args) {
  CommandLine result;
  // Flags that are not settings, taken out first: --scope picks the defaults
  // every setting starts from.
  std::vector<std::pair<std::string, std::string>> flags;
  std::optional<platform::Scope> scope;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--help" || arg == "-h" || arg == "--version") {
      result.command = arg == "--version" ? Command::kVersion : Command::kHelp;
      return result;
    }
    if (arg == "--stats" || arg == "--json" || arg == "--windows-service") {
      if (arg == "--stats") result.command = Command::kStats;
      if (arg == "--json") result.json = true;
      if (arg == "--windows-service") result.windows_service = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--")) {
      const auto& words = ServiceCommands();
      const auto word = std::find_if(words.begin(), words.end(),
                                     [&](const auto& entry) { return entry.first == arg; });
      if (i == 0 && word != words.end()) {
        result.command = word->second;
        continue;
      }
      return absl::InvalidArgumentError(
          absl::StrFormat("unexpected argument '%s'; run kilnd --help", arg));
    }
    arg.remove_prefix(2);
    std::string name, value;
    if (const size_t equals = arg.find('='); equals != absl::string_view::npos) {
      name = std::string(arg.substr(0, equals));
      value = std::string(arg.substr(equals + 1));
    } else if (i + 1 < args.size()) {
      name = std::string(arg);
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrFormat("--%s needs a value", arg));
    }
    if (name == "config") {
      result.config_file = value;
    } else if (name == "scope") {
      ASSIGN_OR_RETURN(scope, ParseScope(value));
    } else if (name == "user" || name == "password") {
      if (result.command != Command::kInstall) {
        return absl::InvalidArgumentError(
            absl::StrFormat("--%s is an option of kilnd install only", name));
      }
      (name == "user" ? result.service_account : result.service_password) = value;
    } else {
      flags.emplace_back(std::move(name), std::move(value));
    }
  }
  // A Windows service serves the machine unless --scope says otherwise.
  const bool service = result.command == Command::kInstall || result.windows_service;
  const platform::Scope chosen =
      scope.value_or(service ? platform::Scope::kMachine : platform::Scope::kUser);
  result.config = DefaultConfig(chosen);
  if (result.config_file.empty() && std::filesystem::exists(platform::DefaultConfigPath(chosen))) {
    result.config_file = platform::DefaultConfigPath(chosen);
  }
  if (!result.config_file.empty()) RETURN_IF_ERROR(ReadConfigFile(result.config_file, result.config));
  // allow_remote is deliberately file-only: exposing the cache must be written down.
  for (const auto& [name, value] : flags) {
    if (FindSetting(name) != nullptr && FindSetting(name)->name == "allow_remote") {
      return absl::InvalidArgumentError(
          "allow_remote can only be set in the config file, so exposing the cache to the "
          "network is always a written decision");
    }
    RETURN_IF_ERROR(ApplySetting(name, value, absl::StrCat("--", name), result.config));
  }
  // Local clients are handed paths under the data directory (served files),
  // which they resolve from their own working directories.
  std::error_code error;
  if (std::filesystem::path absolute = std::filesystem::absolute(result.config.data_dir, error);
      !error) {
    result.config.data_dir = std::move(absolute);
  }
  // Logs follow the data directory unless placed elsewhere (a system unit
  // that moves the data keeps its logs writable).
  if (result.config.log_dir.empty()) result.config.log_dir = result.config.data_dir / "logs";
  return result;
}

std::string UsageText() {
  std::string text =
      "kilnd: the Kiln compile and cache service\n\n"
      "usage: kilnd [--config FILE] [--SETTING=VALUE ...]   serve until SIGTERM/SIGINT\n"
      "       kilnd --stats [--json] [--local-socket PATH | --tcp-listen ADDR]\n"
      "                                                     print a running kilnd's stats\n"
      "       kilnd install [--user ACCOUNT [--password P]] [--config FILE]\n"
      "                                                     Windows: register the kilnd service\n"
      "                                                     (default account NT AUTHORITY\\LocalService)\n"
      "       kilnd uninstall | start | stop | status       Windows: control the kilnd service\n"
      "       kilnd --help | --version\n\n"
      "--scope=user|machine picks the default paths (machine: a service for every user).\n\n"
      "Settings (config file: 'name = value'; flag: --name=value):\n";
  for (const Setting& setting : Settings()) {
    absl::StrAppend(&text, absl::StrFormat("  %-18s %s\n", setting.name, setting.help));
  }
  absl::StrAppend(&text, "\nDefault config file: ", platform::DefaultConfigPath().string(), "\n");
  return text;
}

}  // namespace kiln::service
