"""HPACK (RFC 7541), HTTP/2's header compression, in pure Python.

For the client's own gRPC-over-HTTP/2 connection to kilnd, in place of grpcio:
the encoder sends every field as a literal that touches no table, so the peer's
decoder state never matters to us; the decoder is the whole of RFC 7541
section 6, since what kilnd's HTTP/2 library sends is its choice. Imports
nothing: under Wine every module loaded is milliseconds of a process's start.
"""


class HpackError(ValueError):
    """A header block that is not valid HPACK. HTTP/2 makes this a connection
    error (COMPRESSION_ERROR): after it the Decoder's table is not to be trusted."""


# RFC 7541 Appendix A; the field at position i has index i + 1.
_STATIC = [tuple(field.partition(" ")[::2]) for field in (
    ":authority", ":method GET", ":method POST", ":path /", ":path /index.html",  # 1-5
    ":scheme http", ":scheme https", ":status 200", ":status 204", ":status 206",  # 6-10
    ":status 304", ":status 400", ":status 404", ":status 500", "accept-charset",  # 11-15
    "accept-encoding gzip, deflate", "accept-language", "accept-ranges", "accept",  # 16-19
    "access-control-allow-origin", "age", "allow", "authorization", "cache-control",  # 20-24
    "content-disposition", "content-encoding", "content-language", "content-length",  # 25-28
    "content-location", "content-range", "content-type", "cookie", "date", "etag",  # 29-34
    "expect", "expires", "from", "host", "if-match", "if-modified-since",  # 35-40
    "if-none-match", "if-range", "if-unmodified-since", "last-modified", "link",  # 41-45
    "location", "max-forwards", "proxy-authenticate", "proxy-authorization", "range",  # 46-50
    "referer", "refresh", "retry-after", "server", "set-cookie",  # 51-55
    "strict-transport-security", "transfer-encoding", "user-agent", "vary", "via",  # 56-60
    "www-authenticate",  # 61
)]
_STATIC_NAME_INDEX = {}
for _index, (_name, _value) in enumerate(_STATIC, 1):
    _STATIC_NAME_INDEX.setdefault(_name, _index)

# The lengths of the Huffman code's 257 codes (RFC 7541 Appendix B, symbol 256
# is EOS), 16 symbols a row. The code is canonical, so the lengths are all of it.
_LENGTHS = (
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5,
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
    30,
)
_EOS = 256
_LONGEST = 30
_WINDOW = (1 << _LONGEST) - 1

# A canonical code gives each length one run of consecutive codes, in symbol
# order, each run starting where the shorter codes' end. So a decoder can read
# _LONGEST bits ahead and find the length by comparing with the runs' ends,
# and the symbol by arithmetic within the run. Codes of at most 8 bits, the
# common ones (letters, digits, most punctuation), are looked up by the next
# 8 bits instead, in _SHORT: a typical string decodes in about half the time.
_SYMBOLS = sorted(range(257), key=_LENGTHS.__getitem__)  # code order: stable, so by (length, symbol)
_CODES = [0] * 257
_RUNS = []  # per length, shortest first: [end of its codes as a _LONGEST-bit window, length, base]
_SHORT = [None] * 256  # the next 8 bits -> (symbol, length) where they begin with a whole code
_code, _length = -1, 0
for _rank, _symbol in enumerate(_SYMBOLS):
    _code = (_code + 1) << (_LENGTHS[_symbol] - _length)
    _length = _LENGTHS[_symbol]
    _CODES[_symbol] = _code
    if not _RUNS or _RUNS[-1][1] != _length:
        _RUNS.append([0, _length, _code - _rank])  # base: _SYMBOLS[code - base] is code's symbol
    _RUNS[-1][0] = (_code + 1) << (_LONGEST - _length)
    if _length <= 8:
        _spare = 8 - _length
        _SHORT[_code << _spare:(_code + 1) << _spare] = [(_symbol, _length)] * (1 << _spare)
_RUNS = tuple(map(tuple, _RUNS))
del _index, _name, _value, _code, _length, _rank, _symbol, _spare

_MAX_INTEGER = (1 << 32) - 1  # more than any header block can mean; bounds the work a bad one costs


def encode(headers):
    """A header block for `headers`, (name, value) str pairs: each a literal
    without indexing (RFC 7541 6.2.2), the name by static index where the
    table has it, strings as raw UTF-8."""
    out = bytearray()
    for name, value in headers:
        if name != name.lower():
            raise ValueError(f"HTTP/2 header names are lowercase: {name!r}")
        index = _STATIC_NAME_INDEX.get(name, 0)
        _put_integer(out, 4, index)
        if not index:
            _put_string(out, name.encode())
        _put_string(out, value.encode())
    return bytes(out)


def _put_integer(out, prefix_bits, value):  # the prefix's other bits 0, as encode's fields have them
    limit = (1 << prefix_bits) - 1
    if value < limit:
        out.append(value)
        return
    out.append(limit)
    value -= limit
    while value >= 0x80:
        out.append(0x80 | value & 0x7F)
        value >>= 7
    out.append(value)


def _put_string(out, octets):
    _put_integer(out, 7, len(octets))
    out += octets


class Decoder:
    """Decodes one connection's header blocks, in order: the dynamic table
    they build lives here. `max_table_size` is what this side announced in
    SETTINGS_HEADER_TABLE_SIZE (4096 unless it sent one)."""

    def __init__(self, max_table_size=4096):
        self.max_table_size = max_table_size
        self._limit = max_table_size  # the size the encoder chose, at most max_table_size
        self._table = []  # newest last
        self._size = 0

    def decode(self, block, max_list_size=None):
        """The (name, value) pairs of `block`, as str decoded from latin-1 so
        that any octets come through; HpackError if it is not valid HPACK, or
        if its header list's size (RFC 9113 6.5.2: each field's octets and 32)
        passes `max_list_size`: fields indexed again and again make a small
        block a large list."""
        block = bytes(block)
        headers = []
        pos = list_size = 0
        limit = float("inf") if max_list_size is None else max_list_size
        while pos < len(block):
            first = block[pos]
            if first & 0x80:  # indexed field
                index, pos = _integer(block, pos, 7)
                headers.append(self._field(index))
                list_size += len(headers[-1][0]) + len(headers[-1][1]) + 32
            elif (first & 0xE0) == 0x20:  # dynamic table size update
                if headers:
                    raise HpackError("dynamic table size update after a header field")
                size, pos = _integer(block, pos, 5)
                if size > self.max_table_size:
                    raise HpackError(f"dynamic table size update to {size}, "
                                     f"over the maximum {self.max_table_size}")
                self._limit = size
                self._evict()
            else:  # literal: 01 incremental indexing, 0000 without indexing, 0001 never indexed
                index, pos = _integer(block, pos, 6 if first & 0x40 else 4)
                if index:
                    name = self._field(index)[0]
                else:
                    name, pos = _string(block, pos)
                value, pos = _string(block, pos)
                headers.append((name, value))
                list_size += len(name) + len(value) + 32
                if first & 0x40:
                    self._table.append((name, value))
                    self._size += len(name) + len(value) + 32
                    self._evict()
            if list_size > limit:
                raise HpackError(f"a header list past {limit} bytes")
        return headers

    def _field(self, index):
        if 0 < index <= len(_STATIC):
            return _STATIC[index - 1]
        if len(_STATIC) < index <= len(_STATIC) + len(self._table):
            return self._table[len(_STATIC) - index]  # 62 is the newest
        raise HpackError(f"index {index} is in neither table "
                         f"({len(_STATIC)} static, {len(self._table)} dynamic)")

    def _evict(self):
        # Oldest first; an entry bigger than the table so empties it, itself included (RFC 7541 4.4).
        while self._size > self._limit:
            name, value = self._table.pop(0)
            self._size -= len(name) + len(value) + 32


def _integer(block, pos, prefix_bits):
    """The integer with an N-bit prefix at `pos` (RFC 7541 5.1), and the position after it."""
    if pos >= len(block):
        raise HpackError("header block ends where an integer should be")
    limit = (1 << prefix_bits) - 1
    value = block[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    for shift in range(0, 35, 7):  # 5 octets reach past 32 bits: a 6th is never needed
        if pos >= len(block):
            raise HpackError("header block ends inside an integer")
        octet = block[pos]
        pos += 1
        value += (octet & 0x7F) << shift
        if octet < 0x80:
            if value > _MAX_INTEGER:
                break
            return value, pos
    raise HpackError(f"integer over {_MAX_INTEGER}")


def _string(block, pos):
    """The string literal at `pos` (RFC 7541 5.2), and the position after it."""
    start = pos
    length, pos = _integer(block, pos, 7)
    end = pos + length
    if end > len(block):
        raise HpackError(f"string of {length} octets runs {end - len(block)} "
                         "past the end of the header block")
    if block[start] & 0x80:
        return _huffman_decode(block[pos:end]).decode("latin-1"), end
    return block[pos:end].decode("latin-1"), end


def _huffman_decode(octets):
    out = bytearray()
    bits = unread = 0  # the low `unread` bits of `bits` are not decoded yet
    left = 8 * len(octets)  # of them (and of those still to come), how many are the string's
    # Ones past the end let a _LONGEST-bit window read past it; they are EOS's bits, as padding is.
    octets += b"\xff\xff\xff\xff"
    for start in range(0, len(octets), 8):  # 8 octets a step: fewer steps of the loop than octet by octet
        chunk = octets[start:start + 8]
        bits = (bits & ((1 << unread) - 1)) << (8 * len(chunk)) | int.from_bytes(chunk, "big")
        unread += 8 * len(chunk)
        while unread >= _LONGEST and left > 0:
            window = bits >> (unread - _LONGEST) & _WINDOW
            short = _SHORT[window >> (_LONGEST - 8)]
            if short:
                symbol, length = short
            else:
                for end, length, base in _RUNS:
                    if window < end:
                        break
                symbol = _SYMBOLS[(window >> (_LONGEST - length)) - base]
            if length > left:  # what is left is not a whole code: it must be padding
                if left > 7:
                    raise HpackError(f"Huffman string padded with {left} bits, more than 7")
                if window >> (_LONGEST - left) != (1 << left) - 1:
                    raise HpackError("Huffman string padded with bits other than EOS's (all ones)")
                return out
            if symbol == _EOS:
                raise HpackError("EOS inside a Huffman string")
            out.append(symbol)
            unread -= length
            left -= length
    return out
