"""Launcher modules this process has loaded, reused by every later kernel
whose launcher has the same source.

Stock Triton, loading a kernel, generates its launcher's C source and then
hashes it, looks the module up in its cache and imports it again, even when
an earlier kernel of the same argument types loaded that very module: most
kernels of a program share a handful of launchers (the source depends on the
argument types, not the kernel). Importing an extension module a second time
gives the same functions (Python keeps a single-phase module's first state),
so the module loaded first serves the rest: about 50 microseconds less for
each kernel whose launcher is not new. Kilnd still sees the module's first
lookup of each process.
"""

import os

from kiln.triton import CACHE_MANAGER as _MANAGER

_loaded = {}  # compile_module_from_src's arguments, lists as tuples -> the module
_sources = set()  # the C source of each module in _loaded


def has_loaded(source):
    """Whether this process has loaded a launcher module built from `source`."""
    return source in _sources


def _frozen(value):
    return tuple(value) if isinstance(value, list) else value


def install(nvidia_driver):
    """Wraps the nvidia driver's compile_module_from_src, once."""
    original = getattr(nvidia_driver, "compile_module_from_src", None)
    if original is None or getattr(original, "_kiln_reuses", False):
        return

    def compile_module_from_src(*args, **kwargs):
        if os.environ.get("TRITON_CACHE_MANAGER") != _MANAGER:  # kiln.disable(): stock again
            return original(*args, **kwargs)
        try:
            key = (tuple(_frozen(value) for value in args),
                   tuple(sorted((name, _frozen(value)) for name, value in kwargs.items())))
            module = _loaded.get(key)
        except TypeError:  # an argument that cannot be a key: nothing to reuse
            return original(*args, **kwargs)
        if module is None:
            module = _loaded[key] = original(*args, **kwargs)
            _sources.add(kwargs.get("src", args[0] if args else None))
        return module

    compile_module_from_src._kiln_reuses = True
    nvidia_driver.compile_module_from_src = compile_module_from_src
