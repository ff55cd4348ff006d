"""A process's first compile runs here, as stock's does, while the client of
kilnd loads beside it.

Kilnd's client (gRPC and kilnd's API) costs a process 0.3-0.6 s to import
under Wine, about 0.1 s on Linux: paid inside the first compile, it made a
Windows program's first kernel half a second slower than stock's with kilnd
running. A process whose kernels all come from its local index never imports
it. So the first kernel that misses that index is compiled by this process's
own Triton, exactly as stock compiles it, while a thread imports the client,
connects, and then stores the kernel in kilnd; later compiles go through
kilnd as ever.

Only where kilnd serves this process its files (a local kilnd of this
account): its index has already missed here, so kilnd almost never has the
kernel, and the files of the kernel stored reach the next process from
kilnd. Never for a compile ahead (a compile thread's), which kilnd's workers
run. The one thing given up: another process compiling the same first
kernel at the same moment does not wait for this one, as under stock.
KILN_FIRST_COMPILE_HERE=0 turns it off.
"""

import atexit
import logging
import os
import sys
import threading

from kiln.local import compile_threads as _compile_threads
from kiln.local import files as _files
from kiln.service import paths as _paths

log = logging.getLogger("kiln")

_lock = threading.Lock()
_stored = threading.Condition(_lock)  # the loader waits on it for the kernel to store
_taken = False  # the first compile went here (once per process)
_to_store = None  # (hex key, {file name: bytes}) of that compile, once Triton made it
_exiting = False
_loader = None

# At exit, how long the process waits for its first kernel to reach kilnd.
_EXIT_WAIT_SECONDS = 5.0


def take():
    """Whether this thread's compile, one that missed the local index, is the
    first and runs here; if so, the client of kilnd starts loading."""
    global _taken, _loader
    if _taken or "kiln.triton.remote" in sys.modules or _compile_threads.in_compile_thread():
        return False
    if os.environ.get("KILN_FIRST_COMPILE_HERE", "1") == "0":
        return False
    if _paths.served_files_dir() is None or not _files.wanted_as_served_files():
        return False
    with _lock:
        if _taken:
            return False
        _taken = True
        _loader = threading.Thread(target=_load_and_store, name="kiln-client-load", daemon=True)
        _loader.start()
    return True


def store(hex_key, made):
    """Has the loader put the compile's files into kilnd, once it is connected."""
    global _to_store
    with _stored:
        _to_store = (hex_key, made)
        _stored.notify_all()


def _load_and_store():
    try:
        from kiln.triton import remote

        if not remote.active():  # it fell back to stock, with its one warning
            return
        with _stored:  # a first compile that fails stores nothing: the wait ends at exit
            while _to_store is None and not _exiting:
                _stored.wait()
            if _to_store is None:
                return
            hex_key, made = _to_store
        remote.store_compiled_here(hex_key, made)
    except Exception as error:  # noqa: BLE001  (never the program's: the next compile loads it again, and says why)
        log.debug("the first kernel compiled here was not stored in kilnd: %s", error)


@atexit.register
def _wait_at_exit():
    """Lets the first kernel reach kilnd before the process ends; waits for
    nothing if there is none to store."""
    global _exiting
    with _stored:
        _exiting = True
        _stored.notify_all()
        loader = _loader if _to_store is not None else None
    if loader is not None:
        loader.join(_EXIT_WAIT_SECONDS)
