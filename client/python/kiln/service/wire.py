"""Protobuf's wire format for the messages of a descriptor set, in pure Python.

kilnd's client builds its message classes here, from the API's compiled
descriptor (kiln_v1.desc), rather than with google.protobuf: importing that
runtime is about 40 modules, which under Wine (a few ms of file system calls a
module) was a quarter of the client's load, about 250 ms on the first miss of
every process; and a ComfyUI environment's protobuf is often pinned by other
packages. The schema keeps one source, kiln.proto.

What proto3 as kiln.proto uses: scalars of every type, enums (as ints),
nested messages, repeated fields (numbers packed), maps, oneofs and `optional`
fields (with presence). Unknown fields are skipped when parsing; a known
field sent with another wire type than its own, or a proto2 group, is refused
with DecodeError where protobuf would keep it as an unknown field: a kilnd
that sends one has another schema than the client's. The message
classes behave as protobuf's for what the client does with them: keyword
construction, attributes, HasField, WhichOneof, ClearField, CopyFrom,
SerializeToString and FromString, `add()` on repeated messages. The codec and
the reading of descriptors stay one module: under Wine each module is a few ms
of the very load this exists to cut.
"""

import math
import struct


class DecodeError(ValueError):
    """Bytes that are not a valid encoding of the message asked for."""


# FieldDescriptorProto.Type
_DOUBLE, _FLOAT, _INT64, _UINT64, _INT32, _FIXED64, _FIXED32, _BOOL, _STRING = range(1, 10)
_MESSAGE, _BYTES, _UINT32, _ENUM, _SFIXED32, _SFIXED64, _SINT32, _SINT64 = range(11, 19)
_REPEATED = 3  # FieldDescriptorProto.Label

_VARINT, _FIXED64_WIRE, _LENGTH_DELIMITED, _FIXED32_WIRE = 0, 1, 2, 5
_FIXED_FORMATS = {_DOUBLE: "<d", _FLOAT: "<f", _FIXED64: "<Q", _FIXED32: "<I", _SFIXED64: "<q", _SFIXED32: "<i"}
_WIRE_TYPES = {**{kind: _VARINT for kind in (_INT64, _UINT64, _INT32, _BOOL, _UINT32, _ENUM, _SINT32, _SINT64)},
               _DOUBLE: _FIXED64_WIRE, _FIXED64: _FIXED64_WIRE, _SFIXED64: _FIXED64_WIRE,
               _FLOAT: _FIXED32_WIRE, _FIXED32: _FIXED32_WIRE, _SFIXED32: _FIXED32_WIRE,
               _STRING: _LENGTH_DELIMITED, _BYTES: _LENGTH_DELIMITED, _MESSAGE: _LENGTH_DELIMITED}
_INTEGER_RANGES = {_INT64: (-1 << 63, 1 << 63), _UINT64: (0, 1 << 64), _INT32: (-1 << 31, 1 << 31),
                   _UINT32: (0, 1 << 32), _ENUM: (-1 << 31, 1 << 31), _SINT32: (-1 << 31, 1 << 31),
                   _SINT64: (-1 << 63, 1 << 63), _FIXED64: (0, 1 << 64), _FIXED32: (0, 1 << 32),
                   _SFIXED64: (-1 << 63, 1 << 63), _SFIXED32: (-1 << 31, 1 << 31)}


def _read_varint(data, position):
    value = shift = 0
    while True:
        if position >= len(data):
            raise DecodeError("truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift >= 70:
            raise DecodeError("varint longer than 10 bytes")


def _varint(value):
    if value < 0:
        value += 1 << 64  # negative int32/int64/enum values: ten bytes, two's complement
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _records(data):
    """(field number, wire type, value) of each field in `data`: an int for a
    varint, the bytes of a fixed or length-delimited field."""
    position, end = 0, len(data)
    while position < end:
        start = position
        tag, position = _read_varint(data, position)
        if tag >> 32 or position - start > 5:
            raise DecodeError("a field tag past protobuf's 32 bits")
        number, wire_type = tag >> 3, tag & 7
        if wire_type == _VARINT:
            value, position = _read_varint(data, position)
        elif wire_type in (_FIXED64_WIRE, _FIXED32_WIRE):
            size = 8 if wire_type == _FIXED64_WIRE else 4
            value, position = data[position:position + size], position + size
            if position > end:
                raise DecodeError(f"truncated fixed field {number}")
        elif wire_type == _LENGTH_DELIMITED:
            size_start = position
            size, position = _read_varint(data, position)
            # protobuf reads a length as at most 5 octets of a 32-bit size.
            if size >> 32 or position - size_start > 5:
                raise DecodeError(f"field {number}'s length past protobuf's 32 bits")
            value, position = data[position:position + size], position + size
            if position > end:
                raise DecodeError(f"truncated field {number} ({size} bytes)")
        else:
            raise DecodeError(f"field {number} has wire type {wire_type}, which proto3 does not use")
        if number == 0:
            raise DecodeError("field number 0")
        yield number, wire_type, value


def _signed(value, bits):
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _decode_varint_scalar(kind, value):
    value &= (1 << 64) - 1  # a tenth byte's bits past 64 are dropped, as protobuf drops them
    if kind in (_INT64, _INT32, _ENUM):
        return _signed(value, 64 if kind == _INT64 else 32)
    if kind == _BOOL:
        return value != 0
    if kind in (_SINT32, _SINT64):
        return (value >> 1) ^ -(value & 1)
    return value & ((1 << 32) - 1) if kind == _UINT32 else value & ((1 << 64) - 1)


def _encode_scalar(kind, value):
    """The bytes of a number's value, without its tag."""
    if kind in _FIXED_FORMATS:
        return struct.pack(_FIXED_FORMATS[kind], value)
    if kind in (_SINT32, _SINT64):
        return _varint((value << 1) ^ (value >> 63))
    return _varint(int(value))


def _add_length_delimited(out, tag, chunks):
    """Appends a tagged length-delimited record of `chunks` to `out`. Records
    are lists of chunks, joined once for the whole message: a blob's bytes are
    copied once, not again at each level of nesting."""
    out.append(tag)
    out.append(_varint(sum(map(len, chunks))))
    out.extend(chunks)


class _Field:
    __slots__ = ("name", "number", "kind", "repeated", "message", "message_name", "map_entry", "oneof",
                 "presence", "default")

    def __init__(self, name, number, kind, repeated, message_name, oneof, presence):
        self.name, self.number, self.kind, self.repeated = name, number, kind, repeated
        self.message_name, self.message, self.map_entry = message_name, None, None
        self.oneof, self.presence = oneof, presence
        self.default = {_DOUBLE: 0.0, _FLOAT: 0.0, _BOOL: False, _STRING: "", _BYTES: b""}.get(kind, 0)

    def is_default(self, value):
        """Whether a field without presence holding `value` is left out. -0.0 is
        not 0.0's bits, and protobuf sends it."""
        if value == 0 and self.kind in (_DOUBLE, _FLOAT):
            return math.copysign(1.0, value) > 0
        return value == self.default

    def check(self, value):
        """`value` as this scalar field stores it, or TypeError/ValueError."""
        kind = self.kind
        if kind == _STRING:
            if isinstance(value, bytes):
                value = value.decode()
            elif not isinstance(value, str):
                raise TypeError(f"field {self.name} takes a str, not {type(value).__name__}")
            return value
        if kind == _BYTES:
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise TypeError(f"field {self.name} takes bytes, not {type(value).__name__}")
            return bytes(value)
        if kind in (_DOUBLE, _FLOAT):
            if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
                raise TypeError(f"field {self.name} takes a number, not {type(value).__name__}")
            return float(value)
        if kind == _BOOL:
            if not hasattr(value, "__index__"):
                raise TypeError(f"field {self.name} takes a bool, not {type(value).__name__}")
            return bool(value)
        if not hasattr(value, "__index__"):
            raise TypeError(f"field {self.name} takes an int, not {type(value).__name__}")
        value = value.__index__()
        low, high = _INTEGER_RANGES[kind]
        if not low <= value < high:
            raise ValueError(f"field {self.name}: {value} is out of its type's range")
        return value

    def encode(self, out, value):
        """Appends this field's records for `value` (a list or dict if repeated) to `out`."""
        tag = _varint(self.number << 3 | _LENGTH_DELIMITED)
        if self.map_entry is not None:
            key_field, value_field = self.map_entry
            for key, item in value.items():
                entry = []
                key_field.encode(entry, key)
                value_field.encode(entry, item)
                _add_length_delimited(out, tag, entry)
        elif not self.repeated:
            self._encode_one(out, value)
        elif self.kind in (_STRING, _BYTES, _MESSAGE):
            for item in value:
                self._encode_one(out, item)
        elif value:  # numbers, packed as proto3 has them
            _add_length_delimited(out, tag, [_encode_scalar(self.kind, item) for item in value])

    def _encode_one(self, out, value):
        if self.kind == _MESSAGE:
            _add_length_delimited(out, _varint(self.number << 3 | _LENGTH_DELIMITED), value._chunks())
        elif self.kind in (_STRING, _BYTES):
            _add_length_delimited(out, _varint(self.number << 3 | _LENGTH_DELIMITED),
                                  [value.encode() if self.kind == _STRING else value])
        else:
            out.append(_varint(self.number << 3 | _WIRE_TYPES[self.kind]))
            out.append(_encode_scalar(self.kind, value))

    def decode(self, wire_type, value):
        """The values (a list: a packed record holds several) of one record of this field."""
        kind = self.kind
        if kind == _MESSAGE:
            if wire_type != _LENGTH_DELIMITED:
                raise DecodeError(f"field {self.name} is a message, sent with wire type {wire_type}")
            return [self.message.FromString(value)]
        if wire_type == _LENGTH_DELIMITED and kind not in (_STRING, _BYTES):
            return self._decode_packed(value)
        if wire_type != _WIRE_TYPES[kind]:
            raise DecodeError(f"field {self.name} sent with wire type {wire_type}")
        if kind == _STRING:
            try:
                return [bytes(value).decode()]
            except UnicodeDecodeError as error:
                raise DecodeError(f"field {self.name} is not UTF-8: {error}") from None
        if kind == _BYTES:
            return [bytes(value)]
        if kind in _FIXED_FORMATS:
            return [struct.unpack(_FIXED_FORMATS[kind], value)[0]]
        return [_decode_varint_scalar(kind, value)]

    def _decode_packed(self, data):
        if not self.repeated:
            raise DecodeError(f"field {self.name} is a single {self.kind_name()}, sent packed")
        if self.kind in _FIXED_FORMATS:
            form = _FIXED_FORMATS[self.kind]
            size = struct.calcsize(form)
            if len(data) % size:
                raise DecodeError(f"packed field {self.name} has a partial value")
            return [value for (value,) in struct.iter_unpack(form, data)]
        values, position = [], 0
        while position < len(data):
            value, position = _read_varint(data, position)
            values.append(_decode_varint_scalar(self.kind, value))
        return values

    def kind_name(self):
        return "message" if self.kind == _MESSAGE else f"scalar of type {self.kind}"


class _Repeated(list):
    """A repeated field's values; changing them makes its message present in
    the message that holds it (as protobuf's containers do)."""

    __slots__ = ("_owner", "_field")

    def _changed(self):
        self._owner._modified()

    def _checked(self, values):
        field = self._field
        if field.kind == _MESSAGE:
            for value in values:
                if not isinstance(value, field.message):
                    raise TypeError(f"field {field.name} holds {field.message.__name__}, "
                                    f"not {type(value).__name__}")
            return list(values)
        return [field.check(value) for value in values]

    def append(self, value):
        super().append(*self._checked([value]))
        self._changed()

    def extend(self, values):
        super().extend(self._checked(values))
        self._changed()

    def insert(self, index, value):
        super().insert(index, *self._checked([value]))
        self._changed()

    def __setitem__(self, index, value):
        super().__setitem__(index, self._checked(value) if isinstance(index, slice) else self._checked([value])[0])
        self._changed()

    def __iadd__(self, values):
        self.extend(values)
        return self

    def add(self, **fields):
        """A new message appended to this repeated message field."""
        message = self._field.message(**fields)
        super().append(message)
        self._changed()
        return message


class _Map(dict):
    """A map field's entries; see _Repeated."""

    __slots__ = ("_owner", "_field")

    def __setitem__(self, key, value):
        key_field, value_field = self._field.map_entry
        if value_field.kind == _MESSAGE:
            if not isinstance(value, value_field.message):
                raise TypeError(f"map {self._field.name} holds {value_field.message.__name__}, "
                                f"not {type(value).__name__}")
        else:
            value = value_field.check(value)
        super().__setitem__(key_field.check(key), value)
        self._owner._modified()

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]


class Message:
    """A message of the descriptor set. Subclasses are made by message_classes()."""

    __slots__ = ("_values", "_lazy", "_parent")
    _fields = {}   # name -> _Field
    _numbers = {}  # field number -> _Field
    _oneofs = {}   # oneof name -> its fields' names

    def __init__(self, **fields):
        self._values, self._lazy, self._parent = {}, None, None
        for name, value in fields.items():
            if name not in self._fields:
                raise ValueError(f"{type(self).__name__} has no field {name!r}")
            if value is not None:
                setattr(self, name, value)

    @classmethod
    def FromString(cls, data):  # noqa: N802  (protobuf's name)
        message = cls()
        message._merge(data)
        return message

    def SerializeToString(self, deterministic=False):  # noqa: N802, ARG002  (protobuf's signature)
        return b"".join(self._chunks())

    def _chunks(self):
        out = []
        for number, name in self._present_numbers():
            self._numbers[number].encode(out, self._values[name])
        return out

    def HasField(self, name):  # noqa: N802
        if name in self._oneofs:
            return self.WhichOneof(name) is not None
        field = self._fields.get(name)
        if field is None or not field.presence:
            raise ValueError(f"{type(self).__name__}.{name} has no presence to test; compare it with its default")
        return name in self._values

    def WhichOneof(self, oneof):  # noqa: N802
        if oneof not in self._oneofs:
            raise ValueError(f"{type(self).__name__} has no oneof {oneof!r}")
        return next((name for name in self._oneofs[oneof] if name in self._values), None)

    def ClearField(self, name):  # noqa: N802
        if name not in self._fields and name not in self._oneofs:
            raise ValueError(f"{type(self).__name__} has no field {name!r}")
        for cleared in self._oneofs.get(name, (name,)):
            self._values.pop(cleared, None)
            if self._lazy:
                self._lazy.pop(cleared, None)

    def CopyFrom(self, other):  # noqa: N802
        if type(other) is not type(self):
            raise TypeError(f"CopyFrom takes a {type(self).__name__}, not {type(other).__name__}")
        if other is self:
            return
        self._values, self._lazy = {}, None
        self._merge(other.SerializeToString())
        self._modified()

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._comparable() == other._comparable()

    __hash__ = None  # mutable, as protobuf's messages

    def __repr__(self):
        shown = ", ".join(f"{name}={self._values[name]!r}" for _, name in self._present_numbers())
        return f"{type(self).__name__}({shown})"

    def _comparable(self):
        return {name: self._values[name] for _, name in self._present_numbers()}

    def _present_numbers(self):
        """(number, name) of the fields to serialize: those present, and
        fields without presence that differ from their default."""
        present = []
        for name, value in self._values.items():
            field = self._fields[name]
            if field.presence or (not field.is_default(value) if not field.repeated else value):
                present.append((field.number, name))
        present.sort()
        return present

    def _merge(self, data):
        try:
            # Fields are views of the bytes received: a blob's bytes are copied once, not at each level.
            for number, wire_type, value in _records(memoryview(data)):
                field = self._numbers.get(number)
                if field is not None:
                    self._merge_record(field, wire_type, value)
        except (DecodeError, struct.error, IndexError) as error:
            raise DecodeError(f"{type(self).__name__}: {error}") from None

    def _merge_record(self, field, wire_type, value):
        if field.map_entry is not None:
            if wire_type != _LENGTH_DELIMITED:
                raise DecodeError(f"map field {field.name} sent with wire type {wire_type}")
            entry = field.message.FromString(value)
            getattr(self, field.name)[entry.key] = entry.value
            return
        if field.kind == _MESSAGE and not field.repeated and field.name in self._values \
                and wire_type == _LENGTH_DELIMITED:
            self._values[field.name]._merge(value)  # a second record of one message merges into it
            return
        values = field.decode(wire_type, value)
        if field.repeated:
            getattr(self, field.name).extend(values)
        else:
            setattr(self, field.name, values[-1])

    def _set(self, field, value):
        if field.oneof is not None:
            for sibling in self._oneofs[field.oneof]:
                self._values.pop(sibling, None)
        self._values[field.name] = value
        self._modified()

    def _modified(self):
        """Called as a field of this message changes: a message made by reading
        an unset field of its parent becomes present there."""
        if self._parent is not None:
            parent, field = self._parent
            self._parent = None
            parent._lazy.pop(field.name, None)
            parent._set(field, self)


def _property(field):
    def get(self):
        value = self._values.get(field.name)
        if value is not None:
            return value
        if field.repeated:
            container = _Map() if field.map_entry is not None else _Repeated()
            container._owner, container._field = self, field
            self._values[field.name] = container
            return container
        if field.kind != _MESSAGE:
            return field.default
        if self._lazy is None:
            self._lazy = {}
        child = self._lazy.get(field.name)
        if child is None:
            child = self._lazy[field.name] = field.message()
            child._parent = (self, field)
        return child

    def set_(self, value):
        if field.repeated:
            self._values.pop(field.name, None)
            container = get(self)
            (container.update if field.map_entry is not None else container.extend)(value)
            self._modified()
            return
        if field.kind == _MESSAGE:
            if not isinstance(value, field.message):
                raise TypeError(f"field {field.name} takes a {field.message.__name__}, not {type(value).__name__}")
            value._parent = None
        else:
            value = field.check(value)
        self._set(field, value)

    return property(get, set_)


def message_classes(descriptor_set):
    """{full name without its leading dot: Message subclass} of each message of
    a serialized FileDescriptorSet (`protoc --descriptor_set_out`), and {full
    name: {value name: number}} of each enum."""
    messages, enums = {}, {}
    files = [file for number, _, file in _records(descriptor_set) if number == 1]
    if not files:
        raise DecodeError("not a FileDescriptorSet: it holds no file")
    for file in files:
        package = ""
        for number, _, value in _records(file):
            if number == 2:  # package
                package = bytes(value).decode()
        for number, _, value in _records(file):
            if number == 4:  # message_type
                _declare_message(value, package, messages, enums)
            elif number == 5:  # enum_type
                _declare_enum(value, package, enums)
    for cls in messages.values():
        for field in cls._fields.values():
            if field.message_name is not None:
                field.message = messages[field.message_name]
                if field.message._map_entry:
                    field.map_entry = (field.message._numbers[1], field.message._numbers[2])
    return messages, enums


def _declare_message(descriptor, scope, messages, enums):
    name, field_records, oneof_names, map_entry = "", [], [], False
    nested = []
    for number, _, value in _records(descriptor):
        if number == 1:
            name = bytes(value).decode()
        elif number == 2:
            field_records.append(value)
        elif number in (3, 4):
            nested.append((number, value))
        elif number == 8:
            oneof_names.append(next((bytes(v).decode() for n, _, v in _records(value) if n == 1), ""))
        elif number == 7:
            map_entry = any(n == 7 and v for n, _, v in _records(value))
    full_name = f"{scope}.{name}" if scope else name
    nested_enum_values = {}  # a nested enum's values are attributes of its message, as protobuf has them
    for number, value in nested:
        if number == 3:
            _declare_message(value, full_name, messages, enums)
        else:
            nested_enum_values.update(_declare_enum(value, full_name, enums))
    fields = [_declared_field(record, oneof_names) for record in field_records]
    oneofs = {}
    for field in fields:
        if field.oneof is not None:
            oneofs.setdefault(field.oneof, []).append(field.name)
    namespace = {"__slots__": (), "_fields": {field.name: field for field in fields},
                 "_numbers": {field.number: field for field in fields}, "_oneofs": oneofs,
                 "_map_entry": map_entry, **nested_enum_values,
                 **{field.name: _property(field) for field in fields}}
    messages[full_name] = type(name, (Message,), namespace)


def _declared_field(descriptor, oneof_names):
    """A _Field of a FieldDescriptorProto; a synthetic oneof (proto3
    `optional`) gives presence, not a oneof."""
    values = {1: "", 3: 0, 4: 1, 5: 0, 6: None, 9: None, 17: 0}
    for number, _, value in _records(descriptor):
        if number in values:
            values[number] = bytes(value).decode() if number in (1, 6) else value
    name, number, label, kind = values[1], values[3], values[4], values[5]
    type_name = values[6].lstrip(".") if values[6] is not None and kind == _MESSAGE else None
    optional = bool(values[17])
    oneof = oneof_names[values[9]] if values[9] is not None and not optional else None
    presence = optional or oneof is not None or (kind == _MESSAGE and label != _REPEATED)
    return _Field(name, number, kind, label == _REPEATED, type_name, oneof, presence)


def _declare_enum(descriptor, scope, enums):
    name, values = "", {}
    for number, _, value in _records(descriptor):
        if number == 1:
            name = bytes(value).decode()
        elif number == 2:
            entry = {n: v for n, _, v in _records(value)}
            values[bytes(entry.get(1, b"")).decode()] = _signed(entry.get(2, 0), 32)
    enums[f"{scope}.{name}" if scope else name] = values
    return values
