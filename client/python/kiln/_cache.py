"""Triton's cache manager (TRITON_CACHE_MANAGER=kiln._cache:KilnCacheManager).

A kernel this user's processes already got from kilnd is served from the
client's local index (_index): as cheap as stock Triton's file cache, without
importing gRPC. Everything else goes to the manager over kilnd (_triton), which
is imported, and connects, on first need.
"""

import base64
import os
import sys

from triton import knobs
from triton.runtime.cache import CacheManager

from kiln import _MANAGER
from kiln.local import files as _files
from kiln.local import index as _index
from kiln import _triton_versions
from ._deferred_texts import HitGroup


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


def hand_over(key, files):
    """The group Triton gets for a hit made of `files` ({name: path}, the
    frontend output included). Stock Triton would have compiled here if its
    cache dir lacks the kernel: then the frontend's output is shown again, and
    inductor's static launcher (which reads <cache dir>/<key>/<kernel>.cubin)
    finds the cubin there. A HitGroup: CompiledKernel reads its IR texts only
    when asked (_deferred_texts)."""
    files = HitGroup(files)
    files.pop(_index.KEY_INPUTS_BLOB, None)
    output = files.pop(_index.OUTPUT_BLOB, None)
    if output is not None or "torch._inductor" in sys.modules:
        new_to_cache_dir = False
        for name, path in files.items():
            new_to_cache_dir |= _files.mirror_cubin(path, key, name)
        if output is not None and new_to_cache_dir:
            from . import _frontend  # only here: a hit that shows nothing does not import it

            _frontend.replay(_files.read(output))
    return files


class KilnCacheManager(CacheManager):
    def __init__(self, key, override=False, dump=False):
        self.key = key
        self._hex = hex_key(key)
        # Dump and override dirs are stock Triton's; so is every file of a
        # Triton Kiln does not support (_triton falls back, with its warning).
        self._local = not (override or dump) and _triton_versions.supported()
        self._override, self._dump = override, dump
        self._over_kilnd = None

    def _kilnd(self):
        if self._over_kilnd is None:
            from . import _triton

            self._over_kilnd = _triton.RemoteCacheManager(self.key, override=self._override, dump=self._dump)
        return self._over_kilnd

    def get_group(self, filename):
        files = _index.lookup("triton", self._hex, filename) if self._local else None
        if files is None:
            return self._kilnd().get_group(filename)
        return hand_over(self.key, files)

    def get_file(self, filename):
        path = _index.lookup_file("triton-files", f"{self._hex}/{filename}", filename) if self._local else None
        return path if path is not None else self._kilnd().get_file(filename)

    def put(self, data, filename, binary=True):
        return self._kilnd().put(data, filename, binary)

    def put_group(self, filename, group):
        return self._kilnd().put_group(filename, group)


def claim_knob():
    """Sets Triton's cache manager knob to KilnCacheManager while the environment
    names it. Triton resolves TRITON_CACHE_MANAGER by importing the module on
    every cache access, which costs a hit more than its own file lookups; the
    knob's value it takes as it is. The environment stays what child processes
    and kiln.disable() go by."""
    if os.environ.get("TRITON_CACHE_MANAGER") == _MANAGER:
        knobs.cache.manager_class = KilnCacheManager


def release_knob():
    if vars(knobs.cache).get("manager_class") is KilnCacheManager:
        del knobs.cache.manager_class


claim_knob()  # Triton imports this module on its first cache access
