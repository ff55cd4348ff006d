// kilnd's Windows defaults: where a per-user kilnd and the machine service
// keep their files, and which transport they serve local clients on.

#include "common/windows_api.h"

#include <fstream>

#include "gtest/gtest.h"
#include "service/config.h"
#include "service/service_host.h"
#include "tests/test_dir.h"

namespace kiln::service {
namespace {

namespace fs = std::filesystem;

class WindowsConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetEnvironmentVariableW(L"LOCALAPPDATA", (dir_.path() / "Local").c_str());
    SetEnvironmentVariableW(L"ProgramData", (dir_.path() / "ProgramData").c_str());
  }
  testing::TestDir dir_;
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
  EXPECT_EQ(install->config.data_dir, dir_.path() / "ProgramData" / "kiln");
  EXPECT_EQ(install->config.log_dir, dir_.path() / "ProgramData" / "kiln" / "logs");

  // What the SCM runs: kilnd --windows-service --scope=machine --config FILE.
  const fs::path config_file = dir_.path() / "ProgramData" / "kiln" / "kilnd.conf";
  fs::create_directories(config_file.parent_path());
  std::ofstream(config_file) << "toolchain = C:\\ComfyUI\\python_embeded\\python.exe\n"
                                "allowed_user = DESKTOP\\alice\n";
  absl::StatusOr<CommandLine> service = ParseCommandLine(
      {"--windows-service", "--scope=machine", "--config", config_file.string()});
  ASSERT_TRUE(service.ok()) << service.status();
  EXPECT_TRUE(service->windows_service);
  EXPECT_EQ(fs::path(service->config.endpoint_file),
            dir_.path() / "ProgramData" / "kiln" / "run" / "kilnd.endpoint");
  EXPECT_EQ(service->config.toolchains,
            std::vector<std::string>{"C:\\ComfyUI\\python_embeded\\python.exe"});
  EXPECT_EQ(service->config.allowed_users, std::vector<std::string>{"DESKTOP\\alice"});

  absl::StatusOr<CommandLine> misplaced = ParseCommandLine({"start", "--user", "x"});
  EXPECT_FALSE(misplaced.ok());
}

TEST_F(WindowsConfigTest, ServiceCommandsForAMissingServiceExitWithNotInstalled) {
  CommandLine command_line;
  command_line.command = Command::kStatus;
  EXPECT_EQ(RunServiceCommand(command_line), 4);
}

}  // namespace
}  // namespace kiln::service
