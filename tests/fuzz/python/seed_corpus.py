#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora, corpus/<fuzzer>/, from real encodings:
kiln.proto's answers as the client's codec writes them, HPACK blocks of RFC
7541's Appendix C and of the hpack package's Encoder, and HTTP/2 answers as
kilnd's gRPC sends them. Run it again after a change to what these are made
of; the files are small and committed.

Usage: python seed_corpus.py
"""

import shutil
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "client" / "python"))  # the checkout's client

import hpack as reference_hpack  # noqa: E402
from fuzz_hpack import SPLIT  # noqa: E402
from fuzz_wire import RESPONSES  # noqa: E402

from kiln.service import api, http2  # noqa: E402

CORPUS = Path(__file__).resolve().parent / "corpus"


def _answers():
    entry = api.CacheEntry(blobs=[api.blob("add_kernel.cubin", b"\x7fELF" + bytes(range(40))),
                                  api.blob("add_kernel.json", b'{"num_warps": 4}')], created_unix_ms=-5)
    answers = {
        "lookup-found": api.LookupResponse(found=True, entry=entry),
        "lookup-claimed": api.LookupResponse(claimed=True),
        "compile-entry": api.CompileResponse(entry=entry, stage_seconds={"ttir": 0.25, "ptx": 1.5},
                                             ptxas_log="ptxas info: 0 bytes stack frame"),
        "compile-error": api.CompileResponse(
            error=api.CompileError(kind=2, message="héllo ✓ failed", log="ptxas fatal")),
        "stats": api.GetStatsResponse(
            entries=7, server_version="0.1.0", uptime_seconds=12.5, gpu_targets=["cuda:90", "hip:gfx942"],
            rpc_latency=[api._MESSAGES["kiln.v1.RpcLatency"](method="Lookup", count=3, p99_ms=1.5)]),
        "put-many": api.PutManyResponse(results=[api.PutManyResponse().results.add(code=3, message="bad key")]),
        "misses": api.ListMissesResponse(misses=[api.ListMissesResponse().misses.add(reasons=["env", "ptxas"])]),
        "prewarm": api.PrewarmResponse(),
    }
    for name, message in answers.items():
        yield name, bytes((RESPONSES.index(type(message).__name__),)) + message.SerializeToString()


# RFC 7541 Appendix C: C.3 (requests, no Huffman), C.4 (the same, Huffman), C.6
# (responses, Huffman, a table of 256 octets evicting), each one connection.
_RFC7541 = {
    "rfc7541-c3-requests": ["828684410f7777772e6578616d706c652e636f6d", "828684be58086e6f2d6361636865",
                            "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565"],
    "rfc7541-c4-requests-huffman": ["828684418cf1e3c2e5f23a6ba0ab90f4ff", "828684be5886a8eb10649cbf",
                                    "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"],
    "rfc7541-c6-responses-huffman": [
        "488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad171863c78f0b97c8e9ae82ae43d3",
        "4883640effc1c0bf",
        "88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7f2e6c7b335dfdfcd5b3960d5af27087f"
        "3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007"],
    "rfc7541-c2-literals": ["400a637573746f6d2d6b65790d637573746f6d2d686561646572",
                            "040c2f73616d706c652f70617468", "100870617373776f726406736563726574", "82"],
}


def _hpack_blocks():
    for name, blocks in _RFC7541.items():
        yield name, b"\0" + SPLIT.join(bytes.fromhex(block) for block in blocks)
    encoder = reference_hpack.Encoder()
    headers = [(":status", "200"), ("content-type", "application/grpc"),
               ("grpc-accept-encoding", "identity, deflate, gzip")]
    trailers = [("grpc-status", "13"), ("grpc-message", "Compile%20failed%3A%20%E2%9C%93")]
    blocks = [encoder.encode(headers), encoder.encode(trailers), encoder.encode(headers, huffman=False)]
    encoder.header_table_size = 100  # a size update opens the next block
    blocks += [encoder.encode(headers + [("x-octets", b"\x00\x7f\x80\xff")]), encoder.encode(trailers)]
    yield "grpc-calls-with-table-size-update", b"\x80" + SPLIT.join(blocks)


def _frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def _grpc_answers():
    answer = api.LookupResponse(found=True, entry=api.CacheEntry(blobs=[api.blob("a.cubin", b"x" * 20)]))
    message = struct.pack(">BI", 0, len(answer.SerializeToString())) + answer.SerializeToString()
    encoder = reference_hpack.Encoder()
    headers = encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
    ok = encoder.encode([("grpc-status", "0"), ("grpc-message", "")], huffman=True)
    settings = _frame(http2.SETTINGS, 0, 0, struct.pack(">HIHI", 4, 4194304, 5, 4194304))
    ack = _frame(http2.SETTINGS, http2.ACK, 0)
    answered = (_frame(http2.HEADERS, http2.END_HEADERS, 1, headers) + _frame(http2.DATA, 0, 1, message)
                + _frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 1, ok))
    padded = bytes((5,)) + message[:3] + b"\0" * 5
    failed = reference_hpack.Encoder().encode([(":status", "200"), ("content-type", "application/grpc"),
                                                ("grpc-status", "9"), ("grpc-message", "caf%C3%A9 100%25 %")])
    yield "answered", b"\0\0\0" + settings + ack + answered
    yield "answered-idle-read", b"\1\0\6" + settings + ack + _frame(http2.WINDOW_UPDATE, 0, 0, b"\0\x3f\0\1") + answered
    yield "answered-in-pieces", b"\2\x07\0" + b"".join((
        settings, _frame(http2.PING, 0, 0, b"12345678"),
        _frame(http2.HEADERS, 0, 1, headers[:2]), _frame(http2.CONTINUATION, http2.END_HEADERS, 1, headers[2:]),
        _frame(http2.DATA, http2.PADDED, 1, padded), _frame(http2.DATA, 0, 1, message[3:]),
        _frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 1, ok)))
    yield "failed-status", b"\0\0\0" + settings + _frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 1, failed)
    literal = reference_hpack.Encoder().encode([(":status", "200"), ("grpc-status", "13"), ("grpc-message", "no")],
                                                huffman=False)
    yield "failed-status-literal", b"\0\0\0" + settings + _frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 1,
                                                                  literal)
    yield "reset", b"\0\0\0" + settings + _frame(http2.RST_STREAM, 0, 1, b"\0\0\0\x08")
    yield "goaway", b"\0\x80\0" + settings + _frame(http2.GOAWAY, 0, 0, struct.pack(">II", 0, 0) + b"bye")
    yield "window-opened", b"\2\0\1" + _frame(http2.SETTINGS, 0, 0, struct.pack(">HI", 4, 0)) + b"".join((
        _frame(http2.WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 20)), _frame(http2.WINDOW_UPDATE, 0, 0,
                                                                               struct.pack(">I", 1 << 20)),
        _frame(http2.PRIORITY, 0, 1, b"\0\0\0\0\x10"), answered))


def main():
    for fuzzer, seeds in (("fuzz_wire", _answers()), ("fuzz_hpack", _hpack_blocks()), ("fuzz_frames", _grpc_answers())):
        folder = CORPUS / fuzzer
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name, octets in seeds:
            (folder / name).write_bytes(octets)


if __name__ == "__main__":
    main()
