#include "service/windows_service.h"

#include "common/windows_api.h"

#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/windows_accounts.h"
#include "common/windows_text.h"

namespace kiln::service {
namespace {

namespace fs = std::filesystem;

// How long a stop may take: kilnd gives in-flight requests 30 s to finish.
constexpr DWORD kStopWaitHintMs = 35'000;
constexpr DWORD kStartWaitHintMs = 30'000;
constexpr char kEventLogKey[] = "SYSTEM\\CurrentControlSet\\Services\\EventLog\\Application\\";
// .NET's message file maps every event id to "%1", so plain-text events read
// well in Event Viewer without a compiled message table of our own.
constexpr wchar_t kEventMessageFile[] =
    L"%SystemRoot%\\Microsoft.NET\\Framework64\\v4.0.30319\\EventLogMessages.dll";

struct ScHandleCloser {
  void operator()(SC_HANDLE handle) const {
    if (handle != nullptr) CloseServiceHandle(handle);
  }
};
using ScHandle = std::unique_ptr<std::remove_pointer_t<SC_HANDLE>, ScHandleCloser>;

absl::Status ScError(const std::string& what, DWORD error = GetLastError()) {
  const std::string message = absl::StrCat(what, ": ", ErrorText(error));
  switch (error) {
    case ERROR_ACCESS_DENIED:
      return absl::PermissionDeniedError(
          absl::StrCat(message, "; run it from an elevated (administrator) prompt"));
    case ERROR_SERVICE_DOES_NOT_EXIST:
      return absl::NotFoundError(absl::StrCat(message, "; install it first (kilnd install)"));
    case ERROR_SERVICE_EXISTS:
    case ERROR_DUPLICATE_SERVICE_NAME:
      return absl::AlreadyExistsError(
          absl::StrCat(message, "; kilnd uninstall first to reinstall it"));
    case ERROR_SERVICE_MARKED_FOR_DELETE:
      return absl::FailedPreconditionError(absl::StrCat(
          message, "; close the Services console (and any tool holding the service) and retry"));
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<ScHandle> OpenManager(DWORD access) {
  ScHandle manager(OpenSCManagerW(nullptr, nullptr, access));
  if (manager == nullptr) return ScError("cannot open the Service Control Manager");
  return manager;
}

absl::StatusOr<ScHandle> OpenNamedService(const std::string& name, DWORD access) {
  absl::StatusOr<ScHandle> manager = OpenManager(SC_MANAGER_CONNECT);
  if (!manager.ok()) return manager.status();
  const std::wstring wide = Widen(name);
  ScHandle service(OpenServiceW(manager->get(), wide.c_str(), access));
  if (service == nullptr) return ScError(absl::StrCat("cannot open service ", name));
  return service;
}

std::string StateName(DWORD state) {
  switch (state) {
    case SERVICE_STOPPED: return "stopped";
    case SERVICE_START_PENDING: return "start pending";
    case SERVICE_STOP_PENDING: return "stop pending";
    case SERVICE_RUNNING: return "running";
    case SERVICE_CONTINUE_PENDING: return "continue pending";
    case SERVICE_PAUSE_PENDING: return "pause pending";
    case SERVICE_PAUSED: return "paused";
    default: return absl::StrCat("state ", state);
  }
}

absl::StatusOr<SERVICE_STATUS_PROCESS> ProcessStatus(SC_HANDLE service) {
  SERVICE_STATUS_PROCESS status{};
  DWORD needed = 0;
  if (!QueryServiceStatusEx(service, SC_STATUS_PROCESS_INFO, reinterpret_cast<BYTE*>(&status),
                            sizeof(status), &needed)) {
    return ScError("cannot query the service's status");
  }
  return status;
}

// Polls until the service reaches `wanted` or leaves `pending`.
absl::StatusOr<SERVICE_STATUS_PROCESS> WaitForState(SC_HANDLE service, DWORD pending, DWORD wanted,
                                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<SERVICE_STATUS_PROCESS> status = ProcessStatus(service);
    if (!status.ok() || status->dwCurrentState == wanted) return status;
    if (status->dwCurrentState != pending && status->dwCurrentState != SERVICE_START_PENDING &&
        status->dwCurrentState != SERVICE_STOP_PENDING) {
      return status;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "the service is still '%s' after %s; see its log and the Event Log (source kilnd)",
          StateName(status->dwCurrentState), absl::FormatDuration(timeout)));
    }
    Sleep(100);
  }
}

std::string ExitText(const SERVICE_STATUS_PROCESS& status) {
  if (status.dwWin32ExitCode == ERROR_SERVICE_SPECIFIC_ERROR) {
    return absl::StrCat("service-specific exit code ", status.dwServiceSpecificExitCode);
  }
  return ErrorText(status.dwWin32ExitCode);
}

std::wstring QuotedCommandLine(const WindowsServiceSpec& spec) {
  std::wstring command = L"\"" + spec.executable.native() + L"\"";
  for (const std::string& argument : spec.arguments) {
    command += argument.find_first_of(" \t\"") == std::string::npos
                   ? L" " + Widen(argument)
                   : L" \"" + Widen(argument) + L"\"";
  }
  return command;
}

void AddEventLogSource(const std::string& name) {
  HKEY key = nullptr;
  const std::wstring path = Widen(absl::StrCat(kEventLogKey, name));
  if (RegCreateKeyExW(HKEY_LOCAL_MACHINE, path.c_str(), 0, nullptr, 0, KEY_SET_VALUE, nullptr, &key,
                      nullptr) != ERROR_SUCCESS) {
    return;  // events then show without a message file: still readable
  }
  RegSetValueExW(key, L"EventMessageFile", 0, REG_EXPAND_SZ,
                 reinterpret_cast<const BYTE*>(kEventMessageFile), sizeof(kEventMessageFile));
  const DWORD types = EVENTLOG_ERROR_TYPE | EVENTLOG_WARNING_TYPE | EVENTLOG_INFORMATION_TYPE;
  RegSetValueExW(key, L"TypesSupported", 0, REG_DWORD, reinterpret_cast<const BYTE*>(&types),
                 sizeof(types));
  RegCloseKey(key);
}

}  // namespace

absl::Status InstallWindowsService(const WindowsServiceSpec& spec) {
  if (spec.name.empty() || spec.executable.empty()) {
    return absl::InvalidArgumentError("a service needs a name and an executable");
  }
  if (!spec.executable.is_absolute()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the service executable %s must be an absolute path", PathText(spec.executable)));
  }
  absl::StatusOr<ScHandle> manager = OpenManager(SC_MANAGER_CREATE_SERVICE);
  if (!manager.ok()) return manager.status();
  const std::wstring name = Widen(spec.name);
  const std::wstring display = Widen(spec.display_name.empty() ? spec.name : spec.display_name);
  const std::wstring command = QuotedCommandLine(spec);
  const std::wstring account =
      Widen(spec.account.empty() ? std::string(kDefaultServiceAccount) : spec.account);
  const std::wstring password = Widen(spec.password);
  ScHandle service(CreateServiceW(
      manager->get(), name.c_str(), display.c_str(), SERVICE_ALL_ACCESS,
      SERVICE_WIN32_OWN_PROCESS, SERVICE_AUTO_START, SERVICE_ERROR_NORMAL, command.c_str(),
      nullptr, nullptr, nullptr, account.c_str(), spec.password.empty() ? nullptr : password.c_str()));
  if (service == nullptr) return ScError(absl::StrCat("cannot create service ", spec.name));

  std::wstring description = Widen(spec.description);
  SERVICE_DESCRIPTIONW description_info{description.data()};
  ChangeServiceConfig2W(service.get(), SERVICE_CONFIG_DESCRIPTION, &description_info);
  SERVICE_DELAYED_AUTO_START_INFO delayed{TRUE};
  ChangeServiceConfig2W(service.get(), SERVICE_CONFIG_DELAYED_AUTO_START_INFO, &delayed);
  // Recovery: restart after 5 s, 10 s, then every 60 s; the count resets after a day.
  SC_ACTION actions[] = {{SC_ACTION_RESTART, 5'000}, {SC_ACTION_RESTART, 10'000},
                         {SC_ACTION_RESTART, 60'000}};
  SERVICE_FAILURE_ACTIONSW failure{};
  failure.dwResetPeriod = 24 * 60 * 60;
  failure.cActions = 3;
  failure.lpsaActions = actions;
  if (!ChangeServiceConfig2W(service.get(), SERVICE_CONFIG_FAILURE_ACTIONS, &failure)) {
    const absl::Status error = ScError("cannot set the service's recovery actions");
    DeleteService(service.get());
    return error;
  }
  // Also restart after a clean exit with an error code (kilnd reports start
  // failures that way), not only after crashes.
  SERVICE_FAILURE_ACTIONS_FLAG on_error_exit{TRUE};
  ChangeServiceConfig2W(service.get(), SERVICE_CONFIG_FAILURE_ACTIONS_FLAG, &on_error_exit);
  SERVICE_PRESHUTDOWN_INFO preshutdown{kStopWaitHintMs};
  ChangeServiceConfig2W(service.get(), SERVICE_CONFIG_PRESHUTDOWN_INFO, &preshutdown);
  // A virtual account (NT SERVICE\name) exists only with a service SID.
  SERVICE_SID_INFO sid_info{SERVICE_SID_TYPE_UNRESTRICTED};
  ChangeServiceConfig2W(service.get(), SERVICE_CONFIG_SERVICE_SID_INFO, &sid_info);
  AddEventLogSource(spec.name);
  return absl::OkStatus();
}

absl::Status UninstallWindowsService(const std::string& name, absl::Duration stop_timeout) {
  absl::StatusOr<ScHandle> service =
      OpenNamedService(name, SERVICE_STOP | SERVICE_QUERY_STATUS | DELETE);
  if (!service.ok()) return service.status();
  absl::StatusOr<SERVICE_STATUS_PROCESS> status = ProcessStatus(service->get());
  if (status.ok() && status->dwCurrentState != SERVICE_STOPPED) {
    SERVICE_STATUS ignored{};
    ControlService(service->get(), SERVICE_CONTROL_STOP, &ignored);
    status = WaitForState(service->get(), SERVICE_STOP_PENDING, SERVICE_STOPPED, stop_timeout);
    if (!status.ok()) return status.status();
  }
  if (!DeleteService(service->get())) return ScError(absl::StrCat("cannot delete service ", name));
  service->reset();
  const std::wstring key = Widen(absl::StrCat(kEventLogKey, name));
  RegDeleteKeyW(HKEY_LOCAL_MACHINE, key.c_str());
  // DeleteService only marks the service: the SCM removes it once its process
  // has exited and every handle to it is closed, which can trail SERVICE_STOPPED.
  // Waiting here means `kilnd status` or `kilnd install` right after returns
  // "not installed" or installs afresh, rather than meeting a half-deleted one.
  const absl::Time deadline = absl::Now() + stop_timeout;
  while (absl::Now() < deadline) {
    absl::StatusOr<ScHandle> remaining = OpenNamedService(name, SERVICE_QUERY_STATUS);
    if (absl::IsNotFound(remaining.status())) return absl::OkStatus();
    Sleep(100);
  }
  return absl::OkStatus();  // still marked for deletion: it goes when the last handle closes
}

absl::Status StartWindowsService(const std::string& name, absl::Duration timeout) {
  absl::StatusOr<ScHandle> service = OpenNamedService(name, SERVICE_START | SERVICE_QUERY_STATUS);
  if (!service.ok()) return service.status();
  if (!StartServiceW(service->get(), 0, nullptr) &&
      GetLastError() != ERROR_SERVICE_ALREADY_RUNNING) {
    return ScError(absl::StrCat("cannot start service ", name));
  }
  absl::StatusOr<SERVICE_STATUS_PROCESS> status =
      WaitForState(service->get(), SERVICE_START_PENDING, SERVICE_RUNNING, timeout);
  if (!status.ok()) return status.status();
  if (status->dwCurrentState != SERVICE_RUNNING) {
    return absl::UnavailableError(absl::StrFormat(
        "service %s stopped while starting (%s); see its log and the Event Log (source %s)", name,
        ExitText(*status), name));
  }
  return absl::OkStatus();
}

absl::Status StopWindowsService(const std::string& name, absl::Duration timeout) {
  absl::StatusOr<ScHandle> service = OpenNamedService(name, SERVICE_STOP | SERVICE_QUERY_STATUS);
  if (!service.ok()) return service.status();
  SERVICE_STATUS ignored{};
  if (!ControlService(service->get(), SERVICE_CONTROL_STOP, &ignored) &&
      GetLastError() != ERROR_SERVICE_NOT_ACTIVE) {
    return ScError(absl::StrCat("cannot stop service ", name));
  }
  absl::StatusOr<SERVICE_STATUS_PROCESS> status =
      WaitForState(service->get(), SERVICE_STOP_PENDING, SERVICE_STOPPED, timeout);
  return status.ok() ? absl::OkStatus() : status.status();
}

absl::StatusOr<WindowsServiceState> QueryWindowsService(const std::string& name) {
  absl::StatusOr<ScHandle> service =
      OpenNamedService(name, SERVICE_QUERY_STATUS | SERVICE_QUERY_CONFIG);
  if (!service.ok()) return service.status();
  absl::StatusOr<SERVICE_STATUS_PROCESS> status = ProcessStatus(service->get());
  if (!status.ok()) return status.status();
  WindowsServiceState state;
  state.state = StateName(status->dwCurrentState);
  state.pid = status->dwProcessId;
  state.exit_code = status->dwWin32ExitCode;
  state.service_exit_code = status->dwServiceSpecificExitCode;

  DWORD needed = 0;
  QueryServiceConfigW(service->get(), nullptr, 0, &needed);
  std::vector<unsigned char> config_buffer(std::max<DWORD>(needed, sizeof(QUERY_SERVICE_CONFIGW)));
  auto* config = reinterpret_cast<QUERY_SERVICE_CONFIGW*>(config_buffer.data());
  if (QueryServiceConfigW(service->get(), config, static_cast<DWORD>(config_buffer.size()),
                          &needed)) {
    if (config->lpServiceStartName != nullptr) state.account = Narrow(config->lpServiceStartName);
    if (config->lpBinaryPathName != nullptr) state.command_line = Narrow(config->lpBinaryPathName);
  }
  needed = 0;
  QueryServiceConfig2W(service->get(), SERVICE_CONFIG_FAILURE_ACTIONS, nullptr, 0, &needed);
  std::vector<unsigned char> failure_buffer(std::max<DWORD>(needed, sizeof(SERVICE_FAILURE_ACTIONSW)));
  auto* failure = reinterpret_cast<SERVICE_FAILURE_ACTIONSW*>(failure_buffer.data());
  if (QueryServiceConfig2W(service->get(), SERVICE_CONFIG_FAILURE_ACTIONS, failure_buffer.data(),
                           static_cast<DWORD>(failure_buffer.size()), &needed)) {
    for (DWORD i = 0; i < failure->cActions; ++i) {
      if (failure->lpsaActions[i].Type == SC_ACTION_RESTART) {
        state.restart_delays.push_back(absl::Milliseconds(failure->lpsaActions[i].Delay));
      }
    }
  }
  SERVICE_FAILURE_ACTIONS_FLAG flag{};
  if (QueryServiceConfig2W(service->get(), SERVICE_CONFIG_FAILURE_ACTIONS_FLAG,
                           reinterpret_cast<BYTE*>(&flag), sizeof(flag), &needed)) {
    state.recovers_from_error_exits = flag.fFailureActionsOnNonCrashFailures != FALSE;
  }
  return state;
}

absl::Status GrantDirectoryAccess(const fs::path& dir, const std::string& account) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot create %s: %s", PathText(dir), error.message()));
  }
  absl::StatusOr<std::vector<unsigned char>> sid = AccountSid(account);
  if (!sid.ok()) return sid.status();
  EXPLICIT_ACCESSW entry{};
  entry.grfAccessPermissions = GENERIC_READ | GENERIC_WRITE | GENERIC_EXECUTE | DELETE;
  entry.grfAccessMode = GRANT_ACCESS;
  entry.grfInheritance = SUB_CONTAINERS_AND_OBJECTS_INHERIT;
  entry.Trustee.TrusteeForm = TRUSTEE_IS_SID;
  entry.Trustee.TrusteeType = TRUSTEE_IS_UNKNOWN;
  entry.Trustee.ptstrName = reinterpret_cast<LPWSTR>(sid->data());
  PACL current = nullptr;
  PSECURITY_DESCRIPTOR descriptor = nullptr;
  DWORD result = GetNamedSecurityInfoW(dir.c_str(), SE_FILE_OBJECT, DACL_SECURITY_INFORMATION,
                                       nullptr, nullptr, &current, nullptr, &descriptor);
  PACL updated = nullptr;
  if (result == ERROR_SUCCESS) result = SetEntriesInAclW(1, &entry, current, &updated);
  if (result == ERROR_SUCCESS) {
    result = SetNamedSecurityInfoW(const_cast<LPWSTR>(dir.c_str()), SE_FILE_OBJECT,
                                   DACL_SECURITY_INFORMATION, nullptr, nullptr, updated, nullptr);
  }
  if (updated != nullptr) LocalFree(updated);
  if (descriptor != nullptr) LocalFree(descriptor);
  if (result != ERROR_SUCCESS) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot give %s access to %s: %s", account, PathText(dir), ErrorText(result)));
  }
  return absl::OkStatus();
}

void ReportWindowsEvent(const std::string& source, EventKind kind, const std::string& message) {
  const std::wstring wide_source = Widen(source);
  HANDLE log = RegisterEventSourceW(nullptr, wide_source.c_str());
  if (log == nullptr) return;
  const std::wstring text = Widen(message);
  const wchar_t* strings[] = {text.c_str()};
  const WORD type = kind == EventKind::kError     ? EVENTLOG_ERROR_TYPE
                    : kind == EventKind::kWarning ? EVENTLOG_WARNING_TYPE
                                                  : EVENTLOG_INFORMATION_TYPE;
  ReportEventW(log, type, 0, 0, nullptr, 1, 0, strings, nullptr);
  DeregisterEventSource(log);
}

namespace {

// ServiceMain has a fixed C signature, so the one service this process runs
// is reached through here.
struct RunningService {
  std::string name;
  platform::ShutdownSignals* stop = nullptr;
  ServiceBody body;
  absl::Status result;
  bool started = false;

  std::mutex mutex;  // guards status and handle between ServiceMain and the handler
  SERVICE_STATUS_HANDLE handle = nullptr;
  SERVICE_STATUS status{};

  void Report(DWORD state, DWORD wait_hint_ms = 0) {
    std::lock_guard lock(mutex);
    status.dwServiceType = SERVICE_WIN32_OWN_PROCESS;
    status.dwCurrentState = state;
    status.dwControlsAccepted =
        state == SERVICE_RUNNING
            ? SERVICE_ACCEPT_STOP | SERVICE_ACCEPT_SHUTDOWN | SERVICE_ACCEPT_PRESHUTDOWN
            : 0;
    status.dwWaitHint = wait_hint_ms;
    status.dwCheckPoint = state == SERVICE_RUNNING || state == SERVICE_STOPPED
                              ? 0
                              : status.dwCheckPoint + 1;
    if (handle != nullptr) SetServiceStatus(handle, &status);
  }
};

RunningService* running_service = nullptr;

DWORD WINAPI OnServiceControl(DWORD control, DWORD, void*, void* context) {
  auto* service = static_cast<RunningService*>(context);
  switch (control) {
    case SERVICE_CONTROL_STOP:
    case SERVICE_CONTROL_SHUTDOWN:
    case SERVICE_CONTROL_PRESHUTDOWN:
      service->Report(SERVICE_STOP_PENDING, kStopWaitHintMs);
      service->stop->Request(control == SERVICE_CONTROL_STOP ? "service stop"
                                                             : "system shutdown");
      return NO_ERROR;
    case SERVICE_CONTROL_INTERROGATE:
      return NO_ERROR;
    default:
      return ERROR_CALL_NOT_IMPLEMENTED;
  }
}

void WINAPI ServiceMain(DWORD, LPWSTR*) {
  RunningService* service = running_service;
  service->started = true;
  const std::wstring name = Widen(service->name);
  service->handle = RegisterServiceCtrlHandlerExW(name.c_str(), OnServiceControl, service);
  if (service->handle == nullptr) {
    service->result = ScError("cannot register the service control handler");
    return;
  }
  service->Report(SERVICE_START_PENDING, kStartWaitHintMs);
  service->result = service->body([service] {
    service->Report(SERVICE_RUNNING);
    ReportWindowsEvent(service->name, EventKind::kInformation,
                       absl::StrCat(service->name, " started"));
  });
  {
    std::lock_guard lock(service->mutex);
    service->status.dwWin32ExitCode = service->result.ok() ? NO_ERROR : ERROR_SERVICE_SPECIFIC_ERROR;
    service->status.dwServiceSpecificExitCode = service->result.ok() ? 0 : 1;
  }
  if (service->result.ok()) {
    ReportWindowsEvent(service->name, EventKind::kInformation,
                       absl::StrCat(service->name, " stopped"));
  } else {
    ReportWindowsEvent(service->name, EventKind::kError,
                       absl::StrCat(service->name, " failed: ", service->result.message()));
  }
  service->Report(SERVICE_STOPPED);
}

}  // namespace

absl::Status RunWindowsService(const std::string& name, platform::ShutdownSignals& stop,
                               ServiceBody body) {
  RunningService service;
  service.name = name;
  service.stop = &stop;
  service.body = std::move(body);
  running_service = &service;
  std::wstring wide_name = Widen(name);
  SERVICE_TABLE_ENTRYW table[] = {{wide_name.data(), ServiceMain}, {nullptr, nullptr}};
  // Blocks until ServiceMain has reported SERVICE_STOPPED.
  const BOOL dispatched = StartServiceCtrlDispatcherW(table);
  const DWORD error = GetLastError();
  running_service = nullptr;
  if (!dispatched) {
    if (error == ERROR_FAILED_SERVICE_CONTROLLER_CONNECT) {
      return absl::FailedPreconditionError(
          "--windows-service is for the Service Control Manager; run kilnd without it to serve "
          "in this console, or kilnd start to start the installed service");
    }
    return ScError("cannot connect to the Service Control Manager", error);
  }
  return service.started ? service.result
                         : absl::InternalError("the SCM never started the service");
}

}  // namespace kiln::service
