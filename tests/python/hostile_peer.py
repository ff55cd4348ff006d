"""A scripted HTTP/2 server in kilnd's place that breaks one rule or limit of
a well-behaved peer (BEHAVIOURS), on a Unix socket (the client's own
transport) or on TCP with TLS and ALPN h2 (grpcio's, a farm's path).

A stand-in for a kilnd that is stuck, broken or hostile: what is tested is the
client, which no real kilnd makes misbehave this way. One more behaviour
breaks no rule ("slow-reader": a large window, read slowly, then answered):
a healthy kilnd on a loaded machine, which no real kilnd is made into on cue."""

import socket
import ssl
import struct
import threading
import time

import hpack as reference_hpack

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_FRAME = 16384  # the smallest frame every client takes


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def settings(*pairs):
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", setting, value) for setting, value in pairs))


# What each behaviour sends first, in place of a server's SETTINGS, and
# whether it answers the client's PINGs. The answers to requests are in
# HostilePeer._answer.
_OPENINGS = {
    "silent-after-settings": settings(),
    "ping-every-second": settings(),
    "ping-flood": b"",  # PINGs from the start, no SETTINGS
    "ping-flood-after-settings": settings(),
    "zero-window": settings((4, 0)),  # SETTINGS_INITIAL_WINDOW_SIZE 0, and no WINDOW_UPDATE ever
    "bad-settings": settings((5, 0)),  # SETTINGS_MAX_FRAME_SIZE 0
    "bad-settings-window": settings((4, 2**31)),
    "bad-settings-push": settings((2, 2)),
    "short-frame": frame(WINDOW_UPDATE, 0, 0, b"\0\1"),  # 2 bytes of 4, before SETTINGS
    "truncated-frame": settings() + frame(PING, 0, 0, b"\0" * 8)[:12],  # its header says more than follows
    "endless-continuation": settings(),
    "huge-header-list": settings(),
    "huge-message": settings(),
    # 64 MiB windows, the stream's and the connection's; the request read at
    # 16 KiB each 5 ms, then answered OK with an empty message.
    "slow-reader": settings((4, 64 << 20)) + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 64 << 20)),
}
_HEALTHY = ("slow-reader",)
BEHAVIOURS = tuple(name for name in _OPENINGS if name not in _HEALTHY)
# The ones the acceptance names; the others are variants for the transport's own tests.
NAMED = ("endless-continuation", "huge-header-list", "huge-message", "bad-settings", "zero-window", "ping-flood",
         "short-frame", "silent-after-settings", "ping-every-second")
_ANSWERS_PINGS = {"zero-window", "huge-message", "endless-continuation", "huge-header-list", "ping-flood",
                  "ping-flood-after-settings", "slow-reader"}


class HostilePeer:
    """Serves `behaviour` to every connection, on `unix_path` or, with `tls`
    ((certificate, key) files), on 127.0.0.1 over TLS; .target is what a
    client's KILN_ENDPOINT names."""

    def __init__(self, behaviour, unix_path=None, tls=None):
        assert behaviour in _OPENINGS, behaviour
        self.behaviour = behaviour
        self.closed = threading.Event()
        self.bytes_sent = 0
        if unix_path is not None:
            self.listener = socket.socket(socket.AF_UNIX)
            self.listener.bind(str(unix_path))
            self.target = f"unix:{unix_path}"
            self.tls = None
        else:
            self.listener = socket.socket(socket.AF_INET)
            self.listener.bind(("127.0.0.1", 0))
            self.target = f"grpcs://127.0.0.1:{self.listener.getsockname()[1]}"
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.tls.load_cert_chain(*map(str, tls))
            self.tls.set_alpn_protocols(["h2"])
        self.listener.listen(16)
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self):
        self.closed.set()
        self.listener.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _serve(self):
        while not self.closed.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(connection,), daemon=True).start()

    def _connection(self, connection):
        try:
            if self.tls is not None:
                connection = self.tls.wrap_socket(connection, server_side=True)
            _Session(self, connection).run()
        except (OSError, ValueError, ssl.SSLError):
            pass  # the client gave up on it: what the tests want
        finally:
            connection.close()


class _Session:
    """One connection: a reader of the client's frames (windows, requests,
    PINGs) and the behaviour's writes."""

    def __init__(self, peer, connection):
        self.peer, self.connection = peer, connection
        self.lock = threading.Lock()
        self.window = 65535  # the client's connection window, as it opens it
        self.stream_windows = {}
        self.initial_window = 65535
        self.requests = []
        self.changed = threading.Condition(self.lock)
        self.encoder = reference_hpack.Encoder()

    def send(self, data):
        with self.lock:
            self.connection.sendall(data)
        self.peer.bytes_sent += len(data)

    def run(self):
        reader = self.connection.makefile("rb")
        if reader.read(len(PREFACE)) != PREFACE:
            return
        behaviour = self.peer.behaviour
        self.send(_OPENINGS[behaviour])
        threading.Thread(target=self._read, args=(reader,), daemon=True).start()
        if behaviour.startswith("ping-flood"):
            ping = frame(PING, 0, 0, b"flooding")
            while not self.peer.closed.is_set():
                self.send(ping * 64)
        elif behaviour == "ping-every-second":
            while not self.peer.closed.is_set():
                self.send(frame(PING, 0, 0, b"everysec"))
                time.sleep(1)
        else:
            stream = self._next_request()
            if stream is not None:
                self._answer(behaviour, stream)
            self.peer.closed.wait()

    def _read(self, reader):
        try:
            while True:
                header = reader.read(9)
                if len(header) < 9:
                    return
                length = int.from_bytes(header[:3], "big")
                kind, flags, stream = header[3], header[4], int.from_bytes(header[5:], "big") & 0x7FFFFFFF
                payload = reader.read(length)
                self._client_frame(kind, flags, stream, payload)
                if kind == DATA and self.peer.behaviour == "slow-reader":
                    time.sleep(0.005)
        except (OSError, ValueError):
            return
        finally:
            with self.changed:
                self.requests.append(None)
                self.changed.notify_all()

    def _client_frame(self, kind, flags, stream, payload):
        with self.changed:
            opening = _OPENINGS[self.peer.behaviour]
            if kind == SETTINGS and not flags & ACK and opening[3:4] == bytes((SETTINGS,)):
                for offset in range(0, len(payload), 6):
                    setting, value = struct.unpack_from(">HI", payload, offset)
                    if setting == 4:
                        for key in self.stream_windows:
                            self.stream_windows[key] += value - self.initial_window
                        self.initial_window = value
                self.connection.sendall(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK and self.peer.behaviour in _ANSWERS_PINGS:
                self.connection.sendall(frame(PING, ACK, 0, payload))
            elif kind == WINDOW_UPDATE:
                increment = struct.unpack(">I", payload)[0]
                if stream:
                    self.stream_windows[stream] = self.stream_windows.get(stream, self.initial_window) + increment
                else:
                    self.window += increment
            elif kind in (HEADERS, DATA) and stream:
                self.stream_windows.setdefault(stream, self.initial_window)
                if flags & END_STREAM:
                    self.requests.append(stream)
            self.changed.notify_all()

    def _next_request(self):
        with self.changed:
            self.changed.wait_for(lambda: self.requests)
            return self.requests.pop(0)

    def _headers(self, stream, fields, flags=END_HEADERS):
        return frame(HEADERS, flags, stream, self.encoder.encode(fields))

    def _answer(self, behaviour, stream):
        ok = [(":status", "200"), ("content-type", "application/grpc")]
        if behaviour == "endless-continuation":
            field = b"\x00\x05x-pad\x64" + b"a" * 100  # a literal field, never indexed
            block = field * (_FRAME // len(field))
            self.send(frame(HEADERS, 0, stream, self.encoder.encode(ok)))
            while not self.peer.closed.is_set():
                self.send(frame(CONTINUATION, 0, stream, block))
        elif behaviour == "huge-header-list":
            # One field of 4000 bytes in the table, then indexed 60,000 times:
            # a block of 64 KB whose list is 240 MB.
            value = b"b" * 4000
            block = b"\x40\x06x-bomb" + b"\x7f" + _hpack_integer_tail(len(value), 7) + value + b"\xbe" * 60000
            block = self.encoder.encode(ok) + block
            pieces = [block[start:start + _FRAME] for start in range(0, len(block), _FRAME)]
            self.send(frame(HEADERS, END_HEADERS if len(pieces) == 1 else 0, stream, pieces[0]))
            for index, piece in enumerate(pieces[1:], 2):
                self.send(frame(CONTINUATION, END_HEADERS if index == len(pieces) else 0, stream, piece))
        elif behaviour == "slow-reader":
            self.send(self._headers(stream, ok) + frame(DATA, 0, stream, b"\0" * 5)
                      + self._headers(stream, [("grpc-status", "0")], END_HEADERS | END_STREAM))
        elif behaviour == "huge-message":
            self.send(self._headers(stream, ok))
            self._send_data(stream, struct.pack(">BI", 0, 2**31 - 1))
            zeros = b"\0" * _FRAME
            while not self.peer.closed.is_set():
                if not self._send_data(stream, zeros):
                    return

    def _send_data(self, stream, payload):
        """Sends a DATA frame once the client's windows take it; False once the connection is gone."""
        with self.changed:
            taken = self.changed.wait_for(
                lambda: (self.window >= len(payload) and self.stream_windows.get(stream, 0) >= len(payload))
                or None in self.requests, timeout=30)
            if not taken or None in self.requests:
                return False
            self.window -= len(payload)
            self.stream_windows[stream] -= len(payload)
            self.connection.sendall(frame(DATA, 0, stream, payload))
        self.peer.bytes_sent += len(payload)
        return True


def _hpack_integer_tail(value, prefix_bits):
    """The octets after a prefix of all ones for `value` (RFC 7541 5.1)."""
    value -= (1 << prefix_bits) - 1
    out = bytearray()
    while value >= 0x80:
        out.append(0x80 | value & 0x7F)
        value >>= 7
    out.append(value)
    return bytes(out)
