"""python -m kiln service install|uninstall|status: kilnd as the machine's
service, from the kilnd of this platform wheel, with the calling Python
registered as its toolchain. Windows (kiln.service.machine_service_windows: an
elevated prompt, the Service Control Manager) and Linux
(kiln.service.machine_service_linux: root, systemd)."""

import sys

from kiln.service.machine_service import ServiceError


def main(action):
    if sys.platform == "win32":
        from kiln.service import machine_service_windows as platform_service
    elif sys.platform.startswith("linux"):
        from kiln.service import machine_service_linux as platform_service
    else:
        print(f"python -m kiln service: not on {sys.platform}; start kilnd yourself, or let the client start a "
              "per-user kilnd", file=sys.stderr)
        return 2
    try:
        return {"install": platform_service.install, "uninstall": platform_service.uninstall,
                "status": platform_service.status}[action]() or 0
    except (ServiceError, OSError) as error:
        print(f"python -m kiln service {action}: {error}", file=sys.stderr)
        return 1
