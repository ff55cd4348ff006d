"""The client's own HPACK codec (kiln.service.hpack) against the hpack package,
the reference: its Huffman code and static table are hpack's, it decodes what
hpack's encoder makes over a connection's many blocks (dynamic table, size
updates, Huffman or not, never-indexed fields) to the same headers and the same
table, hpack's decoder reads what it encodes, and malformed blocks are
HpackError. (hpack is a dependency of the tests, not of the client.)"""

import os
import random
import subprocess
import sys
from pathlib import Path

import hpack as reference
import pytest
from hpack.hpack import encode_integer
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.table import HeaderTable

from kiln.service import hpack
from kiln.service.hpack import Decoder, HpackError, encode

CLIENT = Path(hpack.__file__).parents[2]
HUFFMAN = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)


def _text(octets):
    """What our decoder gives for a name or value hpack was handed (str is sent as UTF-8)."""
    return (octets if isinstance(octets, bytes) else octets.encode()).decode("latin-1")


def _pairs(headers):
    return [(_text(field[0]), _text(field[1])) for field in headers]


def test_the_huffman_code_built_canonically_from_the_lengths_is_hpacks_for_all_257_symbols():
    assert list(hpack._LENGTHS) == REQUEST_CODES_LENGTH
    assert hpack._CODES == REQUEST_CODES


def test_the_static_table_is_hpacks():
    assert hpack._STATIC == _pairs(HeaderTable.STATIC_TABLE)


@pytest.mark.parametrize("prefix_bits", [4, 5, 6, 7])
def test_integers_encode_as_hpacks_and_read_back_up_to_32_bits(prefix_bits):
    for value in [*range(300), 2 ** 14 - 1, 2 ** 14, 2 ** 21 + 5, 2 ** 32 - 1]:
        made = bytearray()
        hpack._put_integer(made, prefix_bits, value)
        assert made == encode_integer(value, prefix_bits)
        assert hpack._integer(bytes(made) + b"\x55", 0, prefix_bits) == (value, len(made))


def test_huffman_strings_hpack_encodes_decode_to_the_same_octets():
    generator = random.Random(7)
    strings = [b"", bytes(range(256)), b"application/grpc", b"identity, deflate, gzip", b"\x00\xff" * 40]
    strings += [bytes(generator.randrange(256) for _ in range(length)) for length in range(1, 64)]
    strings += [generator.choice([b"%20", b"a", b"Z", b"~", b"\x80"]) * generator.randrange(1, 40)
                for _ in range(40)]
    for octets in strings:
        assert hpack._huffman_decode(HUFFMAN.encode(octets)) == octets


# gRPC responses as a C++ server sends them: headers, then trailers, one
# connection, several calls. `None` stands for a change of the encoder's
# dynamic table size before the next block.
GRPC_ERROR = "Compile failed: kernel `add_kernel` at /tmp/x.py:12 \u2014 50% done".encode()
PERCENT_ENCODED = "".join(f"%{octet:02X}" if octet > 0x7E or octet in b"% " else chr(octet)
                          for octet in GRPC_ERROR)
RESPONSE = [(":status", "200"), ("content-type", "application/grpc"),
            ("grpc-accept-encoding", "identity, deflate, gzip")]
CALLS = [
    RESPONSE,
    [("grpc-status", "0")],
    RESPONSE,
    [("grpc-status", "0"), ("grpc-message", "")],
    [(":status", "200"), ("content-type", "application/grpc"), ("x-empty", ""),
     ("x-octets", b"\x00\x7f\x80\xfe\xff")],
    [("grpc-status", "13"), ("grpc-message", PERCENT_ENCODED)],
    # Values bigger than the whole dynamic table, then fields sent as never indexed.
    [("grpc-status", "2"), ("grpc-message", "x" * 5000), ("grpc-status-details-bin", "A" * 3000)],
    [("authorization", "Bearer secret", True), ("x-token", "hunter2", True), ("grpc-status", "0")],
    [("x-token", "hunter2", True), ("x-r\u00e9gion", "\u00e9t\u00e9 \u2713")],
    None,
    [(":status", "200"), ("content-type", "application/grpc"), ("x-long", "y" * 300), ("x-after", "1")],
    [("grpc-status", "0"), ("x-after", "1"), ("x-after", "2"), ("x-after", "3")],
    None,
    [(":status", "200"), ("content-type", "application/grpc+proto"), ("grpc-encoding", "identity")],
    [("grpc-status", "0"), ("grpc-message", "OK")],
]


@pytest.mark.parametrize("huffman", [True, False], ids=["huffman", "raw"])
def test_blocks_hpacks_encoder_makes_over_a_connection_decode_to_its_headers_and_table(huffman):
    encoder, decoder = reference.Encoder(), Decoder()
    table_sizes = iter([256, 4096] * 2)
    for headers in CALLS * 2:
        if headers is None:
            encoder.header_table_size = next(table_sizes)
            continue
        block = encoder.encode(headers, huffman=huffman)
        assert decoder.decode(block) == _pairs(headers)
        assert decoder._table[::-1] == _pairs(encoder.header_table.dynamic_entries)
        assert decoder._size == encoder.header_table._current_size <= encoder.header_table_size


def test_hpacks_decoder_reads_back_what_encode_makes_without_touching_its_table():
    headers = [
        (":method", "POST"), (":scheme", "http"), (":path", "/kiln.v1.Kiln/Compile"),
        (":authority", "localhost"),
        ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-timeout", "30S"),
        ("user-agent", "kiln-python/0.1"), ("www-authenticate", ""), ("x-note", "caf\u00e9 \u2713"),
        ("x-" + "n" * 200, "v" * 20000),
    ]
    block = encode(headers)
    decoder = reference.Decoder(max_header_list_size=1 << 20)
    assert decoder.decode(block, raw=True) == [(name.encode(), value.encode()) for name, value in headers]
    assert not decoder.header_table.dynamic_entries
    assert Decoder().decode(block) == _pairs(headers)
    assert encode([]) == b""
    assert encode([("te", "trailers")]) == b"\x00\x02te\x08trailers"  # `te` is no static name
    assert encode([(":path", "/")]) == b"\x04\x01/"  # the name by index 4, without indexing


def test_encode_refuses_a_name_that_is_not_lowercase():
    with pytest.raises(ValueError, match="lowercase"):
        encode([("Content-Type", "application/grpc")])


def test_the_dynamic_table_evicts_oldest_first_by_the_rfcs_size_and_empties_for_an_entry_too_big():
    decoder = Decoder()
    assert decoder.decode(b"\x3f\x45" + _incremental("aaaa", "bb")) == [("aaaa", "bb")]  # size 100: 38 used
    assert decoder.decode(_incremental("c", "d") + b"\xbe\xbf") == [("c", "d"), ("c", "d"), ("aaaa", "bb")]
    assert decoder.decode(_incremental("e", "f")) == [("e", "f")]  # 38 + 34 + 34 > 100: aaaa goes
    assert decoder.decode(b"\xbe\xbf") == [("e", "f"), ("c", "d")]
    with pytest.raises(HpackError, match="index 64"):
        decoder.decode(b"\xc0")
    assert decoder.decode(_incremental("g", "h" * 67)) == [("g", "h" * 67)]  # 100 octets exactly: fits alone
    assert decoder.decode(b"\xbe") == [("g", "h" * 67)]
    decoder.decode(_incremental("g", "h" * 68))  # 101: too big, and the table is empty after it
    with pytest.raises(HpackError, match="index 62"):
        decoder.decode(b"\xbe")


def _incremental(name, value):
    return b"\x40" + _raw(name) + _raw(value)


def _raw(text):
    octets = text.encode()
    return bytes(encode_integer(len(octets), 7)) + octets


def test_a_size_update_may_empty_the_table_and_grow_it_back_up_to_the_maximum():
    decoder = Decoder(max_table_size=8192)
    decoder.decode(b"\x40\x01a\x01b")
    assert decoder.decode(b"\x20\x3f\xe1\x3f") == []  # to 0, then to 8192
    with pytest.raises(HpackError, match="index 62"):
        decoder.decode(b"\xbe")
    assert decoder.decode(b"\x40" + _raw("a") + _raw("b" * 8000) + b"\xbe") == [("a", "b" * 8000)] * 2


MALFORMED = {
    "an indexed field's integer cut short": (b"\xff", "ends inside an integer"),
    "an integer cut short after continuation": (b"\xff\x80", "ends inside an integer"),
    "index 0": (b"\x80", "index 0 is in neither"),
    "an index past the static table, the dynamic one empty": (b"\xbe", "index 62"),
    "a name index past the tables": (b"\x0f\x2f\x00", "index 62"),
    "an absurdly large index": (b"\xff" + b"\xff" * 10 + b"\x01", "integer over"),
    "an index just over 32 bits": (b"\xff\x81\xff\xff\xff\x0f", "integer over"),
    "an integer padded with zero octets": (b"\xff\x80\x80\x80\x80\x80\x00", "integer over"),
    "a string longer than the block": (b"\x00\x05abc", "runs 2 past the end"),
    "a string one octet longer than the block": (b"\x00\x01a\x04abc", "runs 1 past the end"),
    "a literal without its name": (b"\x00", "ends where an integer should be"),
    "a literal without its value": (b"\x01", "ends where an integer should be"),
    "a string length over 32 bits": (b"\x01\xff\xff\xff\xff\xff\x7f", "integer over"),
    "Huffman padding of zeros": (b"\x01\x81\x18", "other than EOS"),  # 'a' then 000
    "Huffman padding of 11 bits": (b"\x01\x82\x1f\xff", "padded with 11 bits"),
    "Huffman padding of a whole octet": (b"\x01\x81\xff", "padded with 8 bits"),
    "Huffman EOS inside the string": (b"\x01\x84\xff\xff\xff\xfc", "EOS inside"),
    "Huffman EOS then a symbol": (b"\x01\x85\xff\xff\xff\xfc\x7f", "EOS inside"),
    "a size update over the maximum": (b"\x3f\xe2\x1f", "4097, over the maximum 4096"),
    "a size update after a field": (b"\x82\x20", "after a header field"),
}


@pytest.mark.parametrize("block, message", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_block_is_an_hpack_error_that_says_what_is_wrong(block, message):
    with pytest.raises(HpackError, match=message):
        Decoder().decode(block)


def test_a_size_update_to_exactly_the_maximum_and_huffman_padding_of_up_to_7_ones_are_valid():
    assert Decoder().decode(b"\x3f\xe1\x1f\x01\x80\x01\x81\x1f") == [(":authority", ""), (":authority", "a")]


def test_damaged_blocks_raise_hpack_error_and_never_another_exception():
    encoder = reference.Encoder()
    blocks = [encoder.encode(headers, huffman=index % 2 == 0)
              for index, headers in enumerate(CALLS) if headers is not None]
    generator = random.Random(11)
    for block in blocks:
        damaged = [block[:cut] for cut in range(len(block))]
        for _ in range(40):
            octets = bytearray(block)
            octets[generator.randrange(len(octets))] = generator.randrange(256)
            damaged.append(bytes(octets))
        for octets in damaged:
            try:
                Decoder().decode(octets)
            except HpackError:
                pass


def test_importing_it_loads_no_module_but_itself():
    script = "import sys, kiln.service; before = set(sys.modules); import kiln.service.hpack; " \
             "print(sorted(set(sys.modules) - before))"
    added = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env=dict(os.environ, PYTHONPATH=str(CLIENT))).stdout
    assert added.strip() == "['kiln.service.hpack']"
    # Stricter, without kiln's own imports to hide behind: run alone in a bare interpreter.
    script = "import sys; before = set(sys.modules); " \
             f"exec(open({hpack.__file__!r}).read(), {{'__name__': 'hpack'}}); " \
             "print(sorted(set(sys.modules) - before))"
    added = subprocess.run([sys.executable, "-I", "-S", "-c", script],
                           capture_output=True, text=True, check=True)
    assert added.stdout.strip() == "[]"
