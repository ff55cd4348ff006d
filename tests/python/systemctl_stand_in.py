#!/usr/bin/env python3
"""A stand-in for systemctl, for tests/python/test_linux_service.py: the test
machine has no systemd running (it is not what is tested there; `systemd-analyze
verify` checks the units themselves in tests/systemd_units_test.sh). It does
for a unit in /etc/systemd/system what systemd does that kilnd relies on: its
User= and Group= (with the account's supplementary groups, as systemd gives
them), RuntimeDirectory= with RuntimeDirectoryMode=, CacheDirectory=,
ConfigurationDirectory=, HOME, and ExecStart= started detached. Not its
sandboxing (Protect*=, PrivateTmp=).

systemctl daemon-reload | enable [--now] UNIT | disable [--now] UNIT |
          start UNIT | stop UNIT | is-active UNIT"""

import grp
import os
import pwd
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

UNITS = Path("/etc/systemd/system")
STATE = Path("/run/systemctl-stand-in")


def unit_settings(name):
    settings = {}
    for line in (UNITS / name).read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings[key.strip()] = value.strip()
    return settings


def running_pid(name):
    try:
        pid = int((STATE / f"{name}.pid").read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def start(name):
    if running_pid(name):
        return 0
    unit = unit_settings(name)
    account = pwd.getpwnam(unit.get("User", "root"))
    group = unit.get("Group", "")
    gid = grp.getgrnam(group).gr_gid if group else account.pw_gid
    for setting, parent, mode in (("RuntimeDirectory", "/run", unit.get("RuntimeDirectoryMode", "0755")),
                                  ("CacheDirectory", "/var/cache", "0700")):
        if setting in unit:
            directory = Path(parent) / unit[setting]
            directory.mkdir(parents=True, exist_ok=True)
            os.chown(directory, account.pw_uid, gid)
            directory.chmod(int(mode, 8))
    if "ConfigurationDirectory" in unit:
        Path("/etc", unit["ConfigurationDirectory"]).mkdir(parents=True, exist_ok=True)
    STATE.mkdir(parents=True, exist_ok=True)
    log = open(STATE / f"{name}.log", "ab")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": account.pw_dir, "USER": account.pw_name,
           "LOGNAME": account.pw_name}
    process = subprocess.Popen(shlex.split(unit["ExecStart"]), user=account.pw_uid, group=gid,
                               extra_groups=os.getgrouplist(account.pw_name, gid), env=env, cwd="/",
                               stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    (STATE / f"{name}.pid").write_text(str(process.pid))
    return 0


def stop(name):
    pid = running_pid(name)
    if pid is None:
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            # Reaped by init, not by this process: poll until it is gone.
            os.kill(pid, 0)
        except OSError:
            break
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.1)
    (STATE / f"{name}.pid").unlink(missing_ok=True)
    return 0


def main(args):
    command, rest = args[0], args[1:]
    now = "--now" in rest
    names = [name for name in rest if not name.startswith("-")]
    if command == "daemon-reload":
        return 0
    if command in ("enable", "start"):
        return start(names[0]) if command == "start" or now else 0
    if command in ("disable", "stop"):
        return stop(names[0]) if command == "stop" or now else 0
    if command == "is-active":
        active = running_pid(names[0]) is not None
        print("active" if active else "inactive")
        return 0 if active else 3
    print(f"systemctl stand-in: {command} is not supported", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
