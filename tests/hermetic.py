"""Test isolation: a test run gets a home of its own, so that no test, fixture,
helper process or benchmark finds, starts, reads or writes the kilnd, data
dir, files dir, memos or Triton/inductor caches of the account that runs it
(a developer's own kilnd may be running: scripts/main-job leaves one).

Set once per harness, never test by test:
  python3 tests/hermetic.py -- COMMAND...   scripts/test runs every suite so
  enter()                                   pytest's conftest files, benchmarks
                                            and GPU scripts, first thing; it does
                                            nothing under a harness that did it

Inside, HOME, the XDG directories and inductor's cache dir lie under one new
directory, Kiln's and Triton's settings of the account are gone, and the
machine's kilnd is looked for where none is (KILN_MACHINE_RUNTIME_DIR).
What builds and tests take as inputs stays: the KILN_* variables naming
builds, venvs and caches of downloads (HARNESS_VARIABLES).
"""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT_VARIABLE = "KILN_TEST_ROOT"
# Where scripts/test's builds and downloads are: inputs of the tests, kept.
HARNESS_VARIABLES = frozenset({
    ROOT_VARIABLE, "KILN_MACHINE_RUNTIME_DIR", "KILN_BUILD_DIR", "KILN_VENV", "KILN_PYTHON",
    "KILN_MINGW_BUILD_DIR", "KILN_WINDOWS_BUILD_DIR", "KILN_WINDOWS_DEPS_CACHE", "KILN_WINDOWS_DEPS_SEED",
})
# Settings of a harness that share a prefix with those below: tests/gpu/triton_suite.sh's.
HARNESS_PREFIXES = ("TRITON_SUITE_",)
# The account's settings of Kiln, Triton and inductor, and Windows' folders
# (Wine passes them on to Windows programs).
_ACCOUNT_PREFIXES = ("KILN", "TRITON_", "TORCHINDUCTOR_", "LOCALAPPDATA", "APPDATA", "PROGRAMDATA",
                     "WINEPREFIX")


def _isolated(root):
    """The variables that make a run hermetic under `root`."""
    home = root / "home"
    return {
        ROOT_VARIABLE: str(root),
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "XDG_RUNTIME_DIR": str(root / "run"),
        "KILN_MACHINE_RUNTIME_DIR": str(root / "machine-run"),
        # Inductor's default is in the shared /tmp, named for the user.
        "TORCHINDUCTOR_CACHE_DIR": str(root / "torchinductor"),
    }


# Kiln's settings in every test's processes, unless a test sets its own:
# KILN_FIRST_COMPILE_HERE=0 and KILN_COMPILE_HERE=0, because the tests count
# the kernels kilnd compiles, and a program's compiles run in the program
# itself (kiln/triton/compiled_here.py) would take them from each count; and
# KILN_COMPILE_HERE_WHEN_BUSY=0 for the same counts of compiles ahead, which
# would otherwise go to kilnd or not by the machine's cores. The tests of
# these turn them on; benches leave Kiln's defaults.
TEST_SETTINGS = {"KILN_FIRST_COMPILE_HERE": "0", "KILN_COMPILE_HERE": "0", "KILN_COMPILE_HERE_WHEN_BUSY": "0"}


def apply_test_settings():
    """Sets TEST_SETTINGS in this process's environment (what it starts inherits them)."""
    for name, value in TEST_SETTINGS.items():
        os.environ.setdefault(name, value)


def environment(outer, root):
    """`outer` with the account's settings removed and the run's home set."""
    env = {name: value for name, value in outer.items()
           if name in HARNESS_VARIABLES or name.startswith(HARNESS_PREFIXES)
           or not name.upper().startswith(_ACCOUNT_PREFIXES)}
    # The Windows toolchain the Wine tests download is a cache of inputs, not
    # test state: found where scripts/windows-triton put it, outside the run's home.
    outer_cache = outer.get("XDG_CACHE_HOME") or str(Path(outer.get("HOME", "/tmp")) / ".cache")
    env.setdefault("KILN_WINDOWS_DEPS_CACHE", str(Path(outer_cache) / "kiln-windows-deps"))
    # So is ccache's (scripts/windows-tests builds in here): where ccache 4 keeps it unless
    # the account set CCACHE_DIR, which is kept (an older ~/.ccache is not looked for).
    env.setdefault("CCACHE_DIR", str(Path(outer_cache) / "ccache"))
    # And pip's, for the venvs and wheels the tests make (triton, hatchling): where
    # pip keeps it unless the account set PIP_CACHE_DIR, which is kept.
    env.setdefault("PIP_CACHE_DIR", str(Path(outer_cache) / "pip"))
    env.update(_isolated(root))
    return env


def _make_root():
    root = Path(tempfile.mkdtemp(prefix="kiln-tests-"))
    for directory in ("home", "run"):
        (root / directory).mkdir(mode=0o700)
    return root


def stock_env(*more_prefixes):
    """This process's environment without Kiln's and Triton's settings (and those
    beginning with `more_prefixes`): what a process of stock Triton gets. The
    harness's own variables stay, so the run stays hermetic."""
    prefixes = ("KILN", "TRITON_", *more_prefixes)
    return {name: value for name, value in os.environ.items()
            if name in HARNESS_VARIABLES or name in TEST_SETTINGS or not name.startswith(prefixes)}


def processes_of(root):
    """PIDs of the processes (other than this one) whose HOME is `root`'s: what
    the run started and left running, detached kilnds included."""
    return processes_with("HOME", str(root / "home"))


def processes_with(variable, value):
    """PIDs of the processes (other than this one) whose environment sets `variable` to `value`."""
    marker = f"{variable}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue  # exited meanwhile, or another user's
    return found


def end_processes(root):
    """Stops what the run left running (SIGTERM, then SIGKILL after 10 s); returns their command lines."""
    left = {}
    for pid in processes_of(root):
        try:
            left[pid] = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            os.kill(pid, signal.SIGTERM)
        except OSError:
            continue
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline and any(_alive(pid) for pid in left):
        time.sleep(0.1)
    for pid in left:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    return list(left.values())


def _alive(pid):
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def enter():
    """Makes this process (and all it starts) hermetic, unless a harness already
    did; the directory goes, with what the run left running, at exit."""
    if os.environ.get(ROOT_VARIABLE):
        return Path(os.environ[ROOT_VARIABLE])
    root = _make_root()
    env = environment(dict(os.environ), root)
    os.environ.clear()
    os.environ.update(env)

    def leave():
        end_processes(root)
        shutil.rmtree(root, ignore_errors=True)

    atexit.register(leave)
    return root


def main(argv):
    if len(argv) < 2 or argv[0] != "--":
        print("usage: python3 tests/hermetic.py -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    root = _make_root()
    print(f"hermetic: the tests' home is {root}", file=sys.stderr)
    status = subprocess.call(argv[1:], env=environment(dict(os.environ), root))
    left = end_processes(root)
    for command in left:
        print(f"hermetic: stopped what the tests left running: {command}", file=sys.stderr)
    if status == 0:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"hermetic: kept {root} for a look at what failed", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
