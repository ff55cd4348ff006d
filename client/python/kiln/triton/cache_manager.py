"""Triton's cache manager (TRITON_CACHE_MANAGER=kiln._cache:KilnCacheManager,
the module that names it here).

A kernel this user's processes already got from kilnd is served from the
client's local index (local/index): as cheap as stock Triton's file cache, without
importing kilnd's client. Everything else goes to the manager over kilnd (_triton, that
is kiln.triton.remote), which is imported, and connects, on first need.
"""

import os
import sys

from triton import knobs
from triton.runtime.cache import CacheManager

from kiln.local import files as _files
from kiln.local import index as _index
from kiln.triton import CACHE_MANAGER as _MANAGER
from kiln.triton import versions as _triton_versions
from kiln.triton.deferred_texts import known_texts
from kiln.triton.hand_over import hand_over
from kiln.triton.keys import hex_key


class KilnCacheManager(CacheManager):
    def __init__(self, key, override=False, dump=False):
        self.key = key
        self._hex = hex_key(key)
        # Dump and override dirs are stock Triton's; so is every file of a
        # Triton Kiln does not support (triton/remote falls back, with its warning).
        self._local = not (override or dump) and _triton_versions.supported()
        self._override, self._dump = override, dump
        self._over_kilnd = None
        self._here = None  # the CompileGroup of a first compile run here (compiled_here)

    def _kilnd(self):
        if self._over_kilnd is None:
            from kiln.triton import remote as _triton

            self._over_kilnd = _triton.RemoteCacheManager(self.key, override=self._override, dump=self._dump)
        return self._over_kilnd

    def get_group(self, filename):
        files = _index.lookup("triton", self._hex, filename) if self._local else None
        if files is None and self._local:
            from kiln.triton import compiled_here as _compiled_here  # not for a process whose kernels are all hits

            files = _compiled_here.lookup(self._hex, filename)  # compiled here: kilnd may not have it yet
            if files is None and _compiled_here.take(_load_client):
                from kiln.triton import frontend as _frontend

                self._here = _frontend.begin(self._hex)
                self._here.compiled_here = True
                return None
        if files is not None:
            return hand_over(self.key, files)
        return self._kilnd().get_group(filename)

    def get_file(self, filename):
        path = _index.lookup_file("triton-files", f"{self._hex}/{filename}", filename) if self._local else None
        return path if path is not None else self._kilnd().get_file(filename)

    def put(self, data, filename, binary=True):
        if self._here is None:
            return self._kilnd().put(data, filename, binary)
        # This process's alone, as a compile kilnd stores: kilnd serves the next process its own copy.
        data = data if isinstance(data, bytes) else str(data).encode()
        self._here.made[filename] = data
        path = _files.scratch(filename, data)
        if "torch._inductor" in sys.modules:  # its static launcher reads the cubin from Triton's cache dir
            _files.mirror_cubin(path, self.key, filename)
        return path

    def put_group(self, filename, group):
        if self._here is None:
            return self._kilnd().put_group(filename, group)
        from kiln.triton import compiled_here as _compiled_here
        from kiln.triton import frontend as _frontend
        from kiln.triton import key_inputs as _key_inputs

        here, self._here = self._here, None
        _frontend.finish(here)
        key_inputs = _key_inputs.recorded_for_prewarm(self._hex, here.frontend_read_device)
        _compiled_here.store(self._hex, dict(here.made, **_frontend.kept_beside(here, key_inputs)), group)
        known_texts(group, here.made)  # not read back by the CompiledKernel made of it
        return None


def _load_client():
    """kilnd's client, loaded and connected (compiled_here's storer): its put of
    a kernel compiled here; None where the process fell back to stock."""
    from kiln.triton import remote as _triton

    return _triton.store_compiled_here if _triton.active() else None


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
