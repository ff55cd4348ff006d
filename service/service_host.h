#ifndef KILN_SERVICE_SERVICE_HOST_H_
#define KILN_SERVICE_SERVICE_HOST_H_

// How kilnd runs as an OS service. service_host_win.cc drives the Windows
// Service Control Manager; service_host_posix.cc explains that Linux uses the
// systemd units in deploy/linux instead.

#include <functional>

#include "absl/status/status.h"
#include "common/platform.h"
#include "service/config.h"

namespace kiln::service {

// The Windows service's name (and its Event Log source).
inline constexpr char kServiceName[] = "kilnd";

// Runs `kilnd install|uninstall|start|stop|status`; returns the exit code.
int RunServiceCommand(const CommandLine& command_line);

// kilnd's serve loop: runs until `stop` is requested, calling `ready` once it
// accepts requests.
using ServeFunction = std::function<absl::Status(
    const Config& config, platform::ShutdownSignals& stop, const std::function<void()>& ready)>;

// `kilnd --windows-service`: serves as the service the SCM started. Returns
// the exit code.
int RunAsService(const CommandLine& command_line, platform::ShutdownSignals& stop,
                 const ServeFunction& serve);

}  // namespace kiln::service

#endif  // KILN_SERVICE_SERVICE_HOST_H_
