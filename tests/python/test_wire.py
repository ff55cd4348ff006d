"""The client's own protobuf codec (kiln.service.wire) against google.protobuf,
the reference: both build kiln.proto's messages from the same descriptor set,
and every message must encode to the same bytes and read back the same.
(protobuf is a dependency of the tests, not of the client.)"""

from pathlib import Path

import pytest
from google.protobuf import descriptor, descriptor_pool, message_factory

from kiln.service import api, wire

DESCRIPTOR_SET = Path(api.__file__).with_name("kiln_v1.desc")
F = descriptor.FieldDescriptor


def _reference_pool():
    from google.protobuf import descriptor_pb2

    pool = descriptor_pool.DescriptorPool()
    with open(DESCRIPTOR_SET, "rb") as file:
        for proto in descriptor_pb2.FileDescriptorSet.FromString(file.read()).file:
            pool.Add(proto)
    return pool


POOL = _reference_pool()
OURS = api._MESSAGES  # the classes the client uses


def _all_messages(pool):
    found = []

    def walk(message):
        if not message.GetOptions().map_entry:
            found.append(message)
        for nested in message.nested_types:
            walk(nested)

    for message in pool.FindFileByName("kiln/v1/kiln.proto").message_types_by_name.values():
        walk(message)
    return found


MESSAGES = _all_messages(POOL)

# Values that reach each type's edges: negative numbers (ten-byte varints),
# the top of unsigned ranges, non-ASCII text, bytes that are not UTF-8.
SCALARS = {
    F.TYPE_DOUBLE: [-1.5, 2.0 ** 70], F.TYPE_FLOAT: [0.25, -3.0], F.TYPE_INT64: [-(1 << 63), 7],
    F.TYPE_UINT64: [(1 << 64) - 1, 300], F.TYPE_INT32: [-2, (1 << 31) - 1], F.TYPE_UINT32: [(1 << 32) - 1, 1],
    F.TYPE_BOOL: [True, True], F.TYPE_STRING: ["héllo ✓", "x" * 200], F.TYPE_BYTES: [b"\xff\x00\x80", b"a" * 300],
    F.TYPE_SINT32: [-5, 5], F.TYPE_SINT64: [-(1 << 40), 1], F.TYPE_FIXED32: [7, 0xFFFFFFFF],
    F.TYPE_FIXED64: [9, 1 << 63], F.TYPE_SFIXED32: [-7, 3], F.TYPE_SFIXED64: [-9, 4],
}


def _filled(descriptor_, depth, variant):
    """Keyword arguments that set every field of `descriptor_` (the first
    member of each oneof, or the second with `variant`), for protobuf's class
    and ours: (reference kwargs, ours kwargs)."""
    reference, ours = {}, {}
    chosen_oneof_member = {oneof.name: oneof.fields[min(variant, len(oneof.fields) - 1)].name
                           for oneof in descriptor_.oneofs if not _synthetic(oneof)}
    for field in descriptor_.fields:
        oneof = field.containing_oneof
        if oneof is not None and not _synthetic(oneof) and chosen_oneof_member[oneof.name] != field.name:
            continue
        value = _value(field, depth, variant)
        if value is None:
            continue
        reference[field.name], ours[field.name] = value
    return reference, ours


def _synthetic(oneof):
    return len(oneof.fields) == 1 and oneof.name.startswith("_")


def _value(field, depth, variant):
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        if value.message_type is not None:
            return None
        entries = sorted((_scalar(key, index), _scalar(value, index)) for index in range(2))
        return dict(entries), dict(entries)
    if field.message_type is not None:
        if depth > 2:
            return None
        made = [_filled(field.message_type, depth + 1, variant) for _ in range(2 if _repeated(field) else 1)]
        reference_class = message_factory.GetMessageClass(field.message_type)
        ours_class = OURS[field.message_type.full_name]
        pairs = [(reference_class(**ref), ours_class(**mine)) for ref, mine in made]
        if _repeated(field):
            return [ref for ref, _ in pairs], [mine for _, mine in pairs]
        return pairs[0]
    if _repeated(field):
        values = [_scalar(field, index) for index in range(2)]
        return values, list(values)
    scalar = _scalar(field, variant)
    return scalar, scalar


def _repeated(field):
    return field.is_repeated


def _scalar(field, index):
    if field.type == F.TYPE_ENUM:
        return field.enum_type.values[-1 - index % len(field.enum_type.values)].number
    return SCALARS[field.type][index % 2]


@pytest.mark.parametrize("variant", [0, 1])
@pytest.mark.parametrize("message", MESSAGES, ids=lambda message: message.name)
def test_every_message_encodes_as_protobuf_does_and_reads_back_from_protobuf(message, variant):
    reference_kwargs, our_kwargs = _filled(message, 0, variant)
    reference = message_factory.GetMessageClass(message)(**reference_kwargs)
    ours = OURS[message.full_name](**our_kwargs)
    expected = reference.SerializeToString(deterministic=True)
    assert ours.SerializeToString() == expected
    read = OURS[message.full_name].FromString(expected)
    assert read == ours
    assert read.SerializeToString() == expected
    for oneof in (oneof for oneof in message.oneofs if not _synthetic(oneof)):
        assert read.WhichOneof(oneof.name) == reference.WhichOneof(oneof.name)


def test_an_empty_message_is_no_bytes_and_reads_its_defaults():
    request = api.CompileRequest.FromString(b"")
    assert request.SerializeToString() == b""
    assert (request.triton_key, request.priority, request.no_wait_for_worker_start) == ("", 0, False)
    assert list(request.have_sha256) == [] and dict(request.env) == {}


def test_reading_an_unset_message_field_does_not_set_it_until_something_is_written_in_it():
    request = api.CompileRequest()
    assert request.target.arch == ""
    assert not request.HasField("target")
    assert request.SerializeToString() == b""
    request.target.arch = "90"
    assert request.HasField("target")
    response = api.CompileResponse()
    response.entry.blobs.add(name="a.cubin", data=b"x")
    assert response.WhichOneof("result") == "entry"
    response.error.message = "no"
    assert response.WhichOneof("result") == "error" and not response.HasField("entry")


def test_optional_fields_have_presence_and_plain_ones_do_not():
    put = api.PutRequest(key="k")
    assert not put.HasField("serve_as_files")
    put.serve_as_files = False
    assert put.HasField("serve_as_files")
    assert api.PutRequest.FromString(put.SerializeToString()).HasField("serve_as_files")
    with pytest.raises(ValueError, match="no presence"):
        put.HasField("key")


def test_fields_unknown_to_this_client_are_skipped():
    # A newer kilnd's field 999 (a varint, then bytes) around a known one.
    unknown = bytes([0xB8, 0x3E, 0x05]) + bytes([0xBA, 0x3E, 0x02]) + b"hi"
    response = api.LookupResponse.FromString(unknown + api.LookupResponse(found=True).SerializeToString())
    assert response.found


@pytest.mark.parametrize("data", [b"\x0a\x05abc", b"\x08\xff", b"\x0b", b"\x08" + b"\xff" * 11, b"\x00\x01"],
                         ids=["truncated-bytes", "truncated-varint", "group", "long-varint", "field-0"])
def test_malformed_bytes_raise_a_decode_error_naming_the_message(data):
    with pytest.raises(wire.DecodeError, match="LookupRequest"):
        api.LookupRequest.FromString(data)


def test_wrong_values_are_refused_as_protobuf_refuses_them():
    with pytest.raises(TypeError, match="data takes bytes"):
        api.Blob(data="text")
    with pytest.raises(ValueError, match="out of its type's range"):
        api.Blob(size=-1)
    with pytest.raises(ValueError, match="no field 'sizes'"):
        api.Blob(sizes=1)
    with pytest.raises(AttributeError):
        api.Blob().sizes = 1
    with pytest.raises(TypeError, match="holds Blob"):
        api.CacheEntry().blobs.append(api.Target())


def test_copy_from_is_a_deep_copy():
    original = api.CacheEntry(blobs=[api.Blob(name="a", data=b"1")], created_unix_ms=-5)
    copy = api.CacheEntry()
    copy.CopyFrom(original)
    copy.blobs[0].name = "b"
    assert original.blobs[0].name == "a" and copy.created_unix_ms == -5


def test_records_of_one_message_field_merge_as_protobuf_merges_them():
    first = api.LookupResponse(found=True, entry=api.CacheEntry(created_unix_ms=5, blobs=[api.Blob(name="a")]))
    second = api.LookupResponse(entry=api.CacheEntry(blobs=[api.Blob(name="b")]))
    joined = first.SerializeToString() + second.SerializeToString()
    reference = message_factory.GetMessageClass(POOL.FindMessageTypeByName("kiln.v1.LookupResponse")).FromString(joined)
    assert api.LookupResponse.FromString(joined).SerializeToString() == reference.SerializeToString(deterministic=True)
