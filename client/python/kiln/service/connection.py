"""The connection to kilnd: endpoint, auto-start, and the one warning on fallback."""

import json
import logging
import os
import socket
import threading
import warnings

from kiln.service import api as _api
from kiln.service import paths as _paths
from kiln.service.errors import KilnUnavailable
from kiln.service.grpc_runtime import grpc

log = logging.getLogger("kiln")

# kilnd answers a local connection in milliseconds; a missing one fails at once.
_CONNECT_TIMEOUT = 2.0
# The client closes a connection with no call for this long itself, quietly,
# before kilnd's own idle limit (tcp_idle_seconds, 300 s by default, closing
# after half of it at the earliest) does: gRPC logs every connection a server
# closes that way ("Got goaway [2] ... enter idle") to the program's stderr.
# The next call connects again.
_IDLE_MS = 60_000
# grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, without importing grpc.experimental.
_SINGLE_THREADED_UNARY_STREAM = "SingleThreadedUnaryStream"
# gRPC's connectivity state of a channel with a live connection (grpc_connectivity_state).
_READY = grpc.ChannelConnectivity.READY.value[0]


def strict():
    return os.environ.get("KILN_STRICT", "") not in ("", "0")


class _TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Sends the access token from kilnd's endpoint file with every call."""

    def __init__(self, token):
        self._metadata = (("x-kiln-token", token),)

    def _with_token(self, details):
        return details._replace(metadata=tuple(details.metadata or ()) + self._metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)


_TLS_SCHEME = "grpcs://"


def _read_setting_file(variable):
    path = os.environ.get(variable)
    if not path:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise KilnUnavailable(f"{variable}={path} cannot be read ({error.strerror}); fix the path") from None


def _tls_credentials():
    """TLS to a farm's kilnd (KILN_ENDPOINT=grpcs://HOST:PORT): the CA bundle
    that signed its certificate (KILN_CA_FILE; default: the system's), this
    client's certificate (KILN_CLIENT_CERT, KILN_CLIENT_KEY) and/or its token
    (KILN_TOKEN_FILE), which say which tenant it is."""
    certificate, key = _read_setting_file("KILN_CLIENT_CERT"), _read_setting_file("KILN_CLIENT_KEY")
    if (certificate is None) != (key is None):
        raise KilnUnavailable("KILN_CLIENT_CERT and KILN_CLIENT_KEY go together: set both or neither")
    credentials = grpc.ssl_channel_credentials(root_certificates=_read_setting_file("KILN_CA_FILE"),
                                               private_key=key, certificate_chain=certificate)
    token = _read_setting_file("KILN_TOKEN_FILE")
    if token is not None:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token.decode().strip()))
    return credentials


# Calls to one kilnd over TCP that find it restarting are tried again.
_RETRY_SERVICE_CONFIG = json.dumps({
    "methodConfig": [{
        "name": [{"service": "kiln.v1.Kiln"}],
        "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
    }],
})


def _fleet_addresses(target):
    """(the kilnds' addresses, TLS name to check) of a TCP KILN_ENDPOINT: one
    HOST:PORT (every address DNS gives it) or several, comma-separated
    ("grpcs://a:7733,b:7733"). One kilnd: its target as is. Raises
    KilnUnavailable for a name that does not resolve."""
    hosts = [part.strip()[len(_TLS_SCHEME):] if part.strip().startswith(_TLS_SCHEME) else part.strip()
             for part in target.split(",") if part.strip()]
    addresses = []
    for host_port in hosts:
        host, _, port = host_port.rpartition(":")
        name = host.strip("[]")
        if name.isascii():
            # As bytes: a str is encoded by the idna codec, whose import (with
            # stringprep and unicodedata) costs about 20 ms under Wine, where
            # the user's kilnd is at 127.0.0.1.
            name = name.encode("ascii")
        try:
            found = socket.getaddrinfo(name, int(port), type=socket.SOCK_STREAM)
        except (OSError, ValueError) as error:
            if len(hosts) == 1:
                return hosts, None  # gRPC says what is wrong with it, as for any target
            raise KilnUnavailable(f"KILN_ENDPOINT lists {host_port}, which does not resolve ({error}); "
                                  "list HOST:PORT entries") from None
        for family, _, _, _, address in found:
            entry = f"{address[0]}:{address[1]}" if family == socket.AF_INET else f"[{address[0]}]:{address[1]}"
            if family in (socket.AF_INET, socket.AF_INET6) and entry not in addresses:
                addresses.append(entry)
    if len(addresses) <= 1:
        return hosts, None
    # The fleet's certificate names the first kilnd listed (a name all of them share, usually).
    return addresses, hosts[0].rpartition(":")[0].strip("[]")


class Connection:
    def __init__(self, endpoint):
        self.endpoint = endpoint
        options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                   ("grpc.client_idle_timeout_ms", _IDLE_MS),
                   # A LookupOrClaim stream's answers are read on the thread that
                   # asks for them, not by a thread gRPC starts for each call: a
                   # compile's lookup then costs no thread (1-2 ms under Wine).
                   (_SINGLE_THREADED_UNARY_STREAM, 1)]
        if endpoint.target.startswith("unix:"):
            addresses, tls_name = [endpoint.target], None
        else:
            addresses, tls_name = _fleet_addresses(endpoint.target)
            if len(addresses) == 1:  # a fleet's calls move on to another kilnd instead
                options += [("grpc.service_config", _RETRY_SERVICE_CONFIG), ("grpc.enable_retries", 1)]
            if tls_name:
                options.append(("grpc.ssl_target_name_override", tls_name))
        tls = endpoint.target.startswith(_TLS_SCHEME)
        self.channels = [grpc.secure_channel(address, _tls_credentials(), options) if tls
                         else grpc.insecure_channel(address, options=options) for address in addresses]
        stubs = [_api.KilnStub(grpc.intercept_channel(channel, _TokenInterceptor(endpoint.token))
                               if endpoint.token else channel) for channel in self.channels]
        if len(stubs) == 1:
            self.stub = stubs[0]
        else:
            from kiln.service import fleet as _fleet  # only a fleet's: a module is a few ms under Wine

            self.stub = _fleet.FleetStub([_fleet.Member(address, channel, stub)
                                          for address, channel, stub in zip(addresses, self.channels, stubs)])

    def same_as(self, endpoint):
        return (self.endpoint.target, self.endpoint.token) == (endpoint.target, endpoint.token)

    def connected(self):
        """Whether every channel holds a live connection to its kilnd now: an
        in-memory look at gRPC's state, no call and no file. A kilnd that
        stopped or restarted (on Windows, on a new port) has closed it."""
        try:
            return all(channel._channel.check_connectivity_state(False) == _READY for channel in self.channels)
        except AttributeError:  # a gRPC without it: the endpoint is read as before
            return False

    def ready(self, timeout):
        """Whether any of its kilnds answers within `timeout`."""
        answered = threading.Event()
        futures = [grpc.channel_ready_future(channel) for channel in self.channels]
        for future in futures:
            future.add_done_callback(lambda done: answered.set() if not done.cancelled() else None)
        answered.wait(timeout)
        for future in futures:
            future.cancel()
        return answered.is_set()

    def close(self):
        for channel in self.channels:
            channel.close()


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
        connection = _ready_connection(_paths.default_endpoint(), 0.5)
        if connection is not None:
            ready.append(connection)
        return connection is not None

    _autostart_kilnd.start_user_kilnd(answers)
    return ready[-1] if ready else None


_lock_connection = threading.Lock()
_connection = None
_connection_configured = None  # (KILN_ENDPOINT, KILN_ENDPOINT_FILE) when _connection was made for the default
_warned = False


def _configured_endpoint():
    return os.environ.get("KILN_ENDPOINT"), os.environ.get("KILN_ENDPOINT_FILE")


def connect(endpoint=None, autostart=True):
    """A ready connection to kilnd, or KilnUnavailable naming what was tried.
    `endpoint`: a gRPC target or a _paths.Endpoint; default: _paths.default_endpoint()."""
    global _connection, _connection_configured
    configured = None
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
        connection = _ready_connection(endpoint, _CONNECT_TIMEOUT)
        if connection is None and autostart and endpoint.is_user_default:
            connection = _autostart()
        if connection is not None:
            _connection, _connection_configured = connection, configured
            return connection
    if endpoint.target and endpoint.target.startswith(_TLS_SCHEME):
        # A TLS handshake that fails looks like no answer at all.
        hint = (" (or the TLS handshake failed: KILN_CA_FILE must name the CA that signed kilnd's "
                "certificate, and KILN_CLIENT_CERT a certificate signed by the CA kilnd trusts)")
    else:
        from kiln.service import autostart as _autostart_kilnd

        hint = "" if _autostart_kilnd.kilnd_to_start() else (" (no kilnd to start: none on PATH, and this kiln-triton is the "
                                           "pure-Python wheel; set KILN_KILND, or install a platform wheel)")
    raise KilnUnavailable(f"kilnd is not reachable at {endpoint.describe()}{hint}")


def forget():
    """Drops the cached connection (after the service went away, or disable())."""
    global _connection, _connection_configured
    with _lock_connection:
        if _connection is not None:
            _connection.close()
        _connection, _connection_configured = None, None


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
