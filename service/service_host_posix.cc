#include <iostream>

#include "service/service_host.h"

namespace kiln::service {

int RunServiceCommand(const CommandLine&) {
  std::cerr << "kilnd: install, uninstall, start, stop and status manage the Windows service. On "
               "Linux, run kilnd under systemd with the units in deploy/linux, e.g.\n"
               "  cp deploy/linux/kilnd.user.service ~/.config/systemd/user/kilnd.service && "
               "systemctl --user enable --now kilnd\n";
  return 2;
}

int RunAsService(const CommandLine&, platform::ShutdownSignals&, const ServeFunction&) {
  std::cerr << "kilnd: --windows-service is for the Windows Service Control Manager; on Linux "
               "run kilnd in the foreground (systemd: deploy/linux)\n";
  return 2;
}

}  // namespace kiln::service
