"""The connection to kilnd: endpoint, auto-start, and the one warning on fallback."""

import logging
import os
import threading
import time
import warnings

from kiln.service import api as _api
from kiln.service import local_grpc as _local_grpc
from kiln.service import paths as _paths
from kiln.service.errors import KilnUnavailable, RpcError, StatusCode

log = logging.getLogger("kiln")


def strict():
    return os.environ.get("KILN_STRICT", "") not in ("", "0")


class Connection:
    """Calls to the kilnd (or fleet of kilnds) of an endpoint: kiln.service.local_grpc
    for this machine's kilnd, grpcio for the others."""

    def __init__(self, endpoint):
        self.endpoint = endpoint
        if _local_grpc.serves(endpoint.target):
            self._channels = _local_grpc.Channel(endpoint.target, endpoint.token)
            self.stub = _api.KilnStub(self._channels)
            self.member_stubs = [self.stub]
        else:
            from kiln.service import grpc_channel  # TLS, fleets: what only grpcio does

            self._channels = grpc_channel.Channels(endpoint)
            self.stub = self._channels.stub
            self.member_stubs = self._channels.member_stubs  # a fleet's kilnds, each on its own

    def same_as(self, endpoint):
        return (self.endpoint.target, self.endpoint.token) == (endpoint.target, endpoint.token)

    def connected(self):
        """Whether it holds a live connection to its kilnd now: no call and no
        file. A kilnd that stopped or restarted (on Windows, on a new port) has
        closed it."""
        return self._channels.connected()

    def ready(self, timeout):
        """Whether its kilnd (any of a fleet's) answers within `timeout`."""
        return self._channels.ready(timeout)

    def close(self):
        self._channels.close()


def kilnd_origin(executable):
    """' (where it came from)' for the binary of a running kilnd, when it is
    one the client knows; '' otherwise."""
    def same(path):
        try:
            return bool(path) and os.path.samefile(path, executable)
        except OSError:
            return False
    if same(os.environ.get("KILN_KILND")):
        return " (KILN_KILND)"
    from kiln.service import autostart as _autostart_kilnd

    if same(_autostart_kilnd.WHEEL_KILND):
        return " (this kiln-triton wheel's)"
    return ""


def _ready_connection(endpoint, timeout):
    """A Connection to `endpoint` that answered within `timeout`, else None."""
    if endpoint.target is None:
        return None  # no endpoint file: nothing to connect to
    # A missing socket file cannot connect: don't wait out the timeout
    # (inductor's worker processes would each pay it).
    if endpoint.target.startswith("unix:") and not os.path.exists(endpoint.target[len("unix:"):]):
        return None
    connection = Connection(endpoint)
    if connection.ready(timeout):
        return connection
    connection.close()
    return None


def _autostart():
    """Starts the user's kilnd unless another process is doing it
    (autostart.start_user_kilnd); a Connection to it once it answers. The
    endpoint is resolved afresh each poll: on Windows the new kilnd writes a
    new port and token."""
    from kiln.service import autostart as _autostart_kilnd  # only when kilnd does not answer

    ready = []

    def answers():
        try:
            connection = _ready_connection(_paths.default_endpoint(), 0.5)
        except Exception:  # noqa: BLE001  (not the kilnd this process starts: it goes on waiting for that one)
            return False
        if connection is not None:
            ready.append(connection)
        return connection is not None

    _autostart_kilnd.start_user_kilnd(answers)
    return ready[-1] if ready else None


_lock_connection = threading.Lock()
_connection = None
_connection_configured = None  # (KILN_ENDPOINT, KILN_ENDPOINT_FILE) when _connection was made for the default
_warned = False
# A process that fell back asks its kilnd nothing more for this long: each
# call would wait out its failure again (seconds, for a kilnd that stopped
# answering), and the program has gone on with stock Triton.
SHUN_SECONDS = 60.0
_shunned = None  # (until, why) once the process fell back


def _configured_endpoint():
    return os.environ.get("KILN_ENDPOINT"), os.environ.get("KILN_ENDPOINT_FILE")


def connect(endpoint=None, autostart=True):
    """A ready connection to kilnd, or KilnUnavailable naming what was tried.
    `endpoint`: a gRPC target or a _paths.Endpoint; default: _paths.default_endpoint()."""
    global _connection, _connection_configured
    configured = None
    if endpoint is None and _shunned is not None:
        until, why = _shunned
        left = until - time.monotonic()
        if left > 0:
            raise KilnUnavailable(f"{why}; kilnd is not asked again for {left:.0f} s")
    if endpoint is None:
        # Every call of a compile asks for the connection: while it is live,
        # the endpoint it was made for is still kilnd's, and reading kilnd's
        # endpoint file again (on Windows; 1-2 ms under Wine) tells nothing.
        configured = _configured_endpoint()
        connection = _connection
        if connection is not None and _connection_configured == configured and connection.connected():
            return connection
        endpoint = _paths.default_endpoint()
    elif isinstance(endpoint, str):
        endpoint = _paths.Endpoint(endpoint)
    with _lock_connection:
        if _connection is not None and _connection.same_as(endpoint):
            _connection_configured = configured
            return _connection
        try:
            connection = _ready_connection(endpoint, _local_grpc.CONNECT_TIMEOUT)
        except KilnUnavailable:
            raise
        except Exception as error:  # noqa: BLE001  (whatever failed, the caller is told kilnd is not there)
            raise KilnUnavailable(f"kilnd at {endpoint.describe()} cannot be used ({error})") from None
        if connection is None and autostart and endpoint.is_user_default:
            connection = _autostart()
        if connection is not None:
            _connection, _connection_configured = connection, configured
            return connection
    if endpoint.target and endpoint.target.startswith(_paths.TLS_SCHEME):
        # A TLS handshake that fails looks like no answer at all.
        hint = (" (or the TLS handshake failed: KILN_CA_FILE must name the CA that signed kilnd's "
                "certificate, and KILN_CLIENT_CERT a certificate signed by the CA kilnd trusts)")
    else:
        from kiln.service import autostart as _autostart_kilnd

        hint = "" if _autostart_kilnd.kilnd_to_start() else (" (no kilnd to start: none on PATH, and this kiln-triton is the "
                                           "pure-Python wheel; set KILN_KILND, or install a platform wheel)")
    raise KilnUnavailable(f"kilnd is not reachable at {endpoint.describe()}{hint}")


def forget(shun_because=None):
    """Drops the cached connection (after the service went away, or disable()).
    With `shun_because` (why the process fell back), connect() refuses at
    once for SHUN_SECONDS, saying so; without, that ends."""
    global _connection, _connection_configured, _shunned
    with _lock_connection:
        if _connection is not None:
            _connection.close()
        _connection, _connection_configured = None, None
        _shunned = None if shun_because is None else (time.monotonic() + SHUN_SECONDS, shun_because)


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
    return isinstance(error, RpcError) and error.code() in (
        StatusCode.UNAVAILABLE, StatusCode.DEADLINE_EXCEEDED, StatusCode.CANCELLED)
