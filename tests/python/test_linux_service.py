"""`python -m kiln service install` on Linux, as root, from a venv of the
system's Python with triton and the manylinux wheel (a ComfyUI in /opt/comfy):
the kiln account, /opt/kiln, /etc/kiln/kilnd.conf and the system unit, then
the service compiling the suite for a user of group kiln as stock does, and
serving a second process. Each test machine is a mount namespace of its own
(unshare): /etc, /opt, /run, /var/cache and /home are the test's, so the
accounts it adds and the files it installs never touch the machine's. systemd
is not running there: systemctl_stand_in.py starts the unit as systemd would
(its account, groups and directories)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import kilnd_refusing

PROBE = Path(__file__).with_name("client_probe.py")
STAND_IN = Path(__file__).with_name("systemctl_stand_in.py")
SYSTEM_PYTHON = "/usr/bin/python3"
VENV = "/opt/comfy/venv"
USER = "comfy"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not Path(SYSTEM_PYTHON).exists(),
                                reason="needs root, unshare and the system's python3 (a mount namespace of its own)")


class Machine:
    """A mount namespace held open by a process of its own; run() runs a
    command in it, as root or as another account (with that account's groups)."""

    def __init__(self, root):
        self.root = root
        self.holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", "read _"],
                                       stdin=subprocess.PIPE)
        bin_dir = root / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "systemctl").symlink_to(STAND_IN)
        self.path = f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"
        for name in ("etc", "opt", "run", "var-cache", "home"):
            (root / name).mkdir(mode=0o755)
        shutil.copytree("/etc", root / "etc", symlinks=True, dirs_exist_ok=True)
        self.run("sh", "-c", f"""set -e
            mount --bind {root}/etc /etc
            mount --bind {root}/opt /opt
            mount --bind {root}/run /run
            mount --bind {root}/var-cache /var/cache
            mount --bind {root}/home /home""")

    def run(self, *command, user=None, env=None, check=True, timeout=600):
        prefix = ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", "--"]
        if user:
            prefix += ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]
        result = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=timeout,
                                env=env or self.root_env())
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
        return result

    def root_env(self, **more):
        """The test's own environment (its HOME, its pip cache), with the stand-in systemctl."""
        return dict(os.environ, PATH=self.path, **more)

    def close(self):
        self.run("systemctl", "stop", "kilnd.service", check=False)
        self.holder.stdin.close()
        self.holder.wait(timeout=30)


@pytest.fixture
def machine(tmp_path):
    made = Machine(tmp_path / "machine")
    try:
        yield made
    finally:
        made.close()


def test_service_install_runs_kilnd_as_the_kiln_account_for_the_users_of_group_kiln(machine, wheels):
    machine.run("useradd", "--create-home", USER)
    machine.run("useradd", "--create-home", "outsider")
    machine.run(SYSTEM_PYTHON, "-m", "venv", VENV)
    machine.run(f"{VENV}/bin/python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "triton==3.6.0", str(wheels["manylinux"]), timeout=900)

    install = (f"{VENV}/bin/python", "-m", "kiln", "service", "install")

    # Refused, saying why and what to do: not root; no systemd; a toolchain
    # the service's account cannot run (in a private folder).
    not_root = machine.run(*install, user=USER, check=False, env={"PATH": "/usr/bin:/bin", "HOME": f"/home/{USER}"})
    assert not_root.returncode == 1 and "a machine service is root's to install: sudo" in not_root.stderr, not_root
    no_systemd = machine.run(*install, check=False)
    assert no_systemd.returncode == 1 and "systemd is not running here" in no_systemd.stderr, no_systemd
    machine.run("mkdir", "-p", "/run/systemd/system")  # what systemd's boot leaves (sd_booted)
    machine.run("chmod", "0700", "/opt/comfy")
    refused = machine.run(*install, check=False, env=machine.root_env(SUDO_USER=USER))
    assert refused.returncode == 1 and "the service's account, kiln, cannot import triton" in refused.stderr, refused
    assert machine.run("test", "-e", "/etc/systemd/system/kilnd.service", check=False).returncode != 0
    machine.run("chmod", "0755", "/opt/comfy")

    installed = machine.run(*install, env=machine.root_env(SUDO_USER=USER))
    said = installed.stdout
    assert f"/etc/kiln/kilnd.conf: toolchain = {VENV}/bin/python" in said, said
    assert f"{USER} joined group kiln" in said and "started on /run/kiln/kilnd.sock" in said, said
    unit = machine.run("cat", "/etc/systemd/system/kilnd.service").stdout
    assert "ExecStart=/opt/kiln/kiln/bin/kilnd " in unit and "User=kiln" in unit, unit

    # kilnd runs as kiln; the socket is group kiln's, no one else's.
    pid = int(machine.run("cat", "/run/systemctl-stand-in/kilnd.service.pid").stdout)
    assert os.readlink(f"/proc/{pid}/exe").endswith("/opt/kiln/kiln/bin/kilnd")
    kiln_uid = int(machine.run("id", "-u", "kiln").stdout)
    assert os.stat(f"/proc/{pid}").st_uid == kiln_uid
    modes = machine.run("stat", "-c", "%a %G", "/run/kiln", "/run/kiln/kilnd.sock").stdout.split("\n")
    assert modes[:2] == ["750 kiln", "660 kiln"], modes
    reach = [SYSTEM_PYTHON, "-c", "import socket; socket.socket(socket.AF_UNIX).connect('/run/kiln/kilnd.sock')"]
    denied = machine.run(*reach, user="outsider", check=False)
    assert denied.returncode != 0 and "PermissionError" in denied.stderr, denied

    def suite(cache, **env):
        result = machine.run(f"{VENV}/bin/python", str(PROBE), "suite", user=USER, timeout=900,
                             env={"PATH": "/usr/bin:/bin", "HOME": f"/home/{USER}",
                                  "TRITON_CACHE_DIR": f"/home/{USER}/{cache}", **env})
        return json.loads(result.stdout.splitlines()[-1])

    stock = suite("stock-cache")
    kiln_env = {"KILN": "1", "KILN_STRICT": "1"}
    first = suite("kiln-cache", **kiln_env)
    assert first["kernels"] == stock["kernels"]
    second = suite("second-cache", **kiln_env)
    assert second["kernels"] == stock["kernels"] and second["frontend_runs"] == 0
    # Served by the service: the user started no kilnd of their own.
    user_uid = int(machine.run("id", "-u", USER).stdout)
    kilnds = [p for p in os.listdir("/proc") if p.isdigit() and _comm(p) == "kilnd" and os.stat(f"/proc/{p}").st_uid
              == user_uid]
    assert kilnds == []
    status = machine.run(f"{VENV}/bin/python", "-m", "kiln", "status", user=USER,
                         env={"PATH": "/usr/bin:/bin", "HOME": f"/home/{USER}"})
    assert "endpoint:  unix:/run/kiln/kilnd.sock" in status.stdout, status.stdout
    assert "binary:    /opt/kiln/kiln/bin/kilnd" in status.stdout.splitlines(), status.stdout
    assert "service:" in status.stdout and "registered" in status.stdout, status.stdout

    # Again (an upgrade): nothing added, running again.
    again = machine.run(*install, env=machine.root_env(SUDO_USER=USER))
    assert "/etc/kiln/kilnd.conf: nothing to add" in again.stdout, again.stdout
    state = machine.run(f"{VENV}/bin/python", "-m", "kiln", "service", "status")
    assert state.stdout.startswith("kilnd: running"), state.stdout

    removed = machine.run(f"{VENV}/bin/python", "-m", "kiln", "service", "uninstall")
    assert "removed the kilnd service and /opt/kiln" in removed.stdout, removed.stdout
    assert machine.run("test", "-e", "/opt/kiln", check=False).returncode != 0
    assert machine.run("test", "-e", "/var/cache/kiln/kiln.db", check=False).returncode == 0  # the cache stays
    gone = machine.run(f"{VENV}/bin/python", "-m", "kiln", "service", "status", check=False)
    assert gone.returncode == 1 and "not installed" in gone.stdout, gone.stdout


def _comm(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_kilnd_refuses_a_socket_group_it_cannot_share_with(tmp_path):
    unknown = kilnd_refusing(tmp_path, "local_socket_group = no-such-group-of-kiln\n")
    assert "no group named 'no-such-group-of-kiln'" in unknown and "groupadd --system" in unknown, unknown
