"""A process's first compiles run here, as stock's do, while the client of
kilnd loads beside them.

Kilnd's client (then grpcio and kilnd's API) cost a process about 0.7 s to import
and connect under Wine (about 0.1 s with the client's own transport), about
0.1 s on Linux: paid inside the first compile,
it made a Windows program's first kernel half a second slower than stock's
with kilnd running, and an autotuned kernel's compiles ahead waited for it
before the first of them reached kilnd. A process whose kernels all come from
its local index never imports it. So the first kernel that misses that index
is compiled by this process's own Triton, exactly as stock compiles it, while
a thread imports the client, connects, and then stores the kernel in kilnd;
so is every other kernel that misses until the client is loaded (a compile
ahead's too: Triton's stages let go of the GIL, so compile threads run them
side by side). Later compiles go through kilnd as ever.

Only where kilnd serves this process its files (a local kilnd of this
account, or the user's own that this process is starting, which the first
compile does not wait for): its index has already missed here, so kilnd
almost never has the kernel, and the files of the kernels stored reach the
next process from kilnd. The one thing given up: another process compiling
the same kernel at that moment does not wait for this one, as under stock.
KILN_FIRST_COMPILE_HERE=0 turns it off.
"""

import atexit
import logging
import os
import sys
import threading

from kiln.local import compile_threads as _compile_threads
from kiln.local import files as _files
from kiln.service import early_start as _early_start
from kiln.service import paths as _paths

log = logging.getLogger("kiln")

_lock = threading.Lock()
_to_store = threading.Condition(_lock)  # the loader waits on it for kernels to store
_loading = False  # the loader has begun (once per process)
_loaded = False  # and has connected, or given up: misses go to kilnd's manager now
_gave_up = False  # kilnd's client fell back to stock: nothing compiled here is stored
_queued = []  # (hex key, {file name: bytes}) compiled here, for the loader to store
_storing = 0  # kernels queued or being stored
_exiting = False
_loader = None
# hex key -> {file name: path} of each kernel compiled here: this process's own
# hits until it exits, as stock's files are once written (kilnd has it only
# once the loader stored it).
_compiled_here = {}

# At exit, how long the process waits for the kernels it compiled to reach kilnd.
_EXIT_WAIT_SECONDS = 5.0


def take():
    """Whether this compile, one that missed the local index, runs here: the
    process's first, or any while the client of kilnd is still loading; the
    first starts the loading."""
    global _loading, _loader
    if _loaded or os.environ.get("KILN_FIRST_COMPILE_HERE", "1") == "0":
        return False
    if not _loading and "kiln.triton.remote" in sys.modules:
        return False  # loaded by other means (kiln.enable(), inductor's caches): through it
    if not _kilnd_serves_files_here() or not _files.wanted_as_served_files():
        return False
    with _lock:
        if _loaded:
            return False
        if not _loading:
            _loading = True
            _loader = threading.Thread(target=_load_and_store, name="kiln-client-load", daemon=True)
            _loader.start()
    # A compile thread's turn ends now, not with its frontend: a compile here is
    # Triton's own, stages and all, which let go of the GIL, so the next
    # thread's compile runs beside it. A benchmark still waits for it.
    _compile_threads.end_turn()
    return True


def _kilnd_serves_files_here():
    """Whether kilnd is one of this account's, which serves it files: one that
    says so, or the user's own that this process is starting now (kilnd.exe
    under Wine may answer only after the first miss)."""
    return _paths.served_files_dir() is not None or _early_start.starting()


def store(hex_key, made, group):
    """Has the loader put a compile's files (`made`: {file name: bytes}) into
    kilnd, once it is connected; `group` ({file name: path}) is this process's
    copy, which lookup() finds meanwhile."""
    global _storing
    with _to_store:
        _compiled_here[hex_key] = dict(group)
        if _gave_up:
            return
        _queued.append((hex_key, made))
        _storing += 1
        _to_store.notify_all()


def lookup(hex_key, name):
    """{file name: path} of a kernel this process compiled here that has `name`; None otherwise."""
    files = _compiled_here.get(hex_key)
    return files if files is not None and name in files else None


def _load_and_store():
    global _loaded, _gave_up, _storing
    try:
        from kiln.triton import remote

        connected = remote.active()  # False: it fell back to stock, with its one warning
    except Exception as error:  # noqa: BLE001  (never the program's: the next compile loads it again, and says why)
        log.debug("the client of kilnd did not load: %s", error)
        connected = False
    with _to_store:
        _loaded, _gave_up = True, not connected
        if _gave_up:
            _queued.clear()
            _storing = 0
            return
    while True:
        with _to_store:  # a compile here that fails stores nothing: the wait ends at exit
            while not _queued and not _exiting:
                _to_store.wait()
            if not _queued:
                return
            hex_key, made = _queued.pop(0)
        try:
            remote.store_compiled_here(hex_key, made)
        except Exception as error:  # noqa: BLE001  (kilnd compiles it again when next asked)
            log.debug("a kernel compiled here was not stored in kilnd: %s", error)
        with _to_store:
            _storing -= 1


@atexit.register
def _wait_at_exit():
    """Lets the kernels compiled here reach kilnd before the process ends; waits
    for nothing if there are none to store."""
    global _exiting
    with _to_store:
        _exiting = True
        _to_store.notify_all()
        loader = _loader if _storing else None
    if loader is not None:
        loader.join(_EXIT_WAIT_SECONDS)
