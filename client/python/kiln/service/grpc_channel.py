"""kilnd over grpcio, for the endpoints kiln.service.local_grpc does not
serve: a farm's kilnd over TLS, several kilnds behind one KILN_ENDPOINT, and
plain TCP to another host. Calls raise errors.RpcError, as local_grpc's do."""

import json
import os
import socket

from kiln.service import api as _api
from kiln.service import paths as _paths
from kiln.service.local_grpc import MAX_MESSAGE
from kiln.service.errors import KilnUnavailable, RpcError, StatusCode, status_code
from kiln.service.grpc_runtime import grpc

# The client closes a connection with no call for this long itself, quietly,
# before kilnd's own idle limit (tcp_idle_seconds, 300 s by default, closing
# after half of it at the earliest) does: gRPC logs every connection a server
# closes that way ("Got goaway [2] ... enter idle") to the program's stderr.
# The next call connects again.
_IDLE_MS = 60_000
# A kilnd that stops answering (stopped, or a host gone) ends the calls it
# holds by keepalive: a PING once a call has waited this long, and the
# connection closed when its answer takes longer than the PING timeout (gRPC
# since 1.57 times a keepalive PING by grpc.http2.ping_timeout_ms, a minute by
# default, not by keepalive_timeout_ms). kilnd allows PINGs this often during
# calls (server.cc); without data between them gRPC sends two at most unless
# max_pings_without_data is 0.
_KEEPALIVE_MS = 2000
_PING_TIMEOUT_MS = 3000
# A connection's TLS and HTTP/2 handshake gives up after this long (gRPC's
# minimum connect timeout, 20 s by default): the retry of a call whose kilnd
# stopped connects again, to a kernel that still accepts for it and a kilnd
# that never answers. Ample for a handshake's few round trips.
_CONNECT_TIMEOUT_MS = 4000
# grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, without importing grpc.experimental.
_SINGLE_THREADED_UNARY_STREAM = "SingleThreadedUnaryStream"
# gRPC's connectivity state of a channel with a live connection (grpc_connectivity_state).
_READY = grpc.ChannelConnectivity.READY.value[0]


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


def fleet_addresses(target):
    """(the kilnds' addresses, TLS name to check) of a TCP KILN_ENDPOINT: one
    HOST:PORT (every address DNS gives it) or several, comma-separated
    ("grpcs://a:7733,b:7733"). One kilnd: its target as is. Raises
    KilnUnavailable for a name that does not resolve."""
    hosts = [part.strip().removeprefix(_paths.TLS_SCHEME) for part in target.split(",") if part.strip()]
    addresses = []
    for host_port in hosts:
        host, _, port = host_port.rpartition(":")
        name = host.strip("[]")
        if name.isascii():
            # As bytes: a str is encoded by the idna codec, whose import (with
            # stringprep and unicodedata) costs about 20 ms under Wine.
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


class Channels:
    """grpc channels to the kilnd (or kilnds) of an endpoint, and the stub that calls them."""

    def __init__(self, endpoint):
        options = [("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", -1),
                   ("grpc.client_idle_timeout_ms", _IDLE_MS),
                   ("grpc.keepalive_time_ms", _KEEPALIVE_MS), ("grpc.keepalive_timeout_ms", _PING_TIMEOUT_MS),
                   ("grpc.http2.ping_timeout_ms", _PING_TIMEOUT_MS),
                   ("grpc.min_reconnect_backoff_ms", _CONNECT_TIMEOUT_MS),
                   ("grpc.http2.max_pings_without_data", 0),
                   # A LookupOrClaim stream's answers are read on the thread that
                   # asks for them, not by a thread gRPC starts for each call.
                   (_SINGLE_THREADED_UNARY_STREAM, 1)]
        if endpoint.target.startswith("unix:"):
            addresses, tls_name = [endpoint.target], None
        else:
            addresses, tls_name = fleet_addresses(endpoint.target)
            if len(addresses) == 1:  # a fleet's calls move on to another kilnd instead
                options += [("grpc.service_config", _RETRY_SERVICE_CONFIG), ("grpc.enable_retries", 1)]
            if tls_name:
                options.append(("grpc.ssl_target_name_override", tls_name))
        tls = endpoint.target.startswith(_paths.TLS_SCHEME)
        self.channels = [grpc.secure_channel(address, _tls_credentials(), options) if tls
                         else grpc.insecure_channel(address, options=options) for address in addresses]
        stubs = [_api.KilnStub(TranslatedChannel(grpc.intercept_channel(channel, _TokenInterceptor(endpoint.token))
                                                 if endpoint.token else channel))
                 for channel in self.channels]
        self.member_stubs = stubs
        if len(stubs) == 1:
            self.stub = stubs[0]
        else:
            from kiln.service import fleet as _fleet  # only a fleet's: a module is a few ms under Wine

            self.stub = _fleet.FleetStub([_fleet.Member(address, channel, stub)
                                          for address, channel, stub in zip(addresses, self.channels, stubs)])

    def connected(self):
        """Whether every channel holds a live connection to its kilnd now: an
        in-memory look at gRPC's state, no call and no file."""
        try:
            return all(channel._channel.check_connectivity_state(False) == _READY for channel in self.channels)
        except AttributeError:  # a gRPC without it: the endpoint is read as before
            return False

    def ready(self, timeout):
        """Whether any of its kilnds answers within `timeout`."""
        import threading

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


def _translated(error, timeout=None):
    if isinstance(error, grpc.FutureCancelledError):
        return RpcError(StatusCode.CANCELLED, "the call was cancelled")
    code = error.code() if callable(getattr(error, "code", None)) else None
    status = status_code(code.value[0]) if code is not None else StatusCode.UNKNOWN
    details = (error.details() if callable(getattr(error, "details", None)) else None) or str(error)
    if status is StatusCode.DEADLINE_EXCEEDED and timeout is not None:
        # gRPC says only "Deadline Exceeded"; the warning a user reads says how long kilnd had.
        details = f"kilnd gave no answer in {timeout:g} s ({details})"
    return RpcError(status, details)


class TranslatedChannel:
    """A grpc channel whose calls raise errors.RpcError, not grpc's errors."""

    def __init__(self, channel):
        self._channel = channel

    def unary_unary(self, method, request_serializer, response_deserializer):
        return _Method(self._channel.unary_unary(method, request_serializer=request_serializer,
                                                 response_deserializer=response_deserializer))

    def unary_stream(self, method, request_serializer, response_deserializer):
        return _StreamMethod(self._channel.unary_stream(method, request_serializer=request_serializer,
                                                        response_deserializer=response_deserializer))


class _Method:
    def __init__(self, call):
        self._call = call

    def __call__(self, request, timeout=None, metadata=None):
        try:
            return self._call(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as error:
            raise _translated(error, timeout) from None

    def future(self, request, timeout=None, metadata=None):
        return _Future(self._call.future(request, timeout=timeout, metadata=metadata), timeout)


class _StreamMethod(_Method):
    def __call__(self, request, timeout=None, metadata=None):
        return _Stream(self._call(request, timeout=timeout, metadata=metadata), timeout)


class _Future:
    def __init__(self, future, call_timeout):
        self._future = future
        self._call_timeout = call_timeout

    def result(self, timeout=None):
        try:
            return self._future.result(timeout)
        except (grpc.RpcError, grpc.FutureCancelledError) as error:
            raise _translated(error, self._call_timeout) from None

    def cancel(self):
        return self._future.cancel()


class _Stream:
    def __init__(self, call, call_timeout):
        self._call = call
        self._call_timeout = call_timeout

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._call)
        except grpc.RpcError as error:
            raise _translated(error, self._call_timeout) from None

    def cancel(self):
        return self._call.cancel()
