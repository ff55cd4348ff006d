"""Kiln's knobs.build.impl, set as triton.knobs is imported (_patches).

Wherever it is unset Triton builds launcher and cuda_utils modules with the
machine's C compiler, which an embedded Python (no Python.h) cannot use and
KILN_STRICT forbids. A process whose kernels and modules all come from the
local index never activates Kiln (it makes no call to kilnd), yet it builds a
module when one from the index fails to load. So the hook is in place from
the start, and costs an interpreter only this module: Kiln activates, its client and
all, once a build is asked for.
"""

import os
import sys

from kiln.triton import CACHE_MANAGER as _MANAGER


def build(name, src, srcdir, library_dirs, include_dirs, libraries):
    """knobs.build.impl: kilnd builds the module; stock Triton's compiler where
    Kiln fell back (under KILN_STRICT, KilnUnavailable instead)."""
    from kiln.triton import remote as _triton

    _triton.active()
    return _triton.build_module(name, src, srcdir, library_dirs, include_dirs, libraries)


def install(knobs):
    """The installer of triton.knobs. After kiln.disable() a later import of
    it leaves Triton stock: kiln.enable() claims the knob again (triton/remote)."""
    if os.environ.get("TRITON_CACHE_MANAGER") == _MANAGER:
        claim(knobs)


def claim(knobs):
    """Sets knobs.build.impl, unless the user set their own. Tritons older
    than Kiln supports may have no such knob."""
    settings = getattr(knobs, "build", None)
    if settings is not None and getattr(settings, "impl", False) is None:
        settings.impl = build


def release():
    knobs = sys.modules.get("triton.knobs")
    if knobs is not None and getattr(knobs.build, "impl", None) is build:
        knobs.build.impl = None
