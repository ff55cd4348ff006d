// kilnd's Windows defaults: where a per-user kilnd and the machine service
// keep their files, and which transport they serve local clients on.

#include "common/windows_api.h"

#include <fstream>

#include "gtest/gtest.h"
#include "service/config.h"
#include "service/service_host.h"
#include "service/windows_service.h"
#include "tests/test_dir.h"

namespace kiln::service {
namespace {

namespace fs = std::filesystem;

class WindowsConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetEnvironmentVariableW(L"LOCALAPPDATA", (dir_.path() / "Local").c_str());
    PWSTR known = nullptr;
    if (SUCCEEDED(SHGetKnownFolderPath(FOLDERID_ProgramData, 0, nullptr, &known))) {
      machine_dir_ = fs::path(known) / "kiln";
    }
    CoTaskMemFree(known);
  }
  testing::TestDir dir_;
  fs::path machine_dir_;  // the service's: %ProgramData%'s known folder
};

TEST_F(WindowsConfigTest, APerUserKilndServesTokenClientsOnLoopbackOnly) {
  absl::StatusOr<CommandLine> command_line = ParseCommandLine({});
  ASSERT_TRUE(command_line.ok()) << command_line.status();
  const Config& config = command_line->config;
  EXPECT_EQ(config.scope, platform::Scope::kUser);
  EXPECT_EQ(config.data_dir, dir_.path() / "Local" / "kiln");
  EXPECT_EQ(config.log_dir, dir_.path() / "Local" / "kiln" / "logs");
  EXPECT_EQ(config.local_socket, "none");
  EXPECT_EQ(fs::path(config.endpoint_file), dir_.path() / "Local" / "kiln" / "run" / "kilnd.endpoint");
  EXPECT_TRUE(config.tcp_listen.empty()) << "no listener other machines can reach by default";
  EXPECT_TRUE(ValidateConfig(config).ok());
}

TEST_F(WindowsConfigTest, TheServiceUsesProgramDataAndItsInstallOptions) {
  absl::StatusOr<CommandLine> install =
      ParseCommandLine({"install", "--user", "NT SERVICE\\kilnd", "--log-level=debug"});
  ASSERT_TRUE(install.ok()) << install.status();
  EXPECT_EQ(install->command, Command::kInstall);
  EXPECT_EQ(install->service_account, "NT SERVICE\\kilnd");
  EXPECT_EQ(install->config.scope, platform::Scope::kMachine);
  EXPECT_EQ(install->config.data_dir, machine_dir_);
  EXPECT_EQ(install->config.log_dir, machine_dir_ / "logs");

  // What the SCM runs: kilnd --windows-service --scope=machine --config FILE.
  const fs::path config_file = dir_.path() / "kilnd.conf";
  std::ofstream(config_file) << "toolchain = C:\\ComfyUI\\python_embeded\\python.exe\n"
                                "allowed_user = DESKTOP\\alice\n";
  absl::StatusOr<CommandLine> service = ParseCommandLine(
      {"--windows-service", "--scope=machine", "--config", config_file.string()});
  ASSERT_TRUE(service.ok()) << service.status();
  EXPECT_TRUE(service->windows_service);
  EXPECT_EQ(fs::path(service->config.endpoint_file), machine_dir_ / "run" / "kilnd.endpoint");
  EXPECT_EQ(service->config.toolchains,
            std::vector<std::string>{"C:\\ComfyUI\\python_embeded\\python.exe"});
  EXPECT_EQ(service->config.allowed_users, std::vector<std::string>{"DESKTOP\\alice"});

  absl::StatusOr<CommandLine> misplaced = ParseCommandLine({"start", "--user", "x"});
  EXPECT_FALSE(misplaced.ok());
}

// `kilnd install`, `status` and `uninstall` as a user runs them, against the
// real SCM. The executable registered is this test (the service is never
// started here; windows_service_test starts and stops one).
TEST_F(WindowsConfigTest, InstallStatusUninstallThroughTheCommandLine) {
  auto run = [](std::vector<std::string> args) {
    absl::StatusOr<CommandLine> command_line = ParseCommandLine(args);
    EXPECT_TRUE(command_line.ok()) << command_line.status();
    return command_line.ok() ? RunServiceCommand(*command_line) : -1;
  };
  (void)UninstallWindowsService(kServiceName, absl::Seconds(30));  // a leftover of an aborted run
  EXPECT_EQ(run({"status"}), 4) << "not installed";
  ASSERT_EQ(run({"install", "--user", "NT AUTHORITY\\LocalService"}), 0);
  absl::StatusOr<WindowsServiceState> state = QueryWindowsService(kServiceName);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_NE(state->command_line.find("--windows-service --scope=machine"), std::string::npos)
      << state->command_line;
  EXPECT_EQ(state->account, "NT AUTHORITY\\LocalService");
  EXPECT_TRUE(fs::is_directory(machine_dir_ / "logs"))
      << "install prepares the service's data and log directories";
  EXPECT_EQ(run({"install"}), 1) << "a second install is refused";
  EXPECT_EQ(run({"status"}), 3) << "installed, not running";
  EXPECT_EQ(run({"uninstall"}), 0);
  EXPECT_EQ(run({"status"}), 4);
  EXPECT_EQ(run({"stop"}), 4);
}

}  // namespace
}  // namespace kiln::service
