"""Kiln's knobs.runtime.add_stages_inspection_hook, on Triton 3.6 (elsewhere
triton/remote wraps CUDABackend.add_stages: versions.uses_stages_knob says
why), set as triton.knobs is imported (_patches), as knobs.build.impl is
(_build_hook), so that it is in place whenever Triton compiles; its stages
are Kiln's once Kiln is active (triton/remote), until then, or when it fell
back, Triton's own. Triton 3.6 keys nothing by the hook: Kiln's stages give
stock's artifacts byte for byte, under stock's key.

Costs an interpreter only this module.
"""

import os
import sys

from kiln.triton import CACHE_MANAGER as _MANAGER
from kiln.triton import versions as _triton_versions


def stages(*args):
    """knobs.runtime.add_stages_inspection_hook: called by a backend with its
    (backend, stages, options, language, ...), Kiln's stages where Kiln is
    active."""
    # Not imported: never activated, nothing of Kiln's compiles here. Still
    # being imported by another thread (compiled_here): not active yet.
    hook = getattr(sys.modules.get("kiln.triton.remote"), "stages_hook", None)
    return None if hook is None else hook(*args)


def install(knobs):
    """The installer of triton.knobs; kiln.enable() claims the knob again."""
    if os.environ.get("TRITON_CACHE_MANAGER") == _MANAGER:
        claim(knobs)


def claim(knobs):
    """Sets the hook, unless the user set their own (their pipeline then runs
    stock, cached through Kiln) or this Triton takes Kiln's stages otherwise."""
    if _triton_versions.uses_stages_knob(knobs) and knobs.runtime.add_stages_inspection_hook is None:
        knobs.runtime.add_stages_inspection_hook = stages


def claimed(knobs):
    return getattr(knobs.runtime, "add_stages_inspection_hook", None) is stages


def release():
    knobs = sys.modules.get("triton.knobs")
    if knobs is not None and claimed(knobs):
        knobs.runtime.add_stages_inspection_hook = None
