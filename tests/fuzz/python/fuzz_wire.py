#!/usr/bin/env python3
"""Fuzzes kiln.service.wire's decoding of kilnd's answers against google.protobuf.

Feeds: one byte choosing a response message type of the Kiln service (every
type api.KilnStub decodes; the types nested in them are reached through their
fields), then the bytes to decode as that message.

Asserts, with the real protobuf package (upb) built from the same descriptor
set (kiln_v1.desc) as the oracle:
- bytes protobuf parses decode in wire.py to the same fields: every value,
  presence (HasField, WhichOneof), repeated order, map contents;
- bytes protobuf refuses are refused by wire.py too, with wire.DecodeError;
- wire.py raises nothing but DecodeError, whatever the bytes.
One difference is of upb, not of protobuf: upb keeps a map entry that holds
fields other than its key and value as an unknown field of the map's message,
where protobuf's C++ and pure-Python runtimes (and wire.py) add the entry and
skip the other fields. The oracle is given the bytes with those fields taken
out of map entries (_upb_map_entries).
Where wire.py is deliberately stricter than protobuf it refuses with
DecodeError and protobuf keeps the record as an unknown field; those are
STRICTER below: proto2 groups (wire types 3 and 4) in unknown fields, and a
known field sent with another wire type than its type's (protobuf keeps such
a record as unknown; wire.py has no unknown-field set to keep it in, and a
kilnd that sends one has a schema other than the client's).

Run: python fuzz_wire.py [libFuzzer flags] [corpus dirs or files]; see run_fuzzers.py.
"""

import struct
import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "client" / "python"))  # the checkout's client

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402
from google.protobuf.message import DecodeError as ReferenceDecodeError  # noqa: E402

with atheris.instrument_imports(include=["kiln"]):
    from kiln.service import api, wire

RESPONSES = sorted({response.__name__ for response in
                    [*(pair[1] for pair in api._METHODS.values()),
                     *(pair[1] for pair in api._STREAMING_METHODS.values())]})
# wire.py's messages for refusing what protobuf keeps as an unknown field.
STRICTER = ("which proto3 does not use", "sent with wire type", "sent packed")


def _reference_pool():
    pool = descriptor_pool.DescriptorPool()
    with open(Path(api.__file__).with_name("kiln_v1.desc"), "rb") as file:
        for proto in descriptor_pb2.FileDescriptorSet.FromString(file.read()).file:
            pool.Add(proto)
    return pool


POOL = _reference_pool()
REFERENCE = {name: message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"kiln.v1.{name}"))
             for name in RESPONSES}
OURS = {name: getattr(api, name) for name in RESPONSES}


def _scalar(value):
    """A value both codecs can be compared by: floats by their bits (NaN, -0.0)."""
    return struct.pack("<d", value) if isinstance(value, float) else value


def _canonical(message, descriptor):
    """The fields of `message` (protobuf's or wire.py's: both answer the same
    attribute API) as plain data, walking protobuf's descriptor."""
    fields = {}
    for field in descriptor.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            fields[field.name] = sorted(
                (key, _canonical(item, value_field.message_type) if value_field.message_type else _scalar(item))
                for key, item in value.items())
        elif field.is_repeated:
            fields[field.name] = [_canonical(item, field.message_type) if field.message_type else _scalar(item)
                                  for item in value]
        elif field.has_presence and not message.HasField(field.name):
            fields[field.name] = None
        else:
            fields[field.name] = _canonical(value, field.message_type) if field.message_type else _scalar(value)
    for oneof in descriptor.oneofs:
        fields[f"oneof {oneof.name}"] = message.WhichOneof(oneof.name)
    return fields


def _varint(data, position):
    value = shift = 0
    while True:
        if shift == 70:  # more than 10 octets: upb refuses it, in a map entry's stray field too
            raise IndexError("a varint longer than 10 octets")
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position += 1
        shift += 7
        if byte < 0x80:
            return value, position


def _encoded_varint(value):
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _upb_map_entries(data, descriptor, in_map_entry=False):
    """`data` with the fields of each map entry other than key and value taken
    out, at any depth (wire types 0, 1, 2 and 5 only; IndexError where `data`
    is no valid encoding)."""
    out, position = bytearray(), 0
    while position < len(data):
        start = position
        tag, position = _varint(data, position)
        tag_end = position
        number, wire_type = tag >> 3, tag & 7
        if number == 0 or tag >> 32:
            raise IndexError("no field's tag")
        if wire_type == 0:
            _, position = _varint(data, position)
        elif wire_type in (1, 5):
            position += 8 if wire_type == 1 else 4
        elif wire_type == 2:
            size, value_start = _varint(data, position)
            position = value_start + size
            field = descriptor.fields_by_number.get(number)
            if field is not None and field.message_type is not None:
                value = _upb_map_entries(data[value_start:position], field.message_type,
                                         field.message_type.GetOptions().map_entry)
                if position > len(data):
                    raise IndexError("truncated")
                if in_map_entry and number not in (1, 2):
                    continue
                if value == data[value_start:position]:
                    out += data[start:position]  # as sent: a length padded past its varint's shortest is upb's to judge
                else:
                    out += data[start:tag_end] + _encoded_varint(len(value)) + value
                continue
        else:
            raise IndexError("a wire type of no proto3 field")
        if position > len(data):
            raise IndexError("truncated")
        if not (in_map_entry and number not in (1, 2)):
            out += data[start:position]
    return bytes(out)


def TestOneInput(data):  # noqa: N802  (atheris' name)
    if not data:
        return
    name = RESPONSES[data[0] % len(RESPONSES)]
    body = data[1:]
    try:
        for_upb = _upb_map_entries(body, REFERENCE[name].DESCRIPTOR)
    except IndexError:
        for_upb = body  # not a valid encoding: refused either way
    try:
        reference = REFERENCE[name].FromString(for_upb)
    except ReferenceDecodeError:
        reference = None
    try:
        ours = OURS[name].FromString(body)
    except wire.DecodeError as error:
        if reference is not None and not any(reason in str(error) for reason in STRICTER):
            raise AssertionError(f"{name}: protobuf reads {body!r}, wire.py refuses it: {error}") from None
        return
    if reference is None:
        raise AssertionError(f"{name}: protobuf refuses {body!r}, wire.py reads it as {ours!r}")
    descriptor = REFERENCE[name].DESCRIPTOR
    expected, found = _canonical(reference, descriptor), _canonical(ours, descriptor)
    if expected != found:
        raise AssertionError(f"{name}: {body!r} reads as\n  protobuf: {expected}\n  wire.py:  {found}")
    # What wire.py read, it writes back: what the client re-sends (a looked-up
    # entry put elsewhere) is what it read.
    again = OURS[name].FromString(ours.SerializeToString())
    if _canonical(again, descriptor) != found:
        raise AssertionError(f"{name}: {body!r} does not survive wire.py's own encoding")


def main():
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
