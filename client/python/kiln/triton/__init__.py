"""Kiln inside Triton, through Triton's own extension points: the cache
manager (cache_manager; a hit's files handed over by hand_over, keyed by
keys), the manager over kilnd and the stages that compile there (remote, with
lookup for a kernel kilnd has), the build hook and the stages hook
(build_hook, stages_hook), launchers (early_launchers, launcher_origin,
loaded_launchers), the frontend's guard and replay (frontend), what a key is
made of (key_inputs), IR texts read when asked (deferred_texts), an autotuned
kernel's configs compiled at once (autotune_ahead), what stock works out again
in every process (memos; recorded_key for a first day's key), and where each
part of Triton is (versions).

This module itself is imported at interpreter start under KILN=1: it holds only
what kiln's activation and the hooks ask before Triton is imported."""

import os
import sys

# What TRITON_CACHE_MANAGER names while Kiln is enabled, in this process and
# the children it starts. Users write it in their configs too: kiln/_cache.py
# stays where it says.
CACHE_MANAGER = "kiln._cache:KilnCacheManager"


def serving():
    """Whether Kiln serves this process's Triton compiles now (not before
    kiln.enable(), not after kiln.disable() or a fall back to stock)."""
    if os.environ.get("TRITON_CACHE_MANAGER") != CACHE_MANAGER:
        return False
    # Another thread may be importing it: a module half made, which has not
    # fallen back either (its import does not).
    active_or_untried = getattr(sys.modules.get("kiln.triton.remote"), "active_or_untried", None)
    return active_or_untried is None or active_or_untried()
