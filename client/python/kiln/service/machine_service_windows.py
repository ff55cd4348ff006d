"""python -m kiln service on Windows, from an elevated prompt: what
deploy/windows/install-kiln.ps1 does, with pip alone.

install   copies kilnd.exe, kiln.exe, the worker and CPython's headers to
          %ProgramFiles%\\Kiln (a service must not run from a folder pip
          rewrites), adds `toolchain = <this python.exe>` and
          `allowed_user = <you>` to %ProgramData%\\kiln\\kilnd.conf (keeping
          every line there), registers the `kilnd` service and starts it.
          Only Administrators may change the folder and kilnd.conf (what the
          service runs), as install-kiln.ps1 leaves them.
          Again after an upgrade: the service is stopped, its files replaced.
uninstall stops and removes the service and %ProgramFiles%\\Kiln; the cache and
          the configuration in %ProgramData%\\kiln stay.
status    the service's state, as `kilnd status` reports it.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from kiln.service import autostart as _autostart
from kiln.service import windows_acl as _windows_acl
from kiln.service.machine_service import ServiceError, add_settings

_SERVICE_FILES = ("kilnd.exe", "kiln.exe", "kiln_worker.py")


def install_dir():
    return Path(os.environ.get("ProgramFiles", r"C:\Program Files")) / "Kiln"


def config_path():
    return Path(os.environ.get("ProgramData", r"C:\ProgramData")) / "kiln" / "kilnd.conf"


def _wheel_bin():
    folder = Path(_autostart.WHEEL_KILND).parent
    if not Path(_autostart.WHEEL_KILND).is_file():
        raise ServiceError("this kiln-triton has no kilnd.exe (it is the pure-Python wheel): install the win_amd64 "
                           "wheel, or the release zip with its install-kiln.ps1")
    return folder


def _run(kilnd, *args, check=True):
    result = subprocess.run([str(kilnd), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        said = (result.stderr or result.stdout).strip()
        hint = " (run this from an elevated prompt: Run as administrator)" if "denied" in said.lower() else ""
        raise ServiceError(f"kilnd {' '.join(args)} failed: {said}{hint}")
    return result


def _current_user():
    user, domain = os.environ.get("USERNAME", ""), os.environ.get("USERDOMAIN", "")
    return f"{domain}\\{user}" if domain and user else user


def install():
    source = _wheel_bin()
    target = install_dir()
    config = config_path()
    # Everything that can fail without changing the machine comes first.
    if config.parent.exists():
        stranger = _windows_acl.untrusted_owner(config.parent)
        if stranger:
            raise ServiceError(f"{config.parent} belongs to {stranger}, not to Administrators, so whoever that is "
                               "could change what the service runs. If you do not know why, delete the folder and "
                               "run this again; if it is meant to be, make Administrators its owner (icacls "
                               f'"{config.parent}" /setowner *S-1-5-32-544) and run this again')
    installed = target / "kilnd.exe"
    if installed.exists():  # an upgrade: a running kilnd.exe cannot be replaced
        _run(installed, "stop", check=False)
        _wait_for_files_released(installed)
    target.mkdir(parents=True, exist_ok=True)
    # Before anything is copied in, so that every file gets the folder's rules.
    _windows_acl.restrict_to_administrators(target, folder=True)
    # Plain copies: nothing here needs the source's times, and copy2's
    # CopyFile2 (Python 3.12+) is missing from Wine, where the tests run.
    for name in _SERVICE_FILES:
        shutil.copyfile(source / name, target / name)
    if (source / "python").is_dir():
        shutil.copytree(source / "python", target / "python", copy_function=shutil.copyfile, dirs_exist_ok=True)
    print(f"installed kilnd.exe, kiln.exe and the worker in {target}")
    settings = [("toolchain", sys.executable)]
    user = _current_user()
    if user:
        settings.append(("allowed_user", user))
    for line in add_settings(config, settings, newline="\r\n") or ["nothing to add"]:
        print(f"{config}: {line}")
    _windows_acl.restrict_to_administrators(config, folder=False)
    print(f"only Administrators may change {target} and {config}")
    if _run(installed, "status", check=False).returncode not in (0, 3):  # 3: registered, stopped
        _run(installed, "install", "--config", str(config))
    _run(installed, "start")
    print("the kilnd service is started; processes with KILN=1 use it (python -m kiln status)")


def _wait_for_files_released(path, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path, "r+b"):
                return
        except PermissionError:
            time.sleep(0.5)
        except OSError:
            return


def uninstall():
    installed = install_dir() / "kilnd.exe"
    if not installed.exists():
        raise ServiceError(f"no kilnd service installed from {install_dir()}")
    _run(installed, "stop", check=False)
    _run(installed, "uninstall")
    _wait_for_files_released(installed)
    shutil.rmtree(install_dir(), ignore_errors=True)
    print(f"removed the kilnd service and {install_dir()}; the cache and {config_path()} stay")


def status():
    installed = install_dir() / "kilnd.exe"
    if not installed.exists():
        print(f"not installed (no {installed}); python -m kiln service install installs it")
        return 1
    result = _run(installed, "status", check=False)
    print((result.stdout or result.stderr).strip())
    return result.returncode
