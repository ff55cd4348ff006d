// A service's whole life through the real Service Control Manager (Wine's in
// CI): install, start, query, stop, uninstall; a service that fails to start;
// the data-directory grant for the service account.

#include "common/windows_api.h"

#include <fstream>
#include <random>
#include <sstream>

#include "common/platform.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "service/windows_service.h"
#include "tests/test_dir.h"

namespace kiln::service {
namespace {

namespace fs = std::filesystem;

std::string ReadMarker(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Waits for the service host to write `expected` into its marker file.
bool MarkerBecomes(const fs::path& path, const std::string& expected) {
  for (int i = 0; i < 300; ++i) {
    if (ReadMarker(path) == expected) return true;
    Sleep(100);
  }
  return false;
}

std::string UniqueServiceName() {
  std::random_device random;
  return "kiln-test-" + std::to_string(random() % 1000000);
}

WindowsServiceSpec TestService(const std::string& name, const fs::path& marker) {
  WindowsServiceSpec spec;
  spec.name = name;
  spec.display_name = "Kiln test service";
  spec.description = "installed by windows_service_test; safe to delete";
  spec.executable = ExecutableDir() / "kiln_test_service.exe";
  spec.arguments = {"--windows-service", name, marker.string()};
  return spec;
}

// Removes the service even when an assertion fails midway.
struct Uninstaller {
  std::string name;
  ~Uninstaller() { (void)UninstallWindowsService(name, absl::Seconds(30)); }
};

TEST(WindowsServiceTest, InstallStartQueryStopUninstall) {
  testing::TestDir dir;
  const std::string name = UniqueServiceName();
  const fs::path marker = dir.path() / "marker.txt";
  ASSERT_TRUE(fs::exists(TestService(name, marker).executable));
  absl::Status installed = InstallWindowsService(TestService(name, marker));
  ASSERT_TRUE(installed.ok()) << installed;
  Uninstaller cleanup{name};
  absl::Status again = InstallWindowsService(TestService(name, marker));
  EXPECT_TRUE(absl::IsAlreadyExists(again)) << again;
  EXPECT_NE(again.message().find("kilnd uninstall"), absl::string_view::npos);

  absl::StatusOr<WindowsServiceState> state = QueryWindowsService(name);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->state, "stopped");
  EXPECT_EQ(state->account, kDefaultServiceAccount) << "never LocalSystem unless asked";
  EXPECT_NE(state->command_line.find("--windows-service"), std::string::npos);
  EXPECT_NE(state->command_line.find("kiln_test_service.exe"), std::string::npos);
  // Wine's SCM accepts recovery actions but does not keep them.
  if (!testing::UnderWine()) {
    EXPECT_EQ(state->restart_delays, (std::vector<absl::Duration>{
                                          absl::Seconds(5), absl::Seconds(10), absl::Seconds(60)}));
    EXPECT_TRUE(state->recovers_from_error_exits);
  }

  absl::Status started = StartWindowsService(name, absl::Seconds(60));
  ASSERT_TRUE(started.ok()) << started;
  EXPECT_TRUE(MarkerBecomes(marker, "running")) << ReadMarker(marker);
  state = QueryWindowsService(name);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->state, "running");
  EXPECT_NE(state->pid, 0u);

  absl::Status stopped = StopWindowsService(name, absl::Seconds(60));
  ASSERT_TRUE(stopped.ok()) << stopped;
  EXPECT_TRUE(MarkerBecomes(marker, "stopped: service stop")) << ReadMarker(marker);
  state = QueryWindowsService(name);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->state, "stopped");
  EXPECT_EQ(state->exit_code, 0u);

  absl::Status uninstalled = UninstallWindowsService(name, absl::Seconds(30));
  ASSERT_TRUE(uninstalled.ok()) << uninstalled;
  absl::StatusOr<WindowsServiceState> gone = QueryWindowsService(name);
  EXPECT_TRUE(absl::IsNotFound(gone.status())) << gone.status();
  EXPECT_NE(gone.status().message().find("kilnd install"), absl::string_view::npos);
  EXPECT_TRUE(absl::IsNotFound(UninstallWindowsService(name, absl::Seconds(1))));
}

// Uninstalling a running service stops it first; the SCM removes the entry only
// after the service's process has exited, which trails SERVICE_STOPPED (here by
// 2 s), so "gone" must hold the moment uninstall returns, not some time later.
TEST(WindowsServiceTest, UninstallingARunningServiceLeavesNoEntryBehind) {
  testing::TestDir dir;
  const std::string name = UniqueServiceName();
  const fs::path marker = dir.path() / "marker.txt";
  WindowsServiceSpec lingering = TestService(name, marker);
  lingering.arguments.push_back("--linger-ms=2000");
  ASSERT_TRUE(InstallWindowsService(lingering).ok());
  Uninstaller cleanup{name};
  absl::Status started = StartWindowsService(name, absl::Seconds(60));
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_TRUE(MarkerBecomes(marker, "running")) << ReadMarker(marker);

  absl::Status uninstalled = UninstallWindowsService(name, absl::Seconds(30));
  ASSERT_TRUE(uninstalled.ok()) << uninstalled;
  absl::StatusOr<WindowsServiceState> gone = QueryWindowsService(name);
  EXPECT_TRUE(absl::IsNotFound(gone.status())) << gone.status();
  absl::Status reinstalled = InstallWindowsService(TestService(name, marker));
  EXPECT_TRUE(reinstalled.ok()) << reinstalled;
}

TEST(WindowsServiceTest, AServiceThatFailsToStartReportsItsExitCode) {
  testing::TestDir dir;
  const std::string name = UniqueServiceName();
  WindowsServiceSpec spec = TestService(name, dir.path() / "marker.txt");
  spec.arguments.push_back("--fail");
  ASSERT_TRUE(InstallWindowsService(spec).ok());
  Uninstaller cleanup{name};
  absl::Status started = StartWindowsService(name, absl::Seconds(60));
  EXPECT_TRUE(absl::IsUnavailable(started)) << started;
  EXPECT_NE(started.message().find("service-specific exit code 1"), absl::string_view::npos)
      << started;
  absl::StatusOr<WindowsServiceState> state = QueryWindowsService(name);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->exit_code, static_cast<uint32_t>(ERROR_SERVICE_SPECIFIC_ERROR));
  EXPECT_EQ(state->service_exit_code, 1u);
}

TEST(WindowsServiceTest, RunningAsAServiceOutsideTheScmIsExplained) {
  platform::ShutdownSignals stop;
  absl::Status status = RunWindowsService("kiln-test-not-scm", stop,
                                          [](const std::function<void()>&) {
                                            return absl::OkStatus();
                                          });
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_NE(status.message().find("--windows-service"), absl::string_view::npos);
}

TEST(WindowsServiceTest, ControlsOfAMissingServiceSayToInstallIt) {
  absl::Status start = StartWindowsService("kiln-test-never-installed", absl::Seconds(1));
  EXPECT_TRUE(absl::IsNotFound(start)) << start;
  EXPECT_TRUE(absl::IsNotFound(StopWindowsService("kiln-test-never-installed", absl::Seconds(1))));
}

TEST(WindowsServiceTest, TheServiceAccountIsGrantedTheDataDirectory) {
  testing::TestDir dir;
  const fs::path data_dir = dir.path() / "ProgramData" / "kiln";
  ASSERT_TRUE(GrantDirectoryAccess(data_dir, kDefaultServiceAccount).ok());
  EXPECT_FALSE(GrantDirectoryAccess(data_dir, "NOSUCHDOMAIN\\nobody").ok());
  // Wine maps a file's DACL to Unix mode bits, so the grant is only visible on Windows.
  if (testing::UnderWine()) return;
  PACL acl = nullptr;
  PSECURITY_DESCRIPTOR descriptor = nullptr;
  ASSERT_EQ(GetNamedSecurityInfoW(data_dir.c_str(), SE_FILE_OBJECT, DACL_SECURITY_INFORMATION,
                                  nullptr, nullptr, &acl, nullptr, &descriptor),
            static_cast<DWORD>(ERROR_SUCCESS));
  PSID local_service = nullptr;
  ASSERT_TRUE(ConvertStringSidToSidW(L"S-1-5-19", &local_service));
  bool granted = false;
  for (DWORD i = 0; acl != nullptr && i < acl->AceCount; ++i) {
    void* ace = nullptr;
    if (!GetAce(acl, i, &ace) || static_cast<ACE_HEADER*>(ace)->AceType != ACCESS_ALLOWED_ACE_TYPE) {
      continue;
    }
    auto* allowed = static_cast<ACCESS_ALLOWED_ACE*>(ace);
    if (EqualSid(&allowed->SidStart, local_service) && (allowed->Mask & FILE_GENERIC_WRITE) != 0) {
      granted = true;
    }
  }
  LocalFree(local_service);
  LocalFree(descriptor);
  EXPECT_TRUE(granted) << "LocalService cannot write the data directory";
}

}  // namespace
}  // namespace kiln::service
