"""python -m kiln service on Linux, as root: the system unit of deploy/linux
with the kilnd of this manylinux wheel.

install   creates the `kiln` account and group (useradd --system) unless they
          exist, checks that account can run this Python's Triton, copies
          kilnd, kiln, the worker and their libraries to /opt/kiln (a service
          must not run from a folder pip rewrites), adds `toolchain = <this
          python>` to /etc/kiln/kilnd.conf (keeping every line there), writes
          /etc/systemd/system/kilnd.service and enables and starts it. The
          user who ran sudo joins group kiln, whose members may use the
          service's socket, /run/kiln/kilnd.sock. Again after an upgrade.
uninstall stops and disables the unit, removes it and /opt/kiln; the cache
          (/var/cache/kiln), the configuration and the account stay.
status    the unit's state and the binary it runs.
"""

import grp
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

from kiln.service import autostart as _autostart
from kiln.service.machine_service import ServiceError, add_settings

ACCOUNT = "kiln"
INSTALL_DIR = Path("/opt/kiln")
CONFIG = Path("/etc/kiln/kilnd.conf")
UNIT_NAME = "kilnd.service"
UNIT = Path("/etc/systemd/system") / UNIT_NAME
# The unit's data directory, the account's home (Triton's ~/.triton lands there).
DATA_DIR = Path("/var/cache/kiln")
# The unit's socket: where clients look by default (_paths.machine_socket).
SOCKET = Path("/run/kiln/kilnd.sock")
# auditwheel put the libraries kilnd needs beside the package, and points
# kilnd at them relative to itself: /opt/kiln keeps the wheel's layout.
_WHEEL_ROOT = Path(_autostart.WHEEL_KILND).parents[2]
_COPIED = ("kiln/bin/kilnd", "kiln/bin/kiln", "kiln/bin/kiln_worker.py")
_LIBRARIES = "kiln_triton.libs"
_UNIT_TEMPLATE = "kiln/bin/kilnd.system.service"
# What the unit's ExecStart names in deploy/linux: replaced by the installed kilnd.
_TEMPLATE_KILND = "/usr/local/bin/kilnd"
_START_DEADLINE = 30.0


def installed_kilnd():
    return INSTALL_DIR / "kiln" / "bin" / "kilnd"


def _systemctl(*args, check=True):
    result = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise ServiceError(f"systemctl {' '.join(args)} failed: {(result.stderr or result.stdout).strip()}")
    return result


def _require_root_and_systemd(action):
    if os.geteuid() != 0:
        raise ServiceError(f"a machine service is root's to {action}: sudo {sys.executable} -m kiln service {action}")
    # sd_booted()'s test: systemd is the init system running here.
    if not Path("/run/systemd/system").is_dir():
        raise ServiceError("systemd is not running here (no /run/systemd/system): start kilnd yourself (kilnd "
                           "--help), or leave it to the client, which starts a per-user kilnd when none runs")


def _ensure_account():
    try:
        pwd.getpwnam(ACCOUNT)
    except KeyError:
        # Its own group of the same name, whose members may use the socket.
        subprocess.run(["useradd", "--system", "--user-group", "--home-dir", str(DATA_DIR), "--no-create-home",
                        "--shell", "/usr/sbin/nologin", ACCOUNT], check=True, capture_output=True, timeout=60)
        print(f"created the system account {ACCOUNT} (group {ACCOUNT}), which the service runs as")


def _check_toolchain_runs_as_account():
    """The service's workers run this Python as the kiln account: a venv under
    /root or a private home directory would fail at the first compile."""
    try:
        probe = subprocess.run([sys.executable, "-c", "import triton"], capture_output=True, text=True,
                               timeout=300, user=ACCOUNT, group=ACCOUNT, extra_groups=[], cwd="/",
                               env={"PATH": "/usr/bin:/bin", "HOME": str(DATA_DIR)})
        said = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
        ran = probe.returncode == 0
    except OSError as error:  # not even started: the interpreter itself is out of reach
        said, ran = error.strerror, False
    if not ran:
        raise ServiceError(f"the service's account, {ACCOUNT}, cannot import triton with {sys.executable} ({said}): "
                           "it must be able to read that Python and its packages, which a venv under /root or "
                           "a private home directory is not. Put the environment where others may read it "
                           "(e.g. /opt), or use the per-user kilnd the client starts")


def _copy_files():
    if not Path(_autostart.WHEEL_KILND).is_file():
        raise ServiceError("this kiln-triton has no kilnd (it is the pure-Python wheel): install the manylinux "
                           "wheel, or build kilnd from source and use deploy/linux/kilnd.system.service")
    for name in _COPIED:
        (INSTALL_DIR / name).parent.mkdir(parents=True, exist_ok=True)
        # A new file moved over the old: a running kilnd keeps its own.
        staged = INSTALL_DIR / (name + ".new")
        shutil.copy2(_WHEEL_ROOT / name, staged)
        os.replace(staged, INSTALL_DIR / name)
    libraries = _WHEEL_ROOT / _LIBRARIES
    if libraries.is_dir():
        shutil.rmtree(INSTALL_DIR / _LIBRARIES, ignore_errors=True)
        shutil.copytree(libraries, INSTALL_DIR / _LIBRARIES)
    for folder, _, _ in os.walk(INSTALL_DIR):
        os.chmod(folder, 0o755)


def _write_unit():
    template = (_WHEEL_ROOT / _UNIT_TEMPLATE).read_text(encoding="utf-8")
    if _TEMPLATE_KILND not in template:
        raise ServiceError(f"{_WHEEL_ROOT / _UNIT_TEMPLATE} names no {_TEMPLATE_KILND}; reinstall kiln-triton")
    unit = template.replace(_TEMPLATE_KILND, str(installed_kilnd()))
    UNIT.parent.mkdir(parents=True, exist_ok=True)
    UNIT.write_text(unit, encoding="utf-8")
    UNIT.chmod(0o644)


def _add_caller_to_group():
    """sudo's caller joins group kiln, so that it may use the socket (from its
    next login on)."""
    caller = os.environ.get("SUDO_USER")
    if not caller or caller == "root":
        print(f"members of group {ACCOUNT} may use the service: usermod -aG {ACCOUNT} USER")
        return
    if caller in grp.getgrnam(ACCOUNT).gr_mem:
        return
    subprocess.run(["usermod", "-aG", ACCOUNT, caller], check=True, capture_output=True, timeout=60)
    print(f"{caller} joined group {ACCOUNT}, whose members may use the service (from their next login)")


def _wait_for_socket():
    deadline = time.monotonic() + _START_DEADLINE
    while time.monotonic() < deadline:
        if SOCKET.exists():
            return SOCKET
        time.sleep(0.2)
    journal = "journalctl -u kilnd" if shutil.which("journalctl") else f"{DATA_DIR}/logs/kilnd.log"
    raise ServiceError(f"the kilnd service started but {SOCKET} did not appear in {_START_DEADLINE:.0f} s; "
                       f"see {journal}")


def install():
    _require_root_and_systemd("install")
    _ensure_account()
    _check_toolchain_runs_as_account()
    upgrade = UNIT.exists()
    if upgrade:
        _systemctl("stop", UNIT_NAME, check=False)
    _copy_files()
    print(f"installed kilnd, kiln and the worker in {INSTALL_DIR}")
    for line in add_settings(CONFIG, [("toolchain", sys.executable)], newline="\n") or ["nothing to add"]:
        print(f"{CONFIG}: {line}")
    CONFIG.chmod(0o644)
    _write_unit()
    _add_caller_to_group()
    _systemctl("daemon-reload")
    _systemctl("enable", "--now", UNIT_NAME)
    print(f"the kilnd service is started on {_wait_for_socket()}; processes with KILN=1 use it "
          "(python -m kiln status)")


def uninstall():
    _require_root_and_systemd("uninstall")
    if not UNIT.exists():
        raise ServiceError(f"no kilnd service installed (no {UNIT})")
    _systemctl("disable", "--now", UNIT_NAME, check=False)
    UNIT.unlink()
    _systemctl("daemon-reload")
    shutil.rmtree(INSTALL_DIR, ignore_errors=True)
    print(f"removed the kilnd service and {INSTALL_DIR}; the cache ({DATA_DIR}), {CONFIG} and the {ACCOUNT} "
          "account stay")


def status():
    if not UNIT.exists():
        print(f"not installed (no {UNIT}); sudo {sys.executable} -m kiln service install installs it")
        return 1
    state = _systemctl("is-active", UNIT_NAME, check=False).stdout.strip() or "unknown"
    print(f"kilnd: {'running' if state == 'active' else state} ({UNIT}, {installed_kilnd()}, socket {SOCKET})")
    return 0 if state == "active" else 3
