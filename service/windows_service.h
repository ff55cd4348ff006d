#ifndef KILN_SERVICE_WINDOWS_SERVICE_H_
#define KILN_SERVICE_WINDOWS_SERVICE_H_

// Windows only: kilnd as a Windows service. Registering, starting, stopping,
// querying and removing it through the Service Control Manager, and the
// service side (ServiceMain, control handler, Event Log). Needs only Win32
// and Abseil, so it is cross-compiled with mingw-w64 and tested under Wine.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/platform.h"

namespace kiln::service {

// The account a service runs as unless told otherwise: low privilege, no
// password, network access as the anonymous machine.
inline constexpr char kDefaultServiceAccount[] = "NT AUTHORITY\\LocalService";

struct WindowsServiceSpec {
  std::string name;  // "kilnd"
  std::string display_name;
  std::string description;
  std::filesystem::path executable;
  std::vector<std::string> arguments;  // after the executable in its command line
  // "NT AUTHORITY\LocalService" (default), "NT SERVICE\kilnd" (a virtual
  // account), or DOMAIN\user with `password`. LocalSystem only when named.
  std::string account;
  std::string password;
};

// Registers the service to start automatically (delayed, so it does not slow
// boot), with restart-on-failure recovery actions, a preshutdown timeout for
// draining, and an Event Log source of the same name. ALREADY_EXISTS when a
// service of that name is installed; PERMISSION_DENIED when not elevated.
absl::Status InstallWindowsService(const WindowsServiceSpec& spec);

// Stops the service if it runs (waiting up to `stop_timeout`), deletes it and
// its Event Log source. NOT_FOUND when it is not installed.
absl::Status UninstallWindowsService(const std::string& name, absl::Duration stop_timeout);

// Starts the service and waits until it reports running. An error carries the
// exit code when it stopped instead.
absl::Status StartWindowsService(const std::string& name, absl::Duration timeout);

// Asks the service to stop and waits until it has.
absl::Status StopWindowsService(const std::string& name, absl::Duration timeout);

struct WindowsServiceState {
  std::string state;  // "stopped", "start pending", "running", "stop pending", ...
  uint32_t pid = 0;   // 0 unless running
  uint32_t exit_code = 0;          // Win32 exit code of the last run
  uint32_t service_exit_code = 0;  // when exit_code is ERROR_SERVICE_SPECIFIC_ERROR
  std::string account;
  std::string command_line;
  // Restart delays of the recovery actions, in order ("restart after 5 s").
  std::vector<absl::Duration> restart_delays;
  bool recovers_from_error_exits = false;  // not only from crashes
};

// NOT_FOUND when no such service is installed.
absl::StatusOr<WindowsServiceState> QueryWindowsService(const std::string& name);

// Gives `account` modify access to `dir` (and what it will contain), so a
// low-privilege service account can write the data directory an
// administrator created.
absl::Status GrantDirectoryAccess(const std::filesystem::path& dir, const std::string& account);

enum class EventKind { kInformation, kWarning, kError };

// Writes `message` to the Application event log under source `source`.
void ReportWindowsEvent(const std::string& source, EventKind kind, const std::string& message);

// The body of a service: `report_running` tells the SCM it is serving; it
// returns when `stop` was requested and everything is closed.
using ServiceBody = std::function<absl::Status(const std::function<void()>& report_running)>;

// Runs `body` as service `name` when the SCM started this process, and
// returns its result once the SCM knows it stopped. Stop, shutdown and
// preshutdown controls become stop.Request(...). Start, stop and failure are
// written to the Event Log; a failure exits with a service-specific code, so
// the recovery actions restart it. FAILED_PRECONDITION when the process was
// not started by the SCM (someone ran `kilnd --windows-service` by hand).
absl::Status RunWindowsService(const std::string& name, platform::ShutdownSignals& stop,
                               ServiceBody body);

}  // namespace kiln::service

#endif  // KILN_SERVICE_WINDOWS_SERVICE_H_
