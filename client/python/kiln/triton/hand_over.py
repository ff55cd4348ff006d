"""A hit's files as Triton gets them, from either manager (cache_manager's
local index, remote's kilnd)."""

import sys

from kiln.local import files as _files
from kiln.local import index as _index
from kiln.triton.deferred_texts import HitGroup


def hand_over(key, files):
    """The group Triton gets for a hit made of `files` ({name: path}, the
    frontend output included). Stock Triton would have compiled here if its
    cache dir lacks the kernel: then the frontend's output is shown again, and
    inductor's static launcher (which reads <cache dir>/<key>/<kernel>.cubin)
    finds the cubin there. A HitGroup: CompiledKernel reads its IR texts only
    when asked (triton/deferred_texts)."""
    files = HitGroup(files)
    files.pop(_index.KEY_INPUTS_BLOB, None)
    output = files.pop(_index.OUTPUT_BLOB, None)
    if output is not None or "torch._inductor" in sys.modules:
        new_to_cache_dir = False
        for name, path in files.items():
            new_to_cache_dir |= _files.mirror_cubin(path, key, name)
        if output is not None and new_to_cache_dir:
            from kiln.triton import (
                frontend as _frontend,  # only here: a hit that shows nothing does not import it
            )

            _frontend.replay(_files.read(output))
    return files
