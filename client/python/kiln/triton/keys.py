"""Kernel keys as kilnd has them: Triton names a kernel by base32 of a hex
SHA-256, kilnd by the hex."""

import base64

# Base32's alphabet as the digits of int(_, 32); the other digits int() would
# take ("0189", lowercase) map to a character it refuses.
_AS_INT_DIGITS = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567" "0189" "abcdefghijklmnopqrstuvwxyz",
                               "0123456789abcdefghijklmnopqrstuv" + "!" * 30)


def hex_key(key):
    """Triton names cache managers by base32 of a hex SHA-256; kilnd keys by the hex.
    Decoded by int(_, 32), at C speed: base64.b32decode costs more than the rest of a hit."""
    size = len(key) * 5 // 8  # bytes; the bits left over are base32's padding
    if key.isascii() and key.isalnum() and -(-size * 8 // 5) == len(key):
        try:
            return f"{int(key.translate(_AS_INT_DIGITS), 32) >> (len(key) * 5 - size * 8):0{size * 2}x}"
        except ValueError:
            pass
    try:
        return base64.b32decode(key + "=" * (-len(key) % 8)).hex()
    except (ValueError, TypeError):
        return key
