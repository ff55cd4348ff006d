"""A client's HTTP/2 connection (RFC 9113) to this machine's kilnd: no TLS, one
stream at a time, and the rules it holds the peer to.

kilnd is trusted to be kilnd, not to be well. A kilnd that is stopped,
deadlocked or swapping, or anything else that listens at its socket, must cost
a call seconds and bounded memory: never a hang, a traceback or gigabytes.
- Every wait ends: at the call's deadline, and at a PING this side sends once
  the peer has been quiet for QUIET_SECONDS and that it does not answer within
  PING_TIMEOUT. kilnd's gRPC answers PINGs on threads of its own, so a compile
  that takes minutes keeps its call; a stopped kilnd answers nothing.
- The peer's first frame must be SETTINGS, and its SETTINGS must be valid.
- A header block (CONTINUATION frames included) and the header list it decodes
  to are capped at MAX_HEADER_LIST, which this side announces
  (SETTINGS_MAX_HEADER_LIST_SIZE); frames at the MAX_FRAME it announces.
- Flow control holds both ways: the peer must stay inside the windows this side
  opened, and a request the peer takes none of for SEND_STALL_SECONDS ends.
- A peer that sends frames that are no progress for the call (PINGs, SETTINGS,
  frames of no stream it serves) is answered, up to MAX_IDLE_FRAMES in a row.
A peer that breaks a rule gets GOAWAY with the error's code, and the connection
closes: Broken says what it did.
"""

import _socket  # not socket: see local_grpc
import os
import struct
import time

from kiln.service import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
_HEADER_TABLE_SIZE, _ENABLE_PUSH, _MAX_CONCURRENT_STREAMS, _INITIAL_WINDOW_SIZE, _MAX_FRAME_SIZE, _MAX_HEADER_LIST_SIZE = \
    range(1, 7)
# Error codes (RFC 9113 section 7).
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = \
    0, 1, 3, 6, 8, 9, 11
_NAMES = ("DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING", "GOAWAY", "WINDOW_UPDATE",
          "CONTINUATION")
_FRAME_HEADER = struct.Struct(">HBBBI")  # a 24-bit length as 16 + 8 bits, type, flags, stream
_SETTING = struct.Struct(">HI")
_UINT32 = struct.Struct(">I")
_DEFAULT_WINDOW = 65535
MAX_WINDOW = _LAST_STREAM = 2**31 - 1
_MIN_FRAME, _MAX_FRAME_LIMIT = 16384, 2**24 - 1
# kilnd may send frames this large: a 4 MB answer in 4 frames, not 256.
MAX_FRAME = 1 << 20
# What kilnd's trailers need is a status and a message of a line or two;
# grpcio's own default is 16 KiB.
MAX_HEADER_LIST = 64 << 10
# Where the receive windows, opened as wide as HTTP/2 allows so that kilnd
# never waits on this side, are topped up again.
_REPLENISH_AFTER = 1 << 30
# How long a wait for the peer lasts before the clocks are looked at again
# (the socket's timeout, set once: a system call each time under Windows).
TICK = 2.0
# A peer quiet this long during a call is sent a PING; one that has not
# answered it within PING_TIMEOUT is taken for stopped. Together, with the
# TICK they are looked at, a stopped kilnd costs a call 6 to 8 s.
QUIET_SECONDS = 2.0
PING_TIMEOUT = 4.0
# A request kilnd's windows keep from going out for this long ends, even where
# kilnd answers PINGs: it is taking no calls.
SEND_STALL_SECONDS = 8.0
MAX_IDLE_FRAMES = 10_000


class Broken(Exception):
    """The connection cannot go on: the peer closed it or broke a rule."""


class Unresponsive(Broken):
    """The peer stopped answering: a PING unanswered, or a request it takes none of."""


class Misbehaved(Broken):
    """The peer broke a rule of HTTP/2 or a limit of this client's."""


class DeadlinePassed(Exception):
    """The call's deadline passed before the peer answered it."""


def frame(kind, flags, stream, length=0):
    """A frame's header; its payload of `length` bytes follows it."""
    return _FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream)


def _named(kind):
    return _NAMES[kind] if kind < len(_NAMES) else f"frame of type {kind}"


def _unpadded(flags, payload):
    if flags & PADDED:
        if not payload or 1 + payload[0] > len(payload):
            raise _ProtocolError(PROTOCOL_ERROR, "a frame padded past its length")
        return payload[1:len(payload) - payload[0]]
    return payload


class _ProtocolError(Exception):
    """A rule the peer broke: (HTTP/2 error code, what it did)."""

    def __init__(self, code, what):
        super().__init__(what)
        self.code = code


# The payload length each frame type of fixed size must have (FRAME_SIZE_ERROR otherwise).
_FIXED_LENGTH = {PRIORITY: 5, RST_STREAM: 4, PING: 8, WINDOW_UPDATE: 4}


class Connection:
    """One HTTP/2 connection to kilnd, carrying one stream at a time: open()
    sends a request, next_frame() reads its answer."""

    def __init__(self, address, connect_timeout):
        family, where = address
        self.socket = _socket.socket(family, _socket.SOCK_STREAM)
        try:
            self.socket.settimeout(connect_timeout)
            self.socket.connect(where)
            if connect_timeout != TICK:
                self.socket.settimeout(TICK)
            self.socket_timeout = TICK
            if family != getattr(_socket, "AF_UNIX", None):
                self.socket.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            settings = b"".join(_SETTING.pack(*setting) for setting in (
                (_ENABLE_PUSH, 0), (_INITIAL_WINDOW_SIZE, MAX_WINDOW), (_MAX_FRAME_SIZE, MAX_FRAME),
                (_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST)))
            self.socket.sendall(b"".join((
                PREFACE, frame(SETTINGS, 0, 0, len(settings)), settings,
                frame(WINDOW_UPDATE, 0, 0, 4), _UINT32.pack(MAX_WINDOW - _DEFAULT_WINDOW))))
        except BaseException:
            self.socket.close()
            raise
        self.buffer, self.start = bytearray(), 0
        self.decoder = hpack.Decoder()
        self.peer_initial_window, self.peer_max_frame = _DEFAULT_WINDOW, _MIN_FRAME
        self.send_window = _DEFAULT_WINDOW  # the connection's, toward the peer
        self.receive_window = MAX_WINDOW  # the connection's, from the peer
        self.stream, self.next_stream = 0, 1
        self.stream_send_window = self.stream_receive_window = 0
        self.outgoing = []  # frames to send with the next write
        self.settings_seen = False
        self.last_stream_served = None  # from the peer's GOAWAY
        self.deadline = None  # the open stream's (monotonic)
        self.window_opened_at = 0.0  # when the peer last opened a window the request waits for
        self.open = self.writable = True
        self.ping_sent_at = None  # of the PING this side awaits an answer to
        self.pings_sent = 0
        self.heard_at = time.monotonic()  # the peer's last sign of progress on the call
        self.idle_frames = 0  # frames in a row that were no progress
        # A forked child shares the socket with its parent: it must not write
        # to it (nor shut it down), only close its own descriptor.
        self.pid = os.getpid()

    # -- bytes in and out --

    def flush(self):
        if self.outgoing:
            data, self.outgoing = b"".join(self.outgoing), []
            if self.writable:
                try:
                    self._send_all(data)
                except OSError:
                    # The peer closed the connection, or takes nothing in:
                    # what it sent before (a GOAWAY saying which calls it
                    # started) is read next.
                    self.writable = False

    def _send_all(self, data):
        """Sends all of `data`, for as long as the peer takes some of it at
        least every SEND_STALL_SECONDS: not sendall, whose timeout bounds the
        whole send, which a healthy kilnd reading a large request slowly
        outlasts. Raises OSError (a timeout) once the peer stalls."""
        if self.socket_timeout != TICK:
            # A read without waiting, or one up to a deadline, left a timeout
            # too short to send in.
            self.socket.settimeout(TICK)
            self.socket_timeout = TICK
        view, progress_at = memoryview(data), time.monotonic()
        while view:
            try:
                sent = self.socket.send(view)
            except _socket.timeout:
                if time.monotonic() - progress_at >= SEND_STALL_SECONDS:
                    raise
                continue
            view, progress_at = view[sent:], time.monotonic()

    def _buffered_frame(self):
        """(kind, flags, stream, payload) of the next frame if all of it is in, else None."""
        available = len(self.buffer) - self.start
        if available < 9:
            return None
        high, low, kind, flags, stream = _FRAME_HEADER.unpack_from(self.buffer, self.start)
        length = high << 8 | low
        if length > MAX_FRAME:
            raise _ProtocolError(FRAME_SIZE_ERROR, f"a {length}-byte frame, past the {MAX_FRAME} this client allows")
        if available < 9 + length:
            return None
        payload = bytes(self.buffer[self.start + 9:self.start + 9 + length])
        self.start += 9 + length
        return kind, flags, stream & 0x7FFFFFFF, payload

    def _receive(self, wait):
        """Reads what the peer sent, waiting up to `wait` seconds (0: not at all);
        False when nothing came."""
        if self.start and self.start == len(self.buffer):
            self.buffer.clear()
            self.start = 0
        elif self.start > 1 << 20:
            del self.buffer[:self.start]
            self.start = 0
        if wait != self.socket_timeout:
            self.socket.settimeout(wait)
            self.socket_timeout = wait
        try:
            chunk = self.socket.recv(262144)
        except (BlockingIOError, _socket.timeout):
            return False
        except OSError as error:
            raise Broken(f"the connection to kilnd failed ({error})") from None
        if not chunk:
            raise Broken("kilnd closed the connection")
        self.buffer += chunk
        return True

    def _wait_for_frame(self, deadline, liveness):
        """The next frame, waiting until `deadline` (monotonic; None: none) and,
        with `liveness`, no longer than the peer answers PINGs."""
        while True:
            found = self._buffered_frame()
            if found is not None:
                return found
            self.flush()
            now = time.monotonic()
            expired = deadline is not None and now >= deadline
            unanswered = liveness and self.ping_sent_at is not None and now - self.ping_sent_at >= PING_TIMEOUT
            if (expired or unanswered) and self._receive(0):
                # What already came is read before a clock is judged: an
                # answer read late (a future's result asked for after its
                # deadline, a PING's answer after a long send) still counts.
                continue
            if expired:
                raise DeadlinePassed()
            if liveness:
                self._check_liveness(now)
            self._receive(TICK if deadline is None else max(0.001, min(TICK, deadline - now)))

    def _check_liveness(self, now):
        if self.ping_sent_at is not None:
            if now - self.ping_sent_at >= PING_TIMEOUT:
                raise Unresponsive(f"kilnd answered no PING in {PING_TIMEOUT:.0f} s "
                                   f"and sent nothing for the call in {now - self.heard_at:.0f} s")
        elif now - self.heard_at >= QUIET_SECONDS:
            # A connection that takes nothing more (kilnd stopped reading it)
            # waits for the answer the same time, which only a kilnd that
            # still answers sends.
            self.pings_sent += 1
            self.outgoing += (frame(PING, 0, 0, 8), self.pings_sent.to_bytes(8, "big"))
            self.ping_sent_at = now
            self.flush()

    def _progress(self):
        self.heard_at = time.monotonic()
        self.idle_frames = 0

    def _idle_frame(self):
        self.idle_frames += 1
        if self.idle_frames > MAX_IDLE_FRAMES:
            raise _ProtocolError(ENHANCE_YOUR_CALM, f"{MAX_IDLE_FRAMES} frames in a row that were no answer "
                                                    "(PINGs, SETTINGS or frames of no call)")

    # -- failing --

    def _fail(self, error):
        """Ends the connection over the rule the peer broke (GOAWAY with its
        code) and raises Broken naming it."""
        what = str(error)
        if self.writable and self.pid == os.getpid():
            debug = what.encode("utf-8", "replace")[:256]
            goaway = frame(GOAWAY, 0, 0, 8 + len(debug)) + struct.pack(">II", 0, error.code) + debug
            try:
                self.socket.settimeout(0.0)  # the peer may read nothing: never wait on it
                self.socket.send(goaway)
            except OSError:
                pass
        self.close()
        raise Misbehaved(f"kilnd broke HTTP/2: {what} (error {error.code})") from None

    def close(self):
        self.open = False
        self.socket.close()

    # -- frames of the connection, whichever stream is open --

    def _connection_frame(self, kind, flags, stream, payload):
        """Handles a frame that is not the open stream's: True if it was one."""
        expected = _FIXED_LENGTH.get(kind)
        if expected is not None and len(payload) != expected:
            raise _ProtocolError(FRAME_SIZE_ERROR, f"a {_named(kind)} of {len(payload)} bytes, not {expected}")
        if kind in (SETTINGS, PING, GOAWAY):
            if stream:
                raise _ProtocolError(PROTOCOL_ERROR, f"a {_named(kind)} on stream {stream}")
            if kind == SETTINGS:
                self._settings(flags, payload)
            elif kind == PING:
                if flags & ACK:
                    if self.ping_sent_at is not None and payload == self.pings_sent.to_bytes(8, "big"):
                        self.ping_sent_at = None
                        self._progress()
                        return True
                else:
                    self.outgoing += (frame(PING, ACK, 0, 8), payload)
            else:
                if len(payload) < 8:
                    raise _ProtocolError(FRAME_SIZE_ERROR, f"a GOAWAY of {len(payload)} bytes")
                self.last_stream_served = _UINT32.unpack_from(payload)[0] & 0x7FFFFFFF
            self._idle_frame()
            return True
        if kind == WINDOW_UPDATE:
            self._window_update(stream, _UINT32.unpack(payload)[0] & 0x7FFFFFFF)
            return True
        if not stream:
            if kind in (DATA, HEADERS, RST_STREAM, CONTINUATION, PUSH_PROMISE, PRIORITY):
                raise _ProtocolError(PROTOCOL_ERROR, f"a {_named(kind)} on stream 0")
            self._idle_frame()  # an extension's frame: ignored, as RFC 9113 says
            return True
        if stream != self.stream or not self.stream:
            if not stream & 1 or stream >= self.next_stream:
                raise _ProtocolError(PROTOCOL_ERROR, f"a {_named(kind)} on stream {stream}, "
                                                     "which this client never opened")
            # A stream this client reset: HPACK's state needs its headers, flow control its data.
            if kind in (HEADERS, CONTINUATION):
                self._header_block(kind, flags, stream, payload)
            elif kind == DATA:
                self._count_received(len(payload), this_stream=False)
            self._idle_frame()
            return True
        if kind == PUSH_PROMISE:
            raise _ProtocolError(PROTOCOL_ERROR, "a PUSH_PROMISE, which this client's SETTINGS forbid")
        return False

    def _settings(self, flags, payload):
        if flags & ACK:
            if payload:
                raise _ProtocolError(FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            raise _ProtocolError(FRAME_SIZE_ERROR, f"a SETTINGS frame of {len(payload)} bytes, not a multiple of 6")
        for offset in range(0, len(payload), 6):
            setting, value = _SETTING.unpack_from(payload, offset)
            if setting == _ENABLE_PUSH and value != 0:
                # A server may only switch push off (RFC 9113 6.5.2).
                raise _ProtocolError(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH of {value}")
            if setting == _INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ProtocolError(FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE of {value}")
                if value > self.peer_initial_window:
                    self.window_opened_at = time.monotonic()
                self.stream_send_window += value - self.peer_initial_window
                self.peer_initial_window = value
                if self.stream_send_window > MAX_WINDOW:
                    raise _ProtocolError(FLOW_CONTROL_ERROR, "a stream's window past 2^31-1")
            elif setting == _MAX_FRAME_SIZE:
                if not _MIN_FRAME <= value <= _MAX_FRAME_LIMIT:
                    raise _ProtocolError(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE of {value}")
                self.peer_max_frame = value
        self.outgoing.append(frame(SETTINGS, ACK, 0))
        self.settings_seen = True

    def _window_update(self, stream, increment):
        if not increment:
            raise _ProtocolError(PROTOCOL_ERROR, f"a WINDOW_UPDATE of 0 on stream {stream}")
        if stream == 0:
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise _ProtocolError(FLOW_CONTROL_ERROR, "the connection's window past 2^31-1")
        elif stream == self.stream:
            self.stream_send_window += increment
            if self.stream_send_window > MAX_WINDOW:
                raise _ProtocolError(FLOW_CONTROL_ERROR, f"stream {stream}'s window past 2^31-1")
        else:
            self._idle_frame()
            return
        if self.send_window > 0 and self.stream_send_window > 0:
            # Progress only where bytes may go out: a trickle of updates to one
            # window while the other stays shut would hold the request forever.
            self.window_opened_at = time.monotonic()

    def _header_block(self, kind, flags, stream, payload):
        """The header list of a HEADERS frame and the CONTINUATION frames after it."""
        if kind != HEADERS:
            raise _ProtocolError(PROTOCOL_ERROR, "a CONTINUATION that follows no HEADERS")
        payload = _unpadded(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise _ProtocolError(FRAME_SIZE_ERROR, "a HEADERS frame shorter than its priority")
            payload = payload[5:]
        block = bytearray(payload)
        while not flags & END_HEADERS:
            if len(block) > MAX_HEADER_LIST:
                raise _ProtocolError(ENHANCE_YOUR_CALM, f"a header block past the {MAX_HEADER_LIST} bytes "
                                                        "this client announced")
            # The frames of a header block come back to back: no wait is longer than the call's.
            kind, flags, continued, payload = self._wait_for_frame(self.deadline, liveness=True)
            if kind != CONTINUATION or continued != stream:
                raise _ProtocolError(PROTOCOL_ERROR, "a header block broken off by another frame")
            block += payload
        if len(block) > MAX_HEADER_LIST:
            raise _ProtocolError(ENHANCE_YOUR_CALM, f"a header block past the {MAX_HEADER_LIST} bytes "
                                                    "this client announced")
        try:
            return self.decoder.decode(block, MAX_HEADER_LIST)
        except hpack.HpackError as error:
            raise _ProtocolError(COMPRESSION_ERROR, f"headers that cannot be read ({error})") from None

    def _count_received(self, count, this_stream=True):
        """Holds the peer to the windows this side opened, and tops them up
        again long before they could run out."""
        self.receive_window -= count
        if this_stream:
            self.stream_receive_window -= count
        if self.receive_window < 0 or self.stream_receive_window < 0:
            raise _ProtocolError(FLOW_CONTROL_ERROR, "data past the window this client opened")
        if MAX_WINDOW - self.receive_window > _REPLENISH_AFTER:
            self.outgoing += (frame(WINDOW_UPDATE, 0, 0, 4), _UINT32.pack(MAX_WINDOW - self.receive_window))
            self.receive_window = MAX_WINDOW
        if this_stream and MAX_WINDOW - self.stream_receive_window > _REPLENISH_AFTER:
            self.outgoing += (frame(WINDOW_UPDATE, 0, self.stream, 4),
                              _UINT32.pack(MAX_WINDOW - self.stream_receive_window))
            self.stream_receive_window = MAX_WINDOW

    # -- one stream --

    def wait_for_settings(self, deadline):
        """The peer's SETTINGS, its first frame: its HTTP/2 server answers, not only its socket."""
        try:
            while not self.settings_seen:
                self._first_frame_is_settings(self._wait_for_frame(deadline, liveness=False))
            self.flush()
        except _ProtocolError as error:
            self._fail(error)

    def _first_frame_is_settings(self, frame_read):
        kind, flags, stream, payload = frame_read
        if not self.settings_seen and (kind != SETTINGS or flags & ACK):
            first = "a SETTINGS acknowledgement" if kind == SETTINGS else f"a {_named(kind)}"
            raise _ProtocolError(PROTOCOL_ERROR, f"{first} as its first frame, not its SETTINGS")
        if not self._connection_frame(kind, flags, stream, payload):
            raise _ProtocolError(PROTOCOL_ERROR, f"a {_named(kind)} on stream {stream} before any was opened")

    def read_idle(self):
        """Reads, without waiting, what the peer sent an idle connection; False
        when it sent what no idle connection can take (a frame of a stream)."""
        self.deadline = time.monotonic()  # a header block's rest must be here already
        try:
            self._receive(0.0)
            found = self._buffered_frame()
            while found is not None:
                if not self.settings_seen:
                    self._first_frame_is_settings(found)
                elif not self._connection_frame(*found):
                    return False
                found = self._buffered_frame()
            self.flush()
        except _ProtocolError as error:
            self._fail(error)
        return True

    def start_stream(self, fields, body, deadline):
        """Sends a request (its headers, then `body` as far as the peer's windows
        let it); returns the first frame of the answer if the peer answered
        before it took all of the body, else None."""
        self.deadline = deadline
        self.stream, self.next_stream = self.next_stream, self.next_stream + 2
        if self.stream > _LAST_STREAM:
            raise Broken("the connection has used up its stream numbers")
        self.stream_send_window, self.stream_receive_window = self.peer_initial_window, MAX_WINDOW
        self.window_opened_at = self.heard_at = time.monotonic()
        self.ping_sent_at, self.idle_frames = None, 0
        block = hpack.encode(fields)
        pieces = [block[start:start + self.peer_max_frame] for start in range(0, len(block), self.peer_max_frame)]
        for index, piece in enumerate(pieces):
            kind = HEADERS if index == 0 else CONTINUATION
            self.outgoing += (frame(kind, END_HEADERS if index == len(pieces) - 1 else 0, self.stream, len(piece)),
                              piece)
        body = memoryview(body)
        sent = 0
        try:
            while True:
                allowed = min(self.send_window, self.stream_send_window, self.peer_max_frame, len(body) - sent)
                if allowed <= 0 and sent < len(body):
                    answer = self._wait_for_window(deadline)
                    if answer is not None:
                        return answer
                    continue
                chunk = body[sent:sent + allowed]
                sent += allowed
                self.send_window -= allowed
                self.stream_send_window -= allowed
                ended = sent == len(body)
                self.outgoing += (frame(DATA, END_STREAM if ended else 0, self.stream, len(chunk)), chunk)
                if ended:
                    break
        except _ProtocolError as error:
            self._fail(error)
        self.flush()
        return None

    def _wait_for_window(self, deadline):
        """Reads one frame while the request waits for the peer's windows: the
        answer's first frame if it is one, else None."""
        if time.monotonic() - self.window_opened_at > SEND_STALL_SECONDS:
            raise Unresponsive(f"kilnd took none of the request for {SEND_STALL_SECONDS:.0f} s "
                               "(its flow-control window stayed shut)")
        stall_ends = self.window_opened_at + SEND_STALL_SECONDS + 0.001
        try:
            found = self._wait_for_frame(stall_ends if deadline is None else min(deadline, stall_ends), liveness=True)
        except DeadlinePassed:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            return None  # the stall is looked at again
        return self._stream_frame(found)

    def _stream_frame(self, found):
        """The open stream's frame of `found` (HEADERS with their decoded list,
        DATA unpadded), or None when it was the connection's."""
        kind, flags, stream, payload = found
        if not self.settings_seen:
            self._first_frame_is_settings(found)
            return None
        if self._connection_frame(kind, flags, stream, payload):
            return None
        if kind == HEADERS:
            self._progress()
            return kind, flags, self._header_block(kind, flags, stream, payload)
        if kind == DATA:
            self._count_received(len(payload))
            if payload or flags & END_STREAM:
                self._progress()
            else:
                self._idle_frame()
            return kind, flags, _unpadded(flags, payload)
        if kind == RST_STREAM:
            self._progress()
            return kind, flags, _UINT32.unpack(payload)[0]
        if kind == CONTINUATION:
            raise _ProtocolError(PROTOCOL_ERROR, "a CONTINUATION that follows no HEADERS")
        self._idle_frame()  # PRIORITY, or an extension's frame
        return None

    def next_frame(self):
        """The open stream's next frame: (HEADERS, flags, header list),
        (DATA, flags, bytes) or (RST_STREAM, flags, error code). Raises
        DeadlinePassed, Unresponsive or Broken."""
        try:
            while True:
                found = self._stream_frame(self._wait_for_frame(self.deadline, liveness=True))
                if found is not None:
                    if found[1] & END_STREAM or found[0] == RST_STREAM:
                        self.flush()  # what answers the peer (a PING's ACK) goes now, not with the next call
                    return found
        except _ProtocolError as error:
            self._fail(error)

    def reset(self):
        """Cancels the open stream; the connection stays usable."""
        self.outgoing += (frame(RST_STREAM, 0, self.stream, 4), _UINT32.pack(CANCEL))
        self.flush()
        # What the peer sent of it before it saw the reset is skipped by the
        # next stream on the connection (its headers decoded, for HPACK's state).
        self.stream = 0
