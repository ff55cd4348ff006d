"""The threads that compile kernels ahead of their first use: an autotuned
kernel's configs (_autotune_ahead) and a torch.compile graph's Triton kernels
(_inductor_threads). One pool for both, so they never add up to more threads
than it has. Each thread runs the frontend in this process (it needs this
Python; Triton's pass managers let go of the GIL) while the stages from LLIR
to the cubin run in kilnd's worker processes.

KILN_COMPILE_THREADS sets how many (KILN_AUTOTUNE_THREADS, its first name, is
read too); the default is half the cores, 2 to 8: kilnd's workers need the
rest, and on an H100 machine of 16 cores 4 and 8 threads beat 16 to an
autotuned kernel's first result."""

import os
import sys
import threading

_executor = None
_executor_lock = threading.Lock()


def serving():
    """Whether Kiln serves this process's Triton compiles now (not before
    kiln.enable(), not after kiln.disable() or a fall back to stock)."""
    from kiln import _MANAGER

    if os.environ.get("TRITON_CACHE_MANAGER") != _MANAGER:
        return False
    triton_side = sys.modules.get("kiln._triton")
    return triton_side is None or triton_side.active_or_untried()


def thread_count():
    asked = os.environ.get("KILN_COMPILE_THREADS") or os.environ.get("KILN_AUTOTUNE_THREADS") or "0"
    try:
        count = int(asked)
    except ValueError:
        count = 0
    return count if count > 0 else max(2, min(8, (os.cpu_count() or 4) // 2))


def pool():
    global _executor
    with _executor_lock:
        if _executor is None:
            from concurrent.futures import ThreadPoolExecutor

            _executor = ThreadPoolExecutor(max_workers=thread_count(), thread_name_prefix="kiln-compile")
        return _executor
