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

from kiln.service import hpack
from kiln.service.errors import RpcError, StatusCode, status_code

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
_END_STREAM = _ACK = 0x1
_END_HEADERS, _PADDED, _PRIORITY = 0x4, 0x8, 0x20
_SETTING_ENABLE_PUSH, _SETTING_INITIAL_WINDOW_SIZE, _SETTING_MAX_FRAME_SIZE = 2, 4, 5
_FRAME_HEADER = struct.Struct(">HBBBI")  # a 24-bit length as 16 + 8 bits, type, flags, stream
_SETTING = struct.Struct(">HI")
_HTTP2_CANCEL = 8
_DEFAULT_WINDOW = 65535
_MAX_WINDOW = 2**31 - 1
# kilnd may send frames this large: a 4 MB answer in 4 frames, not 256.
_MAX_FRAME = 1 << 20
# Where a connection's receive window is topped up again (it starts at the
# most HTTP/2 allows, so kilnd never waits on this client).
_REPLENISH_AFTER = 1 << 30
# kilnd answers a local connection in milliseconds; a missing one fails at once.
CONNECT_TIMEOUT = 2.0
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

# gRPC's mapping of an HTTP/2 stream error, and of an HTTP status without a gRPC one.
_RESET_STATUS = {7: StatusCode.UNAVAILABLE, 8: StatusCode.CANCELLED, 11: StatusCode.RESOURCE_EXHAUSTED,
                 12: StatusCode.PERMISSION_DENIED}
_HTTP_STATUS = {"400": StatusCode.INTERNAL, "401": StatusCode.UNAUTHENTICATED, "403": StatusCode.PERMISSION_DENIED,
                "404": StatusCode.UNIMPLEMENTED, "429": StatusCode.UNAVAILABLE, "502": StatusCode.UNAVAILABLE,
                "503": StatusCode.UNAVAILABLE, "504": StatusCode.UNAVAILABLE}


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


def _frame(kind, flags, stream, length=0):
    """A frame's header; its payload of `length` bytes follows it."""
    return _FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream)


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


class _Closed(Exception):
    """The connection cannot carry the call."""


class _Connection:
    """One HTTP/2 connection to kilnd, carrying one call at a time."""

    def __init__(self, address, timeout):
        family, where = address
        self.socket = _socket.socket(family, _socket.SOCK_STREAM)
        try:
            self.socket.settimeout(timeout)
            self.timeout = timeout
            self.socket.connect(where)
            if family != getattr(_socket, "AF_UNIX", None):
                self.socket.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            settings = b"".join(_SETTING.pack(*setting) for setting in (
                (_SETTING_ENABLE_PUSH, 0), (_SETTING_INITIAL_WINDOW_SIZE, _MAX_WINDOW),
                (_SETTING_MAX_FRAME_SIZE, _MAX_FRAME)))
            self.socket.sendall(b"".join((
                _PREFACE, _frame(_SETTINGS, 0, 0, len(settings)), settings,
                _frame(_WINDOW_UPDATE, 0, 0, 4), struct.pack(">I", _MAX_WINDOW - _DEFAULT_WINDOW))))
        except BaseException:
            self.socket.close()
            raise
        self.buffer, self.start = bytearray(), 0
        self.decoder = hpack.Decoder()
        self.peer_initial_window, self.peer_max_frame = _DEFAULT_WINDOW, 16384
        self.send_window = _DEFAULT_WINDOW  # the connection's, toward kilnd
        self.stream, self.next_stream, self.stream_send_window = 0, 1, 0
        self.received, self.stream_received = 0, 0  # since the windows were last topped up
        self.outgoing = []  # frames to send with the next write
        self.early = None  # a frame of the call's answer, read while its request was still going out
        self.settings_seen = False
        self.last_stream_served = None  # from kilnd's GOAWAY
        self.open = self.writable = True
        self.used_at = time.monotonic()
        self.read_at = None  # when usable() last found nothing from kilnd to stop it
        # A forked child shares the socket with its parent: it must not write
        # to it (nor shut it down), only close its own descriptor.
        self.pid = os.getpid()

    # -- bytes in and out --

    def _flush(self):
        if self.outgoing:
            data, self.outgoing = b"".join(self.outgoing), []
            if self.writable:
                try:
                    self.socket.sendall(data)
                except OSError:
                    # kilnd closed the connection: what it sent before it
                    # (a GOAWAY saying which calls it started) is read next.
                    self.writable = False

    def _fill(self, count):
        while len(self.buffer) - self.start < count:
            if self.start:
                del self.buffer[:self.start]
                self.start = 0
            chunk = self.socket.recv(max(262144, count))
            if not chunk:
                raise _Closed("kilnd closed the connection")
            self.buffer += chunk

    def _read_frame(self):
        self._fill(9)
        high, low, kind, flags, stream = _FRAME_HEADER.unpack_from(self.buffer, self.start)
        length = high << 8 | low
        if length > _MAX_FRAME:
            raise _Closed(f"kilnd sent a {length}-byte frame, past the {_MAX_FRAME} this client allows")
        self._fill(9 + length)
        payload = bytes(self.buffer[self.start + 9:self.start + 9 + length])
        self.start += 9 + length
        return kind, flags, stream & 0x7FFFFFFF, payload

    def _buffered_frame(self):
        """The next frame if all of it has arrived, else None: reads without waiting."""
        while True:
            available = len(self.buffer) - self.start
            if available >= 9:
                high, low = _FRAME_HEADER.unpack_from(self.buffer, self.start)[:2]
                if available >= 9 + (high << 8 | low):
                    return self._read_frame()
            self.socket.settimeout(0.0)
            try:
                chunk = self.socket.recv(262144)
            except BlockingIOError:
                return None  # nothing more has come
            finally:
                self.socket.settimeout(self.timeout)
            if not chunk:
                raise _Closed("kilnd closed the connection")
            self.buffer += chunk

    # -- frames of the connection, whichever call is on it --

    def _connection_frame(self, kind, flags, stream, payload):
        """Handles a frame about the connection (or a stream's send window);
        False for one of a stream's own."""
        if kind == _SETTINGS:
            if not flags & _ACK:
                for offset in range(0, len(payload) - 5, 6):
                    setting, value = _SETTING.unpack_from(payload, offset)
                    if setting == _SETTING_INITIAL_WINDOW_SIZE:
                        self.stream_send_window += value - self.peer_initial_window
                        self.peer_initial_window = value
                    elif setting == _SETTING_MAX_FRAME_SIZE:
                        self.peer_max_frame = value
                self.outgoing.append(_frame(_SETTINGS, _ACK, 0))
                self.settings_seen = True
        elif kind == _PING:
            if not flags & _ACK:
                self.outgoing += (_frame(_PING, _ACK, 0, len(payload)), payload)
        elif kind == _WINDOW_UPDATE:
            increment = struct.unpack_from(">I", payload)[0] & 0x7FFFFFFF
            if stream == 0:
                self.send_window += increment
            elif stream == self.stream:
                self.stream_send_window += increment
        elif kind == _GOAWAY:
            self.last_stream_served = struct.unpack_from(">I", payload)[0] & 0x7FFFFFFF
        elif stream == self.stream:
            return False
        elif kind in (_HEADERS, _CONTINUATION):
            self._header_block(kind, flags, payload)  # of a stream this client reset: HPACK's state needs it
        elif kind == _DATA:
            self._count_received(len(payload), this_stream=False)
        return True

    def _header_block(self, kind, flags, payload):
        if kind == _HEADERS:
            payload = self._unpadded(flags, payload)
            if flags & _PRIORITY:
                payload = payload[5:]
        block = payload
        while not flags & _END_HEADERS:
            kind, flags, _, payload = self._read_frame()
            if kind != _CONTINUATION:
                raise _Closed("kilnd broke a header block off (HTTP/2 protocol error)")
            block += payload
        try:
            return self.decoder.decode(block)
        except hpack.HpackError as error:
            raise _Closed(f"kilnd's headers cannot be read ({error})") from None

    @staticmethod
    def _unpadded(flags, payload):
        if flags & _PADDED:
            padding = payload[0] if payload else 0
            if 1 + padding > len(payload):
                raise _Closed("kilnd sent a frame padded past its length (HTTP/2 protocol error)")
            return payload[1:len(payload) - padding]
        return payload

    def _count_received(self, count, this_stream=True):
        """Tops kilnd's windows up again long before they could run out."""
        self.received += count
        if this_stream:
            self.stream_received += count
        if self.received > _REPLENISH_AFTER:
            self.outgoing += (_frame(_WINDOW_UPDATE, 0, 0, 4), struct.pack(">I", self.received))
            self.received = 0
        if self.stream_received > _REPLENISH_AFTER:
            self.outgoing += (_frame(_WINDOW_UPDATE, 0, self.stream, 4), struct.pack(">I", self.stream_received))
            self.stream_received = 0

    # -- one call --

    def wait_for_settings(self):
        """kilnd's SETTINGS: its HTTP/2 server answers, not only its socket."""
        while not self.settings_seen:
            self._connection_frame(*self._read_frame())
        self._flush()

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
            frame = self._buffered_frame()
            while frame is not None:
                if not self._connection_frame(*frame):
                    return False  # a frame of no call: nothing here is what this client expects
                frame = self._buffered_frame()
            self._flush()
        except (OSError, _Closed):
            return False
        if self.last_stream_served is not None:
            return False
        self.read_at = now
        return True

    def send(self, path, metadata, message, timeout):
        """Starts a call: its request, as far as kilnd's windows let it; returns
        early if kilnd answers before it has all of it."""
        self.read_at = None  # what kilnd sends from here on is this call's to read
        if timeout != self.timeout:  # a system call each time under Windows: only when it changes
            self.socket.settimeout(timeout)
            self.timeout = timeout
        self.stream, self.next_stream = self.next_stream, self.next_stream + 2
        self.stream_send_window, self.stream_received = self.peer_initial_window, 0
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
                  ("content-type", "application/grpc"), ("te", "trailers")]
        if timeout is not None:
            fields.append(("grpc-timeout", _timeout_header(timeout)))
        block = hpack.encode(fields + list(metadata))
        self.outgoing += (_frame(_HEADERS, _END_HEADERS, self.stream, len(block)), block)
        body = memoryview(struct.pack(">BI", 0, len(message)) + message)
        sent = 0
        while True:
            allowed = min(self.send_window, self.stream_send_window, self.peer_max_frame, len(body) - sent)
            if allowed <= 0 and sent < len(body):
                self._flush()
                kind, flags, stream, payload = self._read_frame()
                if not self._connection_frame(kind, flags, stream, payload):
                    self.early = (kind, flags, stream, payload)  # kilnd answered before taking it all
                    return
                continue
            chunk = body[sent:sent + allowed]
            sent += allowed
            self.send_window -= allowed
            self.stream_send_window -= allowed
            ended = sent == len(body)
            self.outgoing += (_frame(_DATA, _END_STREAM if ended else 0, self.stream, len(chunk)), chunk)
            if ended:
                break
        self._flush()

    def responses(self):
        """Each message of the answer; at its end, its status: RpcError unless OK."""
        data, headers_seen = bytearray(), False
        while True:
            if self.early is not None:
                frame, self.early = self.early, None
            else:
                self._flush()
                frame = self._read_frame()
            kind, flags, stream, payload = frame
            if self._connection_frame(kind, flags, stream, payload):
                continue
            if kind == _RST_STREAM:
                code = struct.unpack_from(">I", payload)[0]
                raise RpcError(_RESET_STATUS.get(code, StatusCode.INTERNAL),
                               f"kilnd reset the call (HTTP/2 error {code})")
            if kind == _HEADERS:
                fields = dict(self._header_block(kind, flags, payload))
                if not headers_seen and fields.get(":status", "200") != "200":
                    status = fields[":status"]
                    raise RpcError(_HTTP_STATUS.get(status, StatusCode.UNKNOWN), f"kilnd answered HTTP {status}")
                headers_seen = True
                if flags & _END_STREAM:
                    self._end(fields)
                    return
            elif kind == _DATA:
                self._count_received(len(payload))
                data += self._unpadded(flags, payload)
                while len(data) >= 5:
                    compressed, length = struct.unpack_from(">BI", data)
                    if len(data) < 5 + length:
                        break
                    if compressed:
                        raise RpcError(StatusCode.INTERNAL, "kilnd sent a compressed message, which this client "
                                                            "did not ask for")
                    message = bytes(data[5:5 + length])
                    del data[:5 + length]
                    yield message
                if flags & _END_STREAM:
                    raise RpcError(StatusCode.INTERNAL, "kilnd ended the call without a status")

    @staticmethod
    def _end(trailers):
        status = trailers.get("grpc-status")
        if status is None:
            raise RpcError(StatusCode.INTERNAL, "kilnd ended the call without a status")
        if status != "0":
            code = status_code(int(status)) if status.isdigit() else StatusCode.UNKNOWN
            raise RpcError(code, _percent_decoded(trailers.get("grpc-message", "")))

    def reset(self):
        """Cancels the call on it; the connection stays usable."""
        if self.pid != os.getpid():
            self.close()
            return
        self.outgoing += (_frame(_RST_STREAM, 0, self.stream, 4), struct.pack(">I", _HTTP2_CANCEL))
        self._flush()
        # What kilnd sent of the call before it saw the reset is skipped by the
        # next call on the connection (its headers decoded, for HPACK's state).
        self.stream = 0

    def close(self):
        self.open = False
        self.socket.close()


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
            return _Connection(self._address, CONNECT_TIMEOUT if timeout is None else min(timeout, CONNECT_TIMEOUT)), False
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
                if reused and isinstance(error, (OSError, _Closed)) and not isinstance(error, _socket.timeout):
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
        """Whether kilnd answers HTTP/2 within `timeout`."""
        try:
            connection = _Connection(self._address, timeout)
        except OSError:
            return False
        try:
            connection.wait_for_settings()
        except (OSError, _Closed):
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
    if isinstance(error, RpcError):
        return error
    if isinstance(error, _socket.timeout):
        return RpcError(StatusCode.DEADLINE_EXCEEDED, "kilnd did not answer in time")
    if isinstance(error, (OSError, _Closed)):
        return RpcError(StatusCode.UNAVAILABLE, f"the connection to kilnd at {target} failed ({error})")
    return error


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
                    self._outcome = (self._deserialize(message), None)
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
        return self._deserialize(message)

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
