"""Kernels this process compiles with its own Triton, exactly as stock
compiles them, which kilnd then stores (a thread puts them, off the program's
work) and serves to the next process.

Only where kilnd serves this process its files (a local kilnd of this
account, or the user's own that this process is starting, which the first
compile does not wait for): the files of the kernels stored reach the next
process from kilnd. Two kinds of compile run here:

- A process's first compiles. Kilnd's client (then grpcio and kilnd's API)
  cost a process about 0.7 s to import and connect under Wine (about 0.1 s
  with the client's own transport), about 0.1 s on Linux: paid inside the
  first compile, it made a Windows program's first kernel half a second
  slower than stock's with kilnd running, and an autotuned kernel's compiles
  ahead waited for it before the first of them reached kilnd. A process whose
  kernels all come from its local index never imports it. So the first kernel
  that misses that index compiles here while a thread imports the client,
  connects, and then stores the kernel; so does every other kernel that misses
  until the client is loaded (a compile ahead's too: Triton's stages let go of
  the GIL, so compile threads run them side by side). Its index has already
  missed here, so kilnd almost never has the kernel. The one thing given up:
  another process compiling the same kernel at that moment does not wait for
  this one, as under stock. KILN_FIRST_COMPILE_HERE=0 turns it off.
- Once the client is loaded, the program's own compiles (kernels it launches
  one after another, not Kiln's compiles ahead: remote.compiles_here). A
  compile through kilnd's worker cost the program what stock's does plus a
  hand-off: its IR sent, the artifacts sent back, a worker's turn (about 35 ms
  a kernel on Linux, 60 ms under Wine), and bought nothing, since the program
  waits for each kernel anyway. The process still holds kilnd's claim on the
  kernel, taken with its lookup, until kilnd has stored it: another process
  asking for it meanwhile waits for this compile rather than running its own.
  KILN_COMPILE_HERE=0 sends them to kilnd's workers instead.
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
_to_store = threading.Condition(_lock)  # the storer waits on it for kernels to store
_loading = False  # the storer has begun loading the client (a first compile's, once per process)
_loaded = False  # and has connected, or given up: misses go to kilnd's manager now
_gave_up = False  # kilnd's client fell back to stock: nothing compiled here is stored
_queued = []  # (hex key, [kiln.v1.Blob] or {file name: bytes}, claim or None), for the storer
_storing = 0  # kernels queued or being stored
_exiting = False
_storer = None  # the thread that loads the client (a first compile's) and stores the kernels
# hex key -> {file name: path} of each kernel compiled here: this process's own
# hits until it exits, as stock's files are once written (kilnd has it only
# once the storer stored it).
_compiled_here = {}

# At exit, how long the process waits for the kernels it compiled to reach kilnd.
_EXIT_WAIT_SECONDS = 5.0


def take(load_client):
    """Whether this compile, one that missed the local index, runs here: the
    process's first, or any while the client of kilnd is still loading; the
    first starts the loading, by `load_client()`: the function that puts a
    kernel into kilnd once the client is loaded and connected, or None where
    the process fell back to stock Triton."""
    global _loading
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
            _start_storer(load_client)
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


def _start_storer(load_client):
    """Holding _lock."""
    global _storer
    _storer = threading.Thread(target=_load_and_store, args=(load_client,), name="kiln-store-compiled-here",
                               daemon=True)
    _storer.start()


def store(hex_key, made, group, claim=None, load_client=None):
    """Has the storer put a compile's files into kilnd (`made`: {file name:
    bytes}, or the kiln.v1.Blobs to put), once the client is connected, then
    end `claim` (the compile's LookupOrClaim call, if this process holds the
    kernel's claim): a process waiting on it then finds the kernel stored.
    `group` ({file name: path}) is this process's copy, which lookup() finds
    meanwhile. `load_client`: as take()'s, for a storer not started yet."""
    global _storing
    with _to_store:
        _compiled_here[hex_key] = dict(group)
        queued = not _gave_up
        if queued:
            _queued.append((hex_key, made, claim))
            _storing += 1
            if _storer is None:  # the client was loaded by a compile through it, not a first compile
                _start_storer(load_client)
            _to_store.notify_all()
    if not queued and claim is not None:
        claim.cancel()


def lookup(hex_key, name):
    """{file name: path} of a kernel this process compiled here that has `name`; None otherwise."""
    files = _compiled_here.get(hex_key)
    return files if files is not None and name in files else None


def _load_and_store(load_client):
    global _loaded, _gave_up, _storing
    try:
        put = load_client()  # None: it fell back to stock, with its one warning
    except Exception as error:  # noqa: BLE001  (never the program's: the next compile loads it again, and says why)
        log.debug("the client of kilnd did not load: %s", error)
        put = None
    connected = put is not None
    with _to_store:
        _loaded, _gave_up = True, not connected
        if _gave_up:
            dropped = [claim for _, _, claim in _queued if claim is not None]
            _queued.clear()
            _storing = 0
    if _gave_up:
        for claim in dropped:
            claim.cancel()
        return
    while True:
        with _to_store:  # a compile here that fails stores nothing: the wait ends at exit
            while not _queued and not _exiting:
                _to_store.wait()
            if not _queued:
                return
            hex_key, made, claim = _queued.pop(0)
        try:
            put(hex_key, made)
        except Exception as error:  # noqa: BLE001  (kilnd compiles it again when next asked)
            log.debug("a kernel compiled here was not stored in kilnd: %s", error)
        finally:
            if claim is not None:
                claim.cancel()  # after the put: a process waiting on it finds the kernel stored
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
        storer = _storer if _storing else None
    if storer is not None:
        storer.join(_EXIT_WAIT_SECONDS)
