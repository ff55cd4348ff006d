"""What the fuzzers of the client's codecs (tests/fuzz/python) found, each
input kept here as the fuzzer's regression file keeps it
(tests/fuzz/python/regressions/<fuzzer>/): bytes a hostile or broken kilnd may
send get the codec's own clean error, or read as google.protobuf reads them."""

import math
import struct

import pytest

from kiln.service import api, wire


@pytest.mark.parametrize("message, data, error", [
    # A map's record that is no entry: a varint raised TypeError, a fixed
    # field's 8 octets were read as an entry protobuf never sees.
    (api.CompileResponse, b"(\x05", "map field stage_seconds sent with wire type 0"),
    (api.CompileResponse, b")\x0a\x06abcdef", "map field stage_seconds sent with wire type 1"),
    # A tag past 32 bits, which protobuf refuses, was read as an unknown field.
    (api.LookupResponse, b"\xf8\xff\xff\xff\x1f\x00", "field tag past protobuf's 32 bits"),
    (api.ListMissesResponse, b"\xca\xca\xca\xca\xca\x08\x00", "field tag past protobuf's 32 bits"),
    (api.LookupResponse, b"\x88\x80\x80\x80\x80\x00\x00", "field tag past protobuf's 32 bits"),  # 6 octets
    # A length of 2^64 must not be read as its low 64 bits (0), as a number's is.
    (api.RecordHitsResponse, b"2" + b"\x80" * 9 + b"\x02", "field 6's length past protobuf's 32 bits"),
    # A length of 0 in 8 octets, which protobuf refuses (5 at most), read as an empty field.
    (api.CompileResponse, b"\n" + b"\x80" * 7 + b"\x00\x12\x00", "field 1's length past protobuf's 32 bits"),
], ids=["map-as-varint", "map-as-fixed64", "tag-past-32-bits", "tag-past-32-bits-fuzzed", "tag-of-6-octets",
        "length-past-64-bits", "length-of-8-octets"])
def test_records_protobuf_does_not_read_as_the_field_get_a_decode_error(message, data, error):
    with pytest.raises(wire.DecodeError, match=error):
        message.FromString(data)


def test_a_varints_bits_past_64_are_dropped_as_protobuf_drops_them():
    # found = 2^64 in ten octets: protobuf reads the low 64 bits, false.
    assert not api.LookupResponse.FromString(b"\x08" + b"\x80" * 9 + b"\x02").found
    assert api.GetStatsResponse.FromString(b"\x08" + b"\xff" * 9 + b"\x7f").hits == (1 << 64) - 1


def test_a_negative_zero_double_is_written_back_as_protobuf_writes_it():
    # fuzz_wire: -0.0 equals 0.0, the default, so wire.py left it out when it
    # wrote a message back; protobuf leaves out only 0.0's own bits.
    def stats_with_p99(value):
        latency = b"\n\x06Lookup1" + struct.pack("<d", value)  # name, p99_ms (field 6, a double)
        return api.GetStatsResponse.FromString(b"R" + bytes([len(latency)]) + latency)

    negative = stats_with_p99(-0.0)
    assert math.copysign(1.0, negative.rpc_latency[0].p99_ms) < 0
    assert b"1" + struct.pack("<d", -0.0) in negative.SerializeToString()
    again = api.GetStatsResponse.FromString(negative.SerializeToString())
    assert math.copysign(1.0, again.rpc_latency[0].p99_ms) < 0
    assert stats_with_p99(0.0).rpc_latency[0].SerializeToString() == b"\n\x06Lookup"
