#!/usr/bin/env python3
"""Fuzzes the client's HTTP/2 frame reader (kiln.service.http2, as
local_grpc's connection uses it for a call) with what a peer in kilnd's place
sends.

Feeds: three octets of set-up, then the octets the peer sends, which a stand-in
socket hands out (no socket, no thread: the run is the same every time).
- octet 0: how the connection meets them: 0 waits for the peer's SETTINGS
  first (Channel.ready), 1 reads them as an idle connection (read_idle), 2
  sends the call straight away;
- octet 1: how many octets a recv gets (0: all there are), and with its top
  bit set, a timeout before every other recv;
- octet 2: the request's size: bit 0 set sends one past the 65,535 octets of
  HTTP/2's first window, so that the call waits for the peer's WINDOW_UPDATE;
  its other 7 bits, in mode 1, how many whole frames came before the call
  (what the idle read sees), the rest coming after the call is sent.
The call is a Lookup whose answer is read through local_grpc's responses().

Asserts:
- the call raises nothing but the transport's errors (http2.Broken, its
  Misbehaved and Unresponsive, http2.DeadlinePassed) or an RpcError that
  responses() makes of the answer: never IndexError, struct.error,
  UnicodeDecodeError, ValueError, RecursionError, MemoryError...;
- every frame next_frame() hands the call is one the peer sent on the call's
  stream, in order, as RFC 9113 lays it out (frames parsed here
  independently): DATA its payload less its padding, RST_STREAM its error
  code, HEADERS the header list the hpack package decodes from the block
  (the HEADERS and its CONTINUATIONs, less padding and priority);
- what the client sends is whole frames after the preface.
A hang is caught by libFuzzer's -timeout (run_fuzzers.py sets it); memory by
-rss_limit_mb.

Run: python fuzz_frames.py [libFuzzer flags] [corpus dirs or files]; see run_fuzzers.py.
"""

import _socket
import struct
import sys
import types
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "client" / "python"))  # the checkout's client

import hpack as reference_hpack  # noqa: E402

with atheris.instrument_imports(include=["kiln"]):
    from kiln.service import api, http2, local_grpc
    from kiln.service.errors import RpcError

REQUEST = api.LookupRequest(namespace="triton", key="ab" * 32).SerializeToString()
BODY_SIZES = (0, 70_000)  # the request's padding: within HTTP/2's first window, and past it
TRANSPORT_ERRORS = (http2.Broken, http2.DeadlinePassed, RpcError)
CALL_STREAM = 1  # a new connection's first stream


class _PeerSocket:
    """Stands in for the connection's socket: recv hands out the peer's
    octets, `chunk` at a time, then the end of the connection; what the
    client sends is kept in `sent`."""

    def __init__(self, octets, chunk, stalls):
        self.octets, self.chunk, self.stalls = memoryview(octets), chunk, stalls
        self.position, self.recvs = 0, 0
        self.sent = bytearray()
        self.held_from = len(octets)  # what the peer has not sent yet

    def recv(self, size):
        self.recvs += 1
        if (self.stalls and self.recvs % 2) or self.position == self.held_from < len(self.octets):
            raise _socket.timeout("timed out")
        size = min(size, self.chunk, self.held_from - self.position if self.position < self.held_from else size)
        taken = self.octets[self.position:self.position + size]
        self.position += len(taken)
        return bytes(taken)

    def send(self, data):
        self.sent += data
        return len(data)

    def sendall(self, data):
        self.sent += data

    def settimeout(self, seconds):
        pass

    def connect(self, address):
        pass

    def close(self):
        pass

    def shutdown(self, how):
        pass


class _Sockets:
    """What http2 uses of _socket, with socket() making the next _PeerSocket."""

    def __init__(self):
        self.next = None
        self.module = types.SimpleNamespace(
            socket=lambda family, kind: self.next, SOCK_STREAM=_socket.SOCK_STREAM, AF_UNIX=_socket.AF_UNIX,
            timeout=_socket.timeout)


SOCKETS = _Sockets()
http2._socket = SOCKETS.module  # the connection's only way out: every recv and send is the stand-in's


def _frames(octets):
    """(kind, flags, stream, payload) of each whole frame of `octets`, as RFC 9113 4.1 lays them out."""
    return [found for found, _ in _frames_and_ends(octets)]


def _frames_and_ends(octets):
    """_frames' frames, each with the offset where it ends."""
    found, position = [], 0
    while position + 9 <= len(octets):
        length = int.from_bytes(octets[position:position + 3], "big")
        kind, flags = octets[position + 3], octets[position + 4]
        stream = int.from_bytes(octets[position + 5:position + 9], "big") & 0x7FFFFFFF
        if length > http2.MAX_FRAME or position + 9 + length > len(octets):
            break
        found.append(((kind, flags, stream, bytes(octets[position + 9:position + 9 + length])), position + 9 + length))
        position += 9 + length
    return found


def _unpadded(flags, payload):
    if flags & 0x8:
        return None if not payload or payload[0] + 1 > len(payload) else payload[1:len(payload) - payload[0]]
    return payload


def _expected_stream_frames(octets):
    """What next_frame() may hand the call, in order: (kind, content) of each
    frame of the call's stream; content None for one the client must refuse."""
    expected, decoder = [], reference_hpack.Decoder(max_header_list_size=http2.MAX_HEADER_LIST)
    frames = _frames(octets)
    for index, (kind, flags, stream, payload) in enumerate(frames):
        if stream != CALL_STREAM:
            continue
        if kind == http2.DATA:
            expected.append((kind, _unpadded(flags, payload)))
        elif kind == http2.RST_STREAM:
            expected.append((kind, int.from_bytes(payload, "big") if len(payload) == 4 else None))
        elif kind == http2.HEADERS:
            expected.append((kind, _header_list(decoder, flags, payload, frames[index + 1:])))
            if expected[-1][1] is None:
                break  # HPACK's state is lost with the block: no later block can be compared
    return expected


def _header_list(decoder, flags, payload, following):
    block = _unpadded(flags, payload)
    if block is None or (flags & 0x20 and len(block) < 5):
        return None
    block = bytearray(block[5:] if flags & 0x20 else block)
    for kind, continued_flags, stream, more in following:
        if flags & 0x4:
            break
        if kind != http2.CONTINUATION or stream != CALL_STREAM:
            return None
        block += more
        flags = continued_flags
    if not flags & 0x4:
        return None
    try:
        return [(bytes(name).decode("latin-1"), bytes(value).decode("latin-1"))
                for name, value in decoder.decode(bytes(block), raw=True)]
    except reference_hpack.HPACKError:
        return None


def _check_sent(sent):
    if not sent.startswith(http2.PREFACE):
        raise AssertionError("the client's octets do not start with HTTP/2's preface")
    position = len(http2.PREFACE)
    while position < len(sent):
        length = int.from_bytes(sent[position:position + 3], "big")
        position += 9 + length
    if position != len(sent):
        raise AssertionError(f"the client sent part of a frame: {bytes(sent[-64:])!r}")


def TestOneInput(data):  # noqa: N802  (atheris' name)
    if len(data) < 3:
        return
    mode, chunk, padding = data[0] % 3, data[1], BODY_SIZES[data[2] & 1]
    octets = data[3:]
    peer = SOCKETS.next = _PeerSocket(octets, chunk & 0x7F or 1 << 30, bool(chunk & 0x80))
    connection = local_grpc._Connection((_socket.AF_UNIX, "kilnd.sock"), http2.TICK)
    handed = []
    next_frame = connection.next_frame

    def recorded():
        handed.append(next_frame())
        return handed[-1]
    connection.next_frame = recorded
    try:
        if mode == 0:
            connection.wait_for_settings(None)
        elif mode == 1:
            ends = [end for _, end in _frames_and_ends(octets)]
            before = data[2] >> 1
            peer.held_from = 0 if not before else ends[min(before, len(ends)) - 1] if ends else len(octets)
            idle = connection.read_idle()
            peer.held_from = len(octets)
            if not idle:
                return
        connection.send("/kiln.v1.Kiln/Lookup", (), REQUEST + b"\0" * padding, timeout=None)
        if connection.early is not None:
            handed.append(connection.early)
        for message in connection.responses():
            if len(message) > local_grpc.MAX_MESSAGE:
                raise AssertionError(f"a message of {len(message)} octets, past MAX_MESSAGE")
    except TRANSPORT_ERRORS:
        pass
    finally:
        _check_sent(peer.sent)
    _check_handed(handed, octets)


def _check_handed(handed, octets):
    expected = _expected_stream_frames(octets)
    if len(handed) > len(expected):
        raise AssertionError(f"the call was handed {len(handed)} frames; its stream has {len(expected)}")
    for index, ((kind, _flags, content), (expected_kind, expected_content)) in enumerate(zip(handed, expected)):
        if kind != expected_kind or content != expected_content:
            raise AssertionError(f"frame {index} of the call's stream was handed as {kind}: {content!r}, "
                                 f"sent as {expected_kind}: {expected_content!r}")


def main():
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
