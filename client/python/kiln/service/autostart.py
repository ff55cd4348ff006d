"""Starting the user's own kilnd when none answers: which kilnd, and the
protocol that has one process of many start it (ccache's storage-helper
protocol: check, lock, check again, spawn, poll until it answers). Imports
nothing of kilnd's client: early_start runs it before the process needs one,
if it ever does."""

import logging
import os
import shutil
import subprocess
import sys
import time

from kiln.service import paths as _paths
from kiln.service.errors import KilnUnavailable

log = logging.getLogger("kiln")

AUTOSTART_DEADLINE = 20.0

# The kilnd of a platform wheel of kiln-triton, beside its worker (kiln/bin/).
WHEEL_KILND = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bin",
                           "kilnd.exe" if sys.platform == "win32" else "kilnd")
# A kilnd the client starts stops after this long with no call (kilnd's
# exit_when_idle_seconds); KILN_IDLE_EXIT_SECONDS sets it, 0 for never.
_IDLE_EXIT_SECONDS = "1800"


def kilnd_to_start():
    """(path, where it came from) of the kilnd the client starts when none
    answers: KILN_KILND, else the one of this wheel, else kilnd on PATH; None
    when there is none."""
    configured = os.environ.get("KILN_KILND")
    if configured:
        return configured, "KILN_KILND"
    if os.path.isfile(WHEEL_KILND):
        return WHEEL_KILND, "the kiln-triton wheel"
    on_path = shutil.which("kilnd")
    return (on_path, "PATH") if on_path else None


def _lock(path):
    """An exclusive lock on `path` for as long as the returned file stays open."""
    handle = open(path, "a+b")
    if sys.platform == "win32":
        import msvcrt

        # Every process locks byte 0. LK_LOCK gives up after 10 s, less than
        # another process may spend starting kilnd: poll without blocking instead.
        handle.seek(0)
        deadline = time.monotonic() + AUTOSTART_DEADLINE + 5
        while True:
            try:
                msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    handle.close()
                    raise KilnUnavailable(f"another process holds {path} and has not started kilnd")
                time.sleep(0.1)
    else:
        import fcntl

        fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def _spawn_detached(kilnd, toolchain):
    # The service outlives this process and serves others: it gets none of
    # this client's Kiln or Triton cache settings.
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("KILN") and name != "TRITON_CACHE_MANAGER"}
    if sys.platform == "win32":
        detach = {"creationflags": subprocess.DETACHED_PROCESS | subprocess.CREATE_NEW_PROCESS_GROUP
                  | subprocess.CREATE_NO_WINDOW}
    else:
        detach = {"start_new_session": True}
    idle = os.environ.get("KILN_IDLE_EXIT_SECONDS", _IDLE_EXIT_SECONDS)
    if not idle.isdigit():
        raise KilnUnavailable(f"KILN_IDLE_EXIT_SECONDS={idle!r} is not a whole number of seconds; "
                              "set it to the seconds a kilnd the client starts may stay idle, or 0 for never")
    # kilnd registers this Python's Triton as it starts (from its memo of
    # earlier probes, at once) and starts a worker of it: the first compile
    # finds one ready or starting.
    subprocess.Popen([kilnd, f"--exit-when-idle-seconds={idle}", f"--toolchain={toolchain}"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     close_fds=True, env=env, **detach)


def start_user_kilnd(answers, while_it_starts=None):
    """Starts the user's kilnd unless it answers or another process is
    starting it; waits until it answers. `answers()` says whether it does now
    (it is called again after each spawn poll, and may keep what it made);
    `while_it_starts()`, when given, runs once kilnd is spawned. False when
    there is no kilnd to start or it did not answer in time;
    KilnUnavailable when it could not be started."""
    startable = kilnd_to_start()
    if startable is None:
        return False
    kilnd, source = startable
    directory = _paths.runtime_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _lock(directory / "autostart.lock"):
        if answers():
            return True
        log.info("starting %s", kilnd)
        try:
            _spawn_detached(kilnd, sys.executable)
        except OSError as error:  # no such file, not executable, ...: Kiln's failure, never the program's
            raise KilnUnavailable(f"could not start kilnd {kilnd} (from {source}): {error}; set KILN_KILND to "
                                  "kilnd's path, or start kilnd yourself") from error
        if while_it_starts is not None:
            while_it_starts()
        deadline = time.monotonic() + AUTOSTART_DEADLINE
        while time.monotonic() < deadline:
            if answers():
                return True
            time.sleep(0.1)
    return False
