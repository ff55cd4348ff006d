"""gRPC calls to a kilnd of this machine without grpcio: HTTP/2 with no TLS
(RFC 9113, gRPC's HTTP/2 protocol) on kilnd's Unix socket or its loopback
port, unary and server-streaming calls.

Why: grpcio's import cost a cold process about 0.3 s under Wine (57 modules,
asyncio among them), and its channel runs threads of its own beside the
program's. The user's kilnd needs none of what it adds (TLS, name resolution,
balancing across servers): those endpoints keep grpcio (grpc_channel).

Each call has a connection of its own, taken from a pool and given back once
its answer is read: no thread reads frames for another, and nothing runs in
the background. What kilnd sends an idle connection (a ping, a GOAWAY) is read
when the connection is next taken.
"""

# _socket, not socket: socket's module and the two it imports (selectors,
# select) cost a cold process about 40 ms under Wine, where no stock import
# loads them.
import _socket
import os
import struct
import threading
import time

from kiln.service import http2
from kiln.service.errors import RpcError, StatusCode, status_code

# kilnd answers a local connection in milliseconds; a missing one fails at once.
CONNECT_TIMEOUT = http2.TICK
# Idle connections are closed by the client itself after this long, before
# kilnd's idle limit (tcp_idle_seconds, 300 s by default, closing after half
# of it at the earliest) does.
_IDLE_SECONDS = 60.0
# An idle connection read this recently needs no read again before it carries a
# call: connection.connect() asks Channel.connected() right before each call,
# and that read (three socket calls under Windows) is the call's own check. A
# close or GOAWAY from kilnd in between is caught as any other (Channel.start).
_JUST_READ_SECONDS = 0.01
_KEPT_IDLE = 4
# The largest answer read: kilnd's own largest request (max_request_size's
# default), which bounds what it stores and so what it answers. A peer that
# announces more is refused before any of it is buffered.
MAX_MESSAGE = 64 << 20

# gRPC's mapping of an HTTP/2 stream error, and of an HTTP status without a gRPC one.
_RESET_STATUS = {7: StatusCode.UNAVAILABLE, 8: StatusCode.CANCELLED, 11: StatusCode.RESOURCE_EXHAUSTED,
                 12: StatusCode.PERMISSION_DENIED}
_HTTP_STATUS = {"400": StatusCode.INTERNAL, "401": StatusCode.UNAUTHENTICATED, "403": StatusCode.PERMISSION_DENIED,
                "404": StatusCode.UNIMPLEMENTED, "429": StatusCode.UNAVAILABLE, "502": StatusCode.UNAVAILABLE,
                "503": StatusCode.UNAVAILABLE, "504": StatusCode.UNAVAILABLE}
_MESSAGE_PREFIX = struct.Struct(">BI")


def serves(target):
    """Whether `target` is one this module reaches: kilnd's Unix socket, or a
    loopback HOST:PORT (Windows' endpoint file). Not TLS, not other hosts."""
    if target.startswith("unix:"):
        return hasattr(_socket, "AF_UNIX")
    host, _, port = target.rpartition(":")
    return port.isdigit() and (host in ("localhost", "[::1]") or (
        host.startswith("127.") and host.replace(".", "").isdigit()))  # not "127.0.0.1:1,127.0.0.1" (a fleet)


def _address(target):
    if target.startswith("unix:"):
        return _socket.AF_UNIX, target[len("unix:"):]
    host, _, port = target.rpartition(":")
    if host.startswith("["):
        return _socket.AF_INET6, (host.strip("[]"), int(port))
    return _socket.AF_INET, ("127.0.0.1" if host == "localhost" else host, int(port))


def _timeout_header(seconds):
    """grpc-timeout: at most 8 digits, in the finest unit that holds them."""
    for unit, per_second in (("u", 1_000_000), ("m", 1000), ("S", 1)):
        value = int(seconds * per_second) + 1
        if value < 100_000_000:
            return f"{value}{unit}"
    return "99999999S"


def _percent_decoded(text):
    """grpc-message is percent-encoded UTF-8."""
    if "%" not in text:
        return text
    raw, index = bytearray(), 0
    encoded = text.encode("latin-1")
    while index < len(encoded):
        if encoded[index] == 0x25 and index + 2 < len(encoded):
            try:
                raw.append(int(encoded[index + 1:index + 3], 16))
                index += 3
                continue
            except ValueError:
                pass
        raw.append(encoded[index])
        index += 1
    return raw.decode("utf-8", "replace")


class _Connection(http2.Connection):
    """A connection to kilnd carrying one gRPC call at a time."""

    def __init__(self, address, connect_timeout):
        super().__init__(address, connect_timeout)
        self.early = None  # a frame of the call's answer, read while its request was still going out
        self.used_at = time.monotonic()
        self.read_at = None  # when usable() last found nothing from kilnd to stop it

    def usable(self):
        """Whether this idle connection can carry a call: open, recently used,
        and kilnd has not closed it or said GOAWAY since (read without waiting)."""
        now = time.monotonic()
        if (not (self.open and self.writable) or self.pid != os.getpid() or self.last_stream_served is not None
                or now - self.used_at > _IDLE_SECONDS):
            return False
        if self.read_at is not None and now - self.read_at < _JUST_READ_SECONDS:
            return True
        try:
            if not self.read_idle():
                return False  # a frame of no call: nothing here is what this client expects
        except Exception:  # noqa: BLE001  (whatever kilnd did to it, a new connection carries the call)
            return False
        if self.last_stream_served is not None:
            return False
        self.read_at = now
        return True

    def send(self, path, metadata, message, timeout):
        """Starts a call: its request, as far as kilnd's windows let it; returns
        early if kilnd answers before it has all of it."""
        self.read_at = None  # what kilnd sends from here on is this call's to read
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
                  ("content-type", "application/grpc"), ("te", "trailers")]
        if timeout is not None:
            fields.append(("grpc-timeout", _timeout_header(timeout)))
        body = _MESSAGE_PREFIX.pack(0, len(message)) + message
        self.early = self.start_stream(fields + list(metadata), body,
                                       None if timeout is None else time.monotonic() + timeout)

    def responses(self):
        """Each message of the answer; at its end, its status: RpcError unless OK."""
        data, headers_seen = bytearray(), False
        while True:
            if self.early is not None:
                found, self.early = self.early, None
            else:
                found = self.next_frame()
            kind, flags, payload = found
            if kind == http2.RST_STREAM:
                raise RpcError(_RESET_STATUS.get(payload, StatusCode.INTERNAL),
                               f"kilnd reset the call (HTTP/2 error {payload})")
            if kind == http2.HEADERS:
                fields = dict(payload)
                if not headers_seen and fields.get(":status", "200") != "200":
                    status = fields[":status"]
                    raise RpcError(_HTTP_STATUS.get(status, StatusCode.UNKNOWN), f"kilnd answered HTTP {status}")
                headers_seen = True
                if flags & http2.END_STREAM:
                    self._end(fields)
                    return
            else:
                data += payload
                while len(data) >= 5:
                    compressed, length = _MESSAGE_PREFIX.unpack_from(data)
                    if compressed:
                        raise _Refused(StatusCode.INTERNAL, "kilnd sent a compressed message, which this client "
                                                            "did not ask for")
                    if length > MAX_MESSAGE:
                        raise _Refused(StatusCode.RESOURCE_EXHAUSTED,
                                       f"kilnd announced an answer of {length} bytes, past the {MAX_MESSAGE} "
                                       "this client reads")
                    if len(data) < 5 + length:
                        break
                    message = bytes(data[5:5 + length])
                    del data[:5 + length]
                    yield message
                if flags & http2.END_STREAM:
                    raise RpcError(StatusCode.INTERNAL, "kilnd ended the call without a status")

    @staticmethod
    def _end(trailers):
        status = trailers.get("grpc-status")
        if status is None:
            raise RpcError(StatusCode.INTERNAL, "kilnd ended the call without a status")
        if status != "0":
            # isdigit() alone passes "²", which int() refuses, as it refuses more than 4300 digits.
            readable = status.isascii() and status.isdigit() and len(status) <= 10
            code = status_code(int(status)) if readable else StatusCode.UNKNOWN
            raise RpcError(code, _percent_decoded(trailers.get("grpc-message", "")))

    def reset(self):
        """Cancels the call on it; the connection stays usable."""
        if self.pid != os.getpid():
            self.close()
            return
        super().reset()


class _Refused(RpcError):
    """An answer this client will not read: the connection it is on goes."""


class Channel:
    """Calls to one kilnd at `target` ("unix:PATH" or a loopback "HOST:PORT"),
    sending `token` (from kilnd's endpoint file) with each. Offers what
    api.KilnStub uses of a grpc channel."""

    def __init__(self, target, token=None):
        self.target = target
        self._address = _address(target)
        self._metadata = (("x-kiln-token", token),) if token else ()
        self._idle = []
        self._busy = 0
        self._lock = threading.Lock()

    def unary_unary(self, method, request_serializer, response_deserializer):
        return _UnaryMethod(self, method, request_serializer, response_deserializer)

    def unary_stream(self, method, request_serializer, response_deserializer):
        return _StreamMethod(self, method, request_serializer, response_deserializer)

    def _take(self, timeout):
        """(a connection, whether it carried calls before)."""
        with self._lock:
            self._busy += 1
            while self._idle:
                connection = self._idle.pop()
                if connection.usable():
                    return connection, True
                connection.close()
        try:
            return _Connection(self._address, CONNECT_TIMEOUT if timeout is None else
                               max(0.001, min(timeout, CONNECT_TIMEOUT))), False
        except OSError as error:
            with self._lock:
                self._busy -= 1
            raise RpcError(StatusCode.UNAVAILABLE, f"cannot connect to kilnd at {self.target} ({error})") from None

    def _give_back(self, connection):
        with self._lock:
            self._busy -= 1
            if (connection.open and connection.writable and connection.pid == os.getpid()
                    and connection.last_stream_served is None and len(self._idle) < _KEPT_IDLE):
                connection.used_at = time.monotonic()
                self._idle.append(connection)
                return
        connection.close()

    def _drop(self, connection):
        with self._lock:
            self._busy -= 1
        connection.close()

    def start(self, method, request_bytes, timeout, metadata):
        """A connection with the call sent on it. A reused connection that kilnd
        turns out to have closed is swapped for a new one."""
        while True:
            connection, reused = self._take(timeout)
            try:
                connection.send(method, self._metadata + tuple(metadata or ()), request_bytes, timeout)
                return connection
            except BaseException as error:
                self._drop(connection)
                if reused and isinstance(error, (OSError, http2.Broken)) and not isinstance(error, http2.Unresponsive):
                    continue  # kilnd closed it while it was idle: a new connection
                raise _status_of(error, self.target) from None

    def connected(self):
        """Whether a connection to kilnd is live now (no call made)."""
        with self._lock:
            if self._busy:
                return True
            while self._idle:
                if self._idle[-1].usable():
                    return True
                self._idle.pop().close()
        return False

    def ready(self, timeout):
        """Whether kilnd answers HTTP/2 within `timeout`: its SETTINGS, valid.
        Raises http2.Misbehaved for a peer that answers, breaking a rule:
        what listens there is no kilnd to wait for, nor to start another beside."""
        deadline = time.monotonic() + timeout
        try:
            connection = _Connection(self._address, timeout)
        except OSError:
            return False
        try:
            connection.wait_for_settings(deadline)
        except http2.Misbehaved:
            connection.close()
            raise
        except Exception:  # noqa: BLE001  (whatever is at kilnd's address, it is not a kilnd that answers)
            connection.close()
            return False
        with self._lock:
            self._busy += 1
        self._give_back(connection)
        return True

    def close(self):
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


def _status_of(error, target):
    """The RpcError a call raises for `error`: every failure of the transport is one."""
    if isinstance(error, RpcError) or not isinstance(error, Exception):
        return error  # KeyboardInterrupt, SystemExit: the program's own
    if isinstance(error, http2.DeadlinePassed):
        return RpcError(StatusCode.DEADLINE_EXCEEDED, f"kilnd at {target} did not answer within the call's deadline")
    if isinstance(error, http2.Unresponsive):
        return RpcError(StatusCode.UNAVAILABLE, f"kilnd at {target} stopped answering: {error}")
    if isinstance(error, (OSError, http2.Broken)):
        return RpcError(StatusCode.UNAVAILABLE, f"the connection to kilnd at {target} failed ({error})")
    return RpcError(StatusCode.INTERNAL, f"the client's connection to kilnd at {target} failed "
                                         f"({type(error).__name__}: {error})")


class _UnaryMethod:
    def __init__(self, channel, method, serialize, deserialize):
        self._channel, self._method = channel, method
        self._serialize, self._deserialize = serialize, deserialize

    def __call__(self, request, timeout=None, metadata=None):
        request_bytes = self._serialize(request)
        try:
            return self._start(request_bytes, timeout, metadata).result()
        except _Unserved:  # kilnd closed the connection without starting the call
            return self._start(request_bytes, timeout, metadata).result()

    def future(self, request, timeout=None, metadata=None):
        """The call sent; its answer read when asked for (kilnd works meanwhile)."""
        return self._start(self._serialize(request), timeout, metadata)

    def _start(self, request_bytes, timeout, metadata):
        connection = self._channel.start(self._method, request_bytes, timeout, metadata)
        return _Call(self._channel, connection, self._deserialize)


class _StreamMethod(_UnaryMethod):
    def __call__(self, request, timeout=None, metadata=None):
        return self.future(request, timeout, metadata)


class _Unserved(RpcError):
    """UNAVAILABLE, for a call kilnd said it never started (its GOAWAY)."""


class _Call:
    """A call in progress: result() for a unary answer, iteration for a
    stream's messages; cancel() from any thread."""

    def __init__(self, channel, connection, deserialize):
        self._channel, self._connection, self._deserialize = channel, connection, deserialize
        self._messages = connection.responses()
        self._reading = threading.Lock()  # held while a thread waits for kilnd
        self._cancelled = False
        self._outcome = None  # (answer, None) or (None, RpcError), once a unary answer is in

    def _next_message(self):
        """The next message, or None at the end of the answer (the connection
        then goes back to the pool). Holds self._reading."""
        connection = self._connection
        if connection is None or self._cancelled:
            raise RpcError(StatusCode.CANCELLED, "the call was cancelled")
        try:
            return next(self._messages)
        except StopIteration:
            self._finish(connection, reusable=True)
            return None
        except _Refused:
            self._finish(connection, reusable=False)  # the rest of the answer would still come
            raise
        except RpcError:
            self._finish(connection, reusable=True)  # kilnd ended the call; the connection goes on
            raise
        except BaseException as error:
            self._finish(connection, reusable=False)
            if self._cancelled:
                raise RpcError(StatusCode.CANCELLED, "the call was cancelled") from None
            if connection.last_stream_served is not None and connection.stream > connection.last_stream_served:
                raise _Unserved(StatusCode.UNAVAILABLE, f"kilnd closed the connection before the call ({error})") from None
            raise _status_of(error, self._channel.target) from None

    def _finish(self, connection, reusable):
        self._connection = None
        if reusable:
            self._channel._give_back(connection)
        else:
            self._channel._drop(connection)

    def result(self):
        with self._reading:
            if self._outcome is None:
                try:
                    message = self._next_message()
                    if message is None:
                        raise RpcError(StatusCode.INTERNAL, "kilnd ended the call without an answer")
                    while self._next_message() is not None:
                        pass
                    self._outcome = (self._decoded(message), None)
                except RpcError as error:
                    self._outcome = (None, error)
            answer, error = self._outcome
        if error is not None:
            raise error
        return answer

    def __iter__(self):
        return self

    def __next__(self):
        with self._reading:
            message = self._next_message()
        if message is None:
            raise StopIteration
        return self._decoded(message)

    def _decoded(self, message):
        try:
            return self._deserialize(message)
        except Exception as error:  # noqa: BLE001  (bytes from kilnd: never a traceback of the program's)
            raise RpcError(StatusCode.INTERNAL, f"kilnd's answer cannot be read ({error})") from None

    def __del__(self):
        # As a grpc call does: one dropped unfinished ends at kilnd (a claim with it).
        try:
            self.cancel()
        except Exception:  # noqa: BLE001  (at interpreter exit, the socket closes anyway)
            pass

    def cancel(self):
        """Ends the call at kilnd now (a claim it holds is released); True if it was still going."""
        if self._connection is None:
            return False
        self._cancelled = True
        if not self._reading.acquire(blocking=False):
            # A thread waits for kilnd's answer: the connection's end wakes it.
            connection = self._connection
            if connection is not None and connection.pid == os.getpid():
                try:
                    connection.socket.shutdown(_socket.SHUT_RDWR)
                except OSError:
                    pass
            return True
        try:
            connection, self._connection = self._connection, None
            if connection is None:
                return False
            connection.reset()
            self._messages.close()
            self._channel._give_back(connection)
            return True
        finally:
            self._reading.release()
