#include "common/windows_api.h"

#include <iostream>

#include "absl/strings/str_join.h"
#include "common/windows_text.h"
#include "service/service_host.h"
#include "service/windows_service.h"

namespace kiln::service {
namespace {

// How long start and stop may take: kilnd drains requests for up to 30 s.
constexpr absl::Duration kControlTimeout = absl::Seconds(60);

std::filesystem::path ThisExecutable() {
  std::wstring buffer(32768, L'\0');
  buffer.resize(GetModuleFileNameW(nullptr, buffer.data(), static_cast<DWORD>(buffer.size())));
  return std::filesystem::path(buffer);
}

int Fail(const absl::Status& status) {
  std::cerr << "kilnd: " << status.message() << "\n";
  return absl::IsNotFound(status) ? 4 : 1;
}

int Install(const CommandLine& command_line) {
  const Config& config = command_line.config;
  WindowsServiceSpec spec;
  spec.name = kServiceName;
  spec.display_name = "Kiln compile service";
  spec.description =
      "Compiles and caches Triton GPU kernels for every process on this machine (kiln).";
  spec.executable = ThisExecutable();
  spec.arguments = {"--windows-service", "--scope=machine"};
  if (!command_line.config_file.empty()) {
    spec.arguments.push_back("--config");
    spec.arguments.push_back(PathText(command_line.config_file));
  }
  spec.account = command_line.service_account.empty() ? kDefaultServiceAccount
                                                      : command_line.service_account;
  spec.password = command_line.service_password;
  if (absl::Status installed = InstallWindowsService(spec); !installed.ok()) return Fail(installed);
  // The installer runs elevated; the service's low-privilege account must
  // still write its cache, logs and endpoint file. After the install: a
  // virtual account (NT SERVICE\kilnd) exists only once its service does.
  for (const std::filesystem::path& dir : {config.data_dir, config.log_dir}) {
    if (absl::Status granted = GrantDirectoryAccess(dir, spec.account); !granted.ok()) {
      (void)UninstallWindowsService(kServiceName, kControlTimeout);
      return Fail(granted);
    }
  }
  std::cout << "installed service " << kServiceName << " (account " << spec.account
            << ", data " << PathText(config.data_dir) << ", logs " << PathText(config.log_dir)
            << "); start it with: kilnd start\n";
  return 0;
}

int Status() {
  absl::StatusOr<WindowsServiceState> state = QueryWindowsService(kServiceName);
  if (!state.ok()) return Fail(state.status());
  std::vector<std::string> restarts;
  for (absl::Duration delay : state->restart_delays) restarts.push_back(absl::FormatDuration(delay));
  std::cout << kServiceName << ": " << state->state;
  if (state->pid != 0) std::cout << " (pid " << state->pid << ")";
  std::cout << "\n  account: " << state->account << "\n  command: " << state->command_line
            << "\n  on failure: restart after " << absl::StrJoin(restarts, ", ") << "\n";
  if (state->state == "stopped" && state->exit_code != 0) {
    std::cout << "  last exit: " << ErrorText(state->exit_code) << " (service code "
              << state->service_exit_code << ")\n";
  }
  return state->state == "running" ? 0 : 3;
}

}  // namespace

int RunServiceCommand(const CommandLine& command_line) {
  absl::Status status;
  switch (command_line.command) {
    case Command::kInstall:
      return Install(command_line);
    case Command::kUninstall:
      status = UninstallWindowsService(kServiceName, kControlTimeout);
      break;
    case Command::kStart:
      status = StartWindowsService(kServiceName, kControlTimeout);
      break;
    case Command::kStop:
      status = StopWindowsService(kServiceName, kControlTimeout);
      break;
    case Command::kStatus:
      return Status();
    default:
      return 2;
  }
  if (!status.ok()) return Fail(status);
  return 0;
}

int RunAsService(const CommandLine& command_line, platform::ShutdownSignals& stop,
                 const ServeFunction& serve) {
  const absl::Status status = RunWindowsService(
      kServiceName, stop, [&](const std::function<void()>& report_running) {
        return serve(command_line.config, stop, report_running);
      });
  if (!status.ok()) {
    std::cerr << "kilnd: " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace kiln::service
