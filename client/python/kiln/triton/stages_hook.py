"""Kiln's knobs.runtime.add_stages_inspection_hook, set as triton.knobs is
imported (_patches), as knobs.build.impl is (_build_hook).

From Triton 3.7 compile() and the JIT ask this hook for a key before they look
a kernel up, and add it to the kernel's cache key. Set only once Kiln
activates (on its first miss), it changed keys in the middle of a process, and
a process whose kernels all came from local files never set it: one kernel
under two keys, recompiled in every new process. So it is in place from the
start, and its key is empty: Kiln's stages give stock's artifacts byte for
byte, so they belong under stock's key, the one kilnd's workers and
`kiln prewarm` compute (on 3.5 and 3.6 no hook enters the key at all).

Costs an interpreter only this module: the stages are Kiln's once Kiln is
active (triton/remote); until then, or when it fell back, Triton's own.
"""

import os
import sys

from kiln.triton import CACHE_MANAGER as _MANAGER
from kiln.triton import versions as _triton_versions

# (what compile() adds to the kernel's key, what the JIT adds to its in-memory key)
KEY = ("", "")


def stages(*args):
    """knobs.runtime.add_stages_inspection_hook: with no arguments, the key;
    with a backend's (backend, stages, options, language, ...), Kiln's stages
    where Kiln is active."""
    if not args:
        return KEY
    if "kiln.triton.remote" not in sys.modules:  # never activated: nothing of Kiln's compiles here
        return None
    return sys.modules["kiln.triton.remote"].stages_hook(*args)


def install(knobs):
    """The installer of triton.knobs; kiln.enable() claims the knob again."""
    if os.environ.get("TRITON_CACHE_MANAGER") == _MANAGER:
        claim(knobs)


def claim(knobs):
    """Sets the hook, unless the user set their own (their pipeline then runs
    stock, cached through Kiln). Before Triton 3.6 there is no such knob
    (triton/remote wraps the backend instead)."""
    if _triton_versions.has_stages_knob(knobs) and knobs.runtime.add_stages_inspection_hook is None:
        knobs.runtime.add_stages_inspection_hook = stages


def claimed(knobs):
    return getattr(knobs.runtime, "add_stages_inspection_hook", None) is stages


def release():
    knobs = sys.modules.get("triton.knobs")
    if knobs is not None and claimed(knobs):
        knobs.runtime.add_stages_inspection_hook = None
