"""The connection to kilnd: endpoint, auto-start, and the one warning on fallback."""

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings

import grpc

from . import _api, _paths
from ._errors import KilnUnavailable

log = logging.getLogger("kiln")

# kilnd answers a local connection in milliseconds; a missing one fails at once.
_CONNECT_TIMEOUT = 2.0
_AUTOSTART_DEADLINE = 20.0


def strict():
    return os.environ.get("KILN_STRICT", "") not in ("", "0")


class Connection:
    def __init__(self, endpoint):
        self.endpoint = endpoint
        self.channel = grpc.insecure_channel(endpoint, options=[
            ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
        self.stub = _api.KilnStub(self.channel)

    def ready(self, timeout):
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
            return True
        except grpc.FutureTimeoutError:
            return False


def _kilnd_binary():
    configured = os.environ.get("KILN_KILND")
    return configured if configured else shutil.which("kilnd")


def _lock(path):
    """An exclusive lock on `path` for as long as the returned file stays open."""
    handle = open(path, "a+b")
    if sys.platform == "win32":
        import msvcrt

        msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK, 1)
    else:
        import fcntl

        fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def _autostart(connection):
    """Starts the user's kilnd unless another process is doing it: connect,
    else lock, connect again, spawn, and poll until a deadline (ccache's
    storage-helper protocol)."""
    kilnd = _kilnd_binary()
    if kilnd is None or connection.endpoint != f"unix:{_paths.socket_dir() / 'kilnd.sock'}":
        return False
    directory = _paths.socket_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _lock(directory / "autostart.lock"):
        if connection.ready(0.2):
            return True
        log.info("starting %s", kilnd)
        # The service outlives this process and serves others: it gets none of
        # this client's Kiln or Triton cache settings.
        env = {name: value for name, value in os.environ.items()
               if not name.startswith("KILN") and name != "TRITON_CACHE_MANAGER"}
        subprocess.Popen([kilnd], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, env=env)
        deadline = time.monotonic() + _AUTOSTART_DEADLINE
        while time.monotonic() < deadline:
            if connection.ready(0.5):
                return True
    return False


_lock_connection = threading.Lock()
_connection = None
_warned = False


def connect(endpoint=None, autostart=True):
    """A ready connection to kilnd, or KilnUnavailable naming what was tried."""
    global _connection
    endpoint = endpoint or _paths.default_endpoint()
    with _lock_connection:
        if _connection is not None and _connection.endpoint == endpoint:
            return _connection
        connection = Connection(endpoint)
        # A missing socket file cannot connect: don't wait out the timeout
        # (inductor's worker processes would each pay it).
        socket_missing = endpoint.startswith("unix:") and not os.path.exists(endpoint[len("unix:"):])
        if (not socket_missing and connection.ready(_CONNECT_TIMEOUT)) or (
                autostart and _autostart(connection)):
            _connection = connection
            return connection
        connection.channel.close()
    hint = "" if _kilnd_binary() else " (no kilnd on PATH to start; set KILN_KILND)"
    raise KilnUnavailable(f"kilnd is not reachable at {endpoint}{hint}")


def forget():
    """Drops the cached connection (after the service went away, or disable())."""
    global _connection
    with _lock_connection:
        if _connection is not None:
            _connection.channel.close()
        _connection = None


def fall_back(reason):
    """Stock Triton from here on: warn once per process, or raise in strict mode."""
    global _warned
    if strict():
        raise KilnUnavailable(f"{reason}; KILN_STRICT is set, so Triton will not compile without kilnd")
    if not _warned:
        _warned = True
        warnings.warn(f"kiln: {reason}; compiling with stock Triton instead", RuntimeWarning, stacklevel=3)
    log.debug("falling back: %s", reason)


def is_unavailable(error):
    return isinstance(error, grpc.RpcError) and error.code() in (
        grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
