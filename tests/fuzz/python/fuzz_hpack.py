#!/usr/bin/env python3
"""Fuzzes kiln.service.hpack's Decoder against the hpack package's.

Feeds: one connection's header blocks, in order, through one Decoder each
(the dynamic table carries from block to block, as on a connection). The
input is the blocks joined by the 4 octets SPLIT; a first octet with its top
bit set also makes the header list limit small (LIST_LIMITS), so that the
limit is reached by short inputs too.

Asserts, block by block, with hpack's Decoder (the same table size, 4096, and
the same header list limit) as the oracle:
- both decode a block to the same header list, or both refuse it;
- kilnd's decoder refuses only with HpackError, whatever the octets;
- once either refuses, the connection is over (RFC 7541 makes it a
  COMPRESSION_ERROR): later blocks are not compared.
Where this decoder is deliberately stricter: an integer past 32 bits, or of
more than 5 octets after its prefix, is refused ("integer over"); hpack reads
any integer, and only ones with zeros for padding (0x80 octets) can then still
mean something it accepts.

Run: python fuzz_hpack.py [libFuzzer flags] [corpus dirs or files]; see run_fuzzers.py.
"""

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "client" / "python"))  # the checkout's client

import hpack as reference  # noqa: E402

with atheris.instrument_imports(include=["kiln"]):
    from kiln.service import hpack

SPLIT = b"\xde\xad\xbe\xef"
LIST_LIMITS = (65536, 200)


def TestOneInput(data):  # noqa: N802  (atheris' name)
    if not data:
        return
    limit = LIST_LIMITS[data[0] >> 7]
    ours, theirs = hpack.Decoder(), reference.Decoder(max_header_list_size=limit)
    for index, block in enumerate(data[1:].split(SPLIT)):
        try:
            expected = [(bytes(name), bytes(value)) for name, value in theirs.decode(block, raw=True)]
        except reference.HPACKError as error:
            expected = error
        try:
            found = [(name.encode("latin-1"), value.encode("latin-1"))
                     for name, value in ours.decode(block, max_list_size=limit)]
        except hpack.HpackError as error:
            if isinstance(expected, Exception) or "integer over" in str(error):
                return
            raise AssertionError(f"block {index} {block!r}: hpack reads {expected}, ours refuses: {error}") from None
        if isinstance(expected, Exception):
            raise AssertionError(f"block {index} {block!r}: hpack refuses ({expected!r}), ours reads {found}")
        if found != expected:
            raise AssertionError(f"block {index} {block!r}:\n  hpack: {expected}\n  ours:  {found}")
        table = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in reversed(ours._table)]
        if table != [(bytes(name), bytes(value)) for name, value in theirs.header_table.dynamic_entries]:
            raise AssertionError(f"block {index} {block!r}: the dynamic tables differ after it")


def main():
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
