"""Triton's cache manager (TRITON_CACHE_MANAGER=kiln._cache:KilnCacheManager).

A kernel this user's processes already got from kilnd is served from the
client's local index (_index): as cheap as stock Triton's file cache, without
importing gRPC. Everything else goes to the manager over kilnd (_triton), which
is imported, and connects, on first need.
"""

import base64
import sys

from triton.runtime.cache import CacheManager

from . import _files, _frontend, _index


def hex_key(key):
    """Triton names cache managers by base32 of a hex SHA-256; kilnd keys by the hex."""
    try:
        return base64.b32decode(key + "=" * (-len(key) % 8)).hex()
    except (ValueError, TypeError):
        return key


def hand_over(key, files):
    """The group Triton gets for a hit made of `files` ({name: path}, the
    frontend output included). Stock Triton would have compiled here if its
    cache dir lacks the kernel: then the frontend's output is shown again, and
    inductor's static launcher (which reads <cache dir>/<key>/<kernel>.cubin)
    finds the cubin there."""
    files = dict(files)
    output = files.pop(_frontend.OUTPUT_BLOB, None)
    if output is not None or "torch._inductor" in sys.modules:
        new_to_cache_dir = False
        for name, path in files.items():
            new_to_cache_dir |= _files.mirror_cubin(path, key, name)
        if output is not None and new_to_cache_dir:
            _frontend.replay(_files.read(output))
    return files


class KilnCacheManager(CacheManager):
    def __init__(self, key, override=False, dump=False):
        self.key = key
        self._hex = hex_key(key)
        self._local = not (override or dump)  # dump and override dirs are stock Triton's
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
        files = _index.lookup("triton-files", f"{self._hex}/{filename}", filename) if self._local else None
        if files is not None:
            return files[filename]
        return self._kilnd().get_file(filename)

    def put(self, data, filename, binary=True):
        return self._kilnd().put(data, filename, binary)

    def put_group(self, filename, group):
        return self._kilnd().put_group(filename, group)
