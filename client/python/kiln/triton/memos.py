"""What stock Triton works out again in every process, remembered across this
user's processes, as a compiler cache remembers a compiler's identity:

- triton_key(), the SHA-256 of Triton's own install (its Python sources and
  the 400 MB libtriton): about 0.3 s of CPU in every process that compiles or
  loads a kernel, inductor's compile workers included;
- `ptxas --version` (and the release of each CUDA tool Triton finds): a
  subprocess for each, two or three in every process;
- the platform key of launcher modules, for which Python's
  platform.architecture() runs `file` on the interpreter (POSIX): about 8 ms
  at the first kernel a process loads.

A memo holds the value and a fingerprint of the files it came from: the stat
(size, modification and change times, inode, device) of the tool, or of every
file and directory of the Triton package (a directory's times change as
entries come and go). A value is used only while its fingerprint is what the
files show now, so a reinstalled, upgraded or edited Triton or CUDA computes
it again, as stock does. The fingerprint is taken before the value is
computed: a file that changes meanwhile leaves a memo that never matches.

    <files dir>/memos/<hh>/<62 hex>.json   {"name": ..., "fingerprint": ..., "value": ...}

A memo this process computes is also offered, at its exit, to the local kilnd
that serves this account files (namespace "kiln-memos", the same 64 hex as
key). kilnd serves it back as a file, so a process whose files dir has none
(a fresh KILN_FILES_DIR: a container, a CI job, a cleaned cache) reads it
from there with no call, and starts as warm as one whose files dir has it.
Only to such a kilnd: a fingerprint names this machine's files (inodes,
devices), so a memo means nothing anywhere else.

Installed on the modules of Triton as they are imported (_after_import, which
imports this module then: every module it imports, Triton imports too). Each
value is the one stock computes, so disable() leaves them in place.
"""

import atexit
import functools
import hashlib
import inspect
import itertools
import json
import logging
import os
import shutil
import stat as stat_flags
import sys
import sysconfig
import threading
import time

from kiln.local import files as _files
from kiln.local import index as _index
from kiln.service import paths as _paths
from kiln.triton import recorded_key as _recorded_key
from kiln.triton import versions as _triton_versions

log = logging.getLogger("kiln")


KILND_NAMESPACE = "kiln-memos"
_KILND_BLOB = "memo.json"


def _digest(name):
    return hashlib.sha256(name.encode()).hexdigest()


def _memo_path(name):
    digest = _digest(name)
    return os.path.join(_paths.files_dir(), "memos", digest[:2], digest[2:] + ".json")


def _read_memo_file(path):
    """The memo in the file at `path`; None when there is none or it cannot be read."""
    try:
        memo = json.loads(_files.read(path))
    except (OSError, ValueError):
        return None
    return memo if isinstance(memo, dict) else None


def _kilnds_memo(name):
    """The memo of `name` that kilnd serves this account as a file; None when it serves none."""
    if _paths.served_files_dir() is None:
        return None
    served = _index.lookup_file(KILND_NAMESPACE, _digest(name), _KILND_BLOB)
    if served is None:
        return None
    memo = _read_memo_file(served)
    if memo is not None:
        _kilnds_copies[name] = memo
    return memo


def _memos_of(name):
    """The memos of `name` there are, read as they are asked for: this
    client's own (one still queued for writing included), then kilnd's."""
    path = _memo_path(name)
    memo = _unwritten.get(path) or _read_memo_file(path)
    if memo is not None:
        yield memo
    memo = _kilnds_memo(name)
    if memo is not None:
        yield memo


def _value_for(memo, name, fingerprint):
    """(True, value) when `memo` is the memo of `name` for `fingerprint`, else (False, None)."""
    try:
        if memo["name"] == name and memo["fingerprint"] == fingerprint:
            return True, memo["value"]
    except (KeyError, TypeError):
        pass
    return False, None


def remembered(name, fingerprint, compute, memos=None):
    """The value remembered under `name` for this `fingerprint`, else
    compute()'s, remembered from now on unless it is None (a failure). A memo
    that cannot be read or written is a miss, never an error. `memos`: those
    already read."""
    for memo in _memos_of(name) if memos is None else memos:
        found, value = _value_for(memo, name, fingerprint)
        if found:
            return value
    value = compute()
    if value is not None:
        _write_later(_memo_path(name), {"name": name, "fingerprint": fingerprint, "value": value})
    return value


def remembered_fingerprinting_at_exit(name, fingerprint_of, compute):
    """remembered(), for a fingerprint that costs a tenth of the value or more:
    where a memo exists, fingerprint_of() is taken at once and compared; where
    none does yet, there is nothing to compare, so the value is computed at
    once and the fingerprint taken at this process's exit, off its work.
    fingerprint_of() returns (fingerprint, newest change in ns of the files it
    covers) or None. The memo is written only if no file changed since a
    second before the value was computed: otherwise what the value was
    computed from is not known to be what the fingerprint shows."""
    memos = _memos_of(name)
    first = next(memos, None)  # kilnd's is read only if this client's own does not match
    if first is not None:
        taken = fingerprint_of()
        return compute() if taken is None else remembered(name, taken[0], compute, itertools.chain([first], memos))
    started_ns = time.time_ns()
    value = compute()
    if value is not None:
        with _unwritten_lock:
            _fingerprinted_at_exit.append((name, fingerprint_of, started_ns, value))
    return value


# Changes within this long before a value was computed may fall in the same
# tick of the file system's clock as the computation's start.
_CLOCK_TICK_NS = 1_000_000_000
_fingerprinted_at_exit = []  # (name, fingerprint_of, started_ns, value): written by wait_for_writes


def _fingerprint_deferred():
    with _unwritten_lock:
        deferred = list(_fingerprinted_at_exit)
        _fingerprinted_at_exit.clear()
    for name, fingerprint_of, started_ns, value in deferred:
        taken = fingerprint_of()
        if taken is not None and taken[1] < started_ns - _CLOCK_TICK_NS:
            _write(_memo_path(name), {"name": name, "fingerprint": taken[0], "value": value})
            _offer_to_kilnd({"name": name, "fingerprint": taken[0], "value": value})


# Memos computed here, until a thread of their own has written them: a file's
# creation (and its directories', the first time) costs about 0.5 ms, which a
# process whose memos are absent would otherwise pay on its first kernel.
_unwritten = {}  # path -> memo
_unwritten_lock = threading.Lock()
_writer = None  # the thread writing them, while any are left


def _write_later(path, memo):
    global _writer
    with _unwritten_lock:
        _unwritten[path] = memo
        if _writer is not None:
            return
        _writer = threading.Thread(target=_write_unwritten, name="kiln memo writer", daemon=True)
        try:
            _writer.start()
            return
        except RuntimeError:  # no new threads at interpreter shutdown: written here
            _writer = None
    _write_unwritten()


def _write_unwritten():
    global _writer
    while True:
        with _unwritten_lock:
            if not _unwritten:
                _writer = None
                return
            path, memo = next(iter(_unwritten.items()))
        _write(path, memo)
        _offer_to_kilnd(memo)
        with _unwritten_lock:
            if _unwritten.get(path) is memo:  # not replaced meanwhile
                del _unwritten[path]


def _write(path, memo):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _files.write_text(path, json.dumps(memo))
    except OSError as error:
        log.debug("memo %s not written: %s", path, error)


_kilnds_copies = {}  # name -> the memo kilnd served this process
_for_kilnd = {}  # name -> a memo computed here that kilnd did not serve: offered at exit


def _offer_to_kilnd(memo):
    with _unwritten_lock:
        if _kilnds_copies.get(memo["name"]) != memo:
            _for_kilnd[memo["name"]] = memo


def _send_offers(timeout):
    """Puts the memos computed here into the kilnd that serves this account
    files. At exit: the client's import and the call cost about 0.1 s, once for
    each memo computed on this machine, none in a process that computed none.
    Best effort: a memo kilnd lacks is only computed again."""
    with _unwritten_lock:
        offers = list(_for_kilnd.values())
        _for_kilnd.clear()
    if not offers or _paths.served_files_dir() is None:
        return
    try:
        from kiln.service import api as _api
        from kiln.service import connection as _service

        stub = _service.connect(autostart=False).stub
        for memo in offers:
            stub.Put(_api.PutRequest(namespace=KILND_NAMESPACE, key=_digest(memo["name"]), blobs=[
                _api.blob(_KILND_BLOB, json.dumps(memo).encode())], serve_as_files=True), timeout=timeout)
    except Exception as error:  # never the program's problem
        log.debug("memos not offered to kilnd: %s", error)


@atexit.register
def wait_for_writes(timeout=5.0):
    """Returns once this process's memos are on disk and offered to kilnd (or
    after about `timeout` seconds): at exit, so that the next process finds them."""
    _fingerprint_deferred()
    with _unwritten_lock:
        writer = _writer
    if writer is not None:
        writer.join(timeout)
    _send_offers(timeout=1.0)


def _forget_writer():
    # A child forked while the writer held the lock would wait on it forever;
    # the parent writes what was pending.
    global _unwritten_lock, _writer
    _unwritten_lock, _writer = threading.Lock(), None
    _unwritten.clear()
    _fingerprinted_at_exit.clear()
    _for_kilnd.clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_writer)


def _stat_line(path, stat):
    return f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ctime_ns}\0{stat.st_ino}\0{stat.st_dev}"


def file_fingerprint(path):
    """None when the file cannot be stat'ed (then stock finds out why)."""
    try:
        return _stat_line(path, os.stat(path))
    except OSError:
        return None


def tree_fingerprint(root):
    """A digest of the stat of every file and directory under `root`, bytecode
    caches aside (Python writes them as it imports); None when the tree cannot
    be read. Symbolic links are followed, each directory once."""
    lines, pending, seen = [], [(root, None)], set()
    try:
        while pending:
            directory, listed = pending.pop()
            if listed is None:
                listed = os.stat(directory)
                if (listed.st_dev, listed.st_ino) in seen:
                    continue
                seen.add((listed.st_dev, listed.st_ino))
            lines.append(_stat_line(directory, listed))
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.is_dir():
                        if entry.name != "__pycache__":
                            pending.append((entry.path, _stat_from_listing(entry)))
                    else:
                        lines.append(_stat_line(entry.path, entry.stat()))
    except OSError:
        return None
    return digest_of(lines)


def _stat_from_listing(directory_entry):
    """The stat of a directory as its parent's listing has it, where that costs
    no call of its own: on Windows, for a directory that is no link or
    junction (a listing holds each entry's times and size; about 1 ms a
    directory under Wine, 60 in triton-windows). Only a link can lead to a
    directory twice, so only a link needs the index number (which a Windows
    listing lacks) to follow each once. None elsewhere: os.stat it."""
    if sys.platform != "win32":
        return None  # a POSIX listing has no stats: entry.stat() would be a stat call anyway
    listed = directory_entry.stat(follow_symlinks=False)
    return None if listed.st_file_attributes & stat_flags.FILE_ATTRIBUTE_REPARSE_POINT else listed


def digest_of(stat_lines):
    """The fingerprint of a set of _stat_line()s, in any order."""
    return hashlib.sha256("\n".join(sorted(stat_lines)).encode("utf-8", "surrogateescape")).hexdigest()


def _leave_the_allocator_as_hashing_does():
    """Stock triton_key() reads libtriton in 1 MB chunks. Under glibc, freeing
    the first (mmap'd, being over 128 KB) raises the size above which malloc
    maps fresh pages to about 1 MB, for the rest of the process: blocks of
    128 KB-1 MB come from the heap from then on (strace: after stock's
    triton_key() a 600 KB block is one brk, not an mmap and a munmap). The
    kernel loads that follow allocate such blocks (the CUDA driver's, loading
    a module; a launcher's dlopen). A process whose key was remembered skips
    the read, and on the H100 its kernels then loaded slower than stock's:
    1.02x stock after the first kernel, against 0.88x for the same kernels in
    a process that hashed (gpu_bench, runs at once); 0.92x with this. Two
    blocks of a chunk's size, allocated and freed: the first raises the
    threshold as the read does, the second leaves a megabyte of heap free.
    About 0.1 ms."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, OSError, ValueError):  # Windows has no confstr; a libc without the name
        return
    if not (libc or "").startswith("glibc"):
        return
    for _ in range(2):
        bytes(1 << 20)  # the first mmap'd and freed; the second from the heap, where it stays free


def _computed_once(function):
    """functools.lru_cache, for a value the prefetch may be computing as the
    program asks for it: the program waits for that computation, not runs its
    own beside it."""
    computing = threading.Lock()
    computed = functools.lru_cache()(function)

    @functools.lru_cache()
    def once(*args, **kwargs):
        with computing:
            return computed(*args, **kwargs)

    clear_once = once.cache_clear

    def cache_clear():
        clear_once()
        computed.cache_clear()

    once.cache_clear = cache_clear
    return once


# What the prefetch waits for, as `import triton` goes on: the nvidia backend's
# compiler module (get_ptxas_version), then the whole package (triton_key()).
_nvidia_compiler_imported = threading.Event()
_triton_imported = threading.Event()
# However long an import takes, the prefetch never waits longer than this
# (a Triton with no nvidia backend never imports its compiler).
_PREFETCH_WAIT_SECONDS = 120


def prefetch(knobs_module):
    """Starts what every process's first kernel waits for, on a thread, as
    soon as Triton's knobs are imported: `ptxas --version` twice (the tool's
    release, while the rest of Triton imports; then the backend's key, once
    its module is imported) and triton_key() (once `import triton` is done).
    Stock runs them inside the first compile: under Wine `import triton` takes
    1.1-2.1 s, the key 0.3 s and ptxas 0.3-0.7 s on the first day, when there
    are no memos; with memos, stat()s of Triton's files and of ptxas. A
    program's first kernel then finds them computed, or waits for the rest.
    KILN_PREFETCH=0 turns it off."""
    if os.environ.get("KILN_PREFETCH", "1") == "0":
        return
    try:
        threading.Thread(target=_prefetch, args=(knobs_module,), name="kiln prefetch", daemon=True).start()
    except RuntimeError:  # no new threads at interpreter shutdown: computed when asked
        pass


def note_triton_imported(_triton_module):
    """The installer _after_import runs once `import triton` is done."""
    _triton_imported.set()


def _prefetch(knobs_module):
    try:
        # The default target's ptxas, which serves every target but
        # Blackwell's where TRITON_PTXAS_BLACKWELL_PATH names another binary.
        knobs_module.nvidia.ptxas  # noqa: B018  (its release: NvidiaTool.from_path, remembered)
        if _nvidia_compiler_imported.wait(_PREFETCH_WAIT_SECONDS) and _warm_ptxas_version is not None:
            _warm_ptxas_version()
        if _triton_imported.wait(_PREFETCH_WAIT_SECONDS):
            _triton_versions.triton_key()
    except Exception as error:  # noqa: BLE001  (the program's own call computes it, and meets the error)
        log.debug("prefetch: %s", error)


def install_triton_key(cache_module):
    """triton_key() of the module that defines it (triton/versions), remembered
    for this Triton install."""
    if not _triton_versions.defines_triton_key(cache_module):
        return
    original = cache_module.triton_key
    if getattr(original, "_kiln_memo", False):
        return
    triton_dir = os.path.dirname(os.path.dirname(os.path.abspath(cache_module.__file__)))

    cache_info = getattr(original, "cache_info", None)

    @_computed_once
    def triton_key():
        if cache_info is not None and cache_info().currsize:  # computed in this process already
            return original()
        fingerprint = tree_fingerprint(triton_dir)
        if fingerprint is None:
            return original()
        # The libtriton it hashes depends on the interpreter's extension suffix.
        name = f"triton_key\0{triton_dir}\0{sysconfig.get_config_var('EXT_SUFFIX')}"
        hashed = []

        def compute():
            key = _recorded_key.key_without_hashing_libtriton(original)
            return key if key is not None else hashed.append(True) or original()

        key = remembered(name, fingerprint, compute)
        if not hashed:
            _leave_the_allocator_as_hashing_does()
        return key

    triton_key._kiln_memo = True
    cache_module.triton_key = triton_key


def install_tool_versions(knobs_module):
    """knobs.NvidiaTool.from_path (which runs `<tool> --version` for its release),
    remembered for each tool binary."""
    tool_class = getattr(knobs_module, "NvidiaTool", None)
    original = getattr(tool_class, "from_path", None)
    if original is None or getattr(original, "_kiln_memo", False):
        return

    # A miss runs stock's function itself, not its lru_cache: clearing this
    # one's cache (as stock's) then asks the tool again.
    run_tool = getattr(original, "__wrapped__", original)

    @_computed_once
    def from_path(path):
        fingerprint = file_fingerprint(path)
        if fingerprint is None:
            return run_tool(path)

        def release():
            tool = run_tool(path)
            return None if tool is None else tool.version

        version = remembered(f"tool release\0{path}", fingerprint, release)
        return None if version is None else tool_class(path, version)

    from_path._kiln_memo = True
    tool_class.from_path = staticmethod(from_path)


def install_ptxas_version(nvidia_compiler):
    """The nvidia backend's get_ptxas_version (`ptxas --version`, which enters
    every kernel's cache key), remembered for each ptxas binary; the prefetch
    may ask for it from now on."""
    try:
        _remember_ptxas_version(nvidia_compiler)
    finally:
        _nvidia_compiler_imported.set()


def _remember_ptxas_version(nvidia_compiler):
    global _warm_ptxas_version
    original = getattr(nvidia_compiler, "get_ptxas_version", None)
    if original is None or getattr(original, "_kiln_memo", False):
        return
    from triton import knobs

    run_ptxas = getattr(original, "__wrapped__", original)
    version_signature = inspect.signature(run_ptxas)
    ptxas_takes_arch = _triton_versions.ptxas_is_per_arch(nvidia_compiler)

    def remembered_version(*args, **kwargs):
        """The version of the ptxas these arguments name, from its memo, else
        run (None where ptxas cannot be fingerprinted)."""
        bound = version_signature.bind(*args, **kwargs)
        bound.apply_defaults()
        tool = nvidia_compiler.get_ptxas(*bound.args) if ptxas_takes_arch else nvidia_compiler.get_ptxas()
        fingerprint = file_fingerprint(tool.path)
        if fingerprint is None:
            return None
        # The output depends on the binary alone: one memo serves every arch it compiles for.
        name = f"ptxas --version\0{tool.path}"
        with _lock_of(name):  # the prefetch may be running it: its memo, not a second run
            return remembered(name, fingerprint, lambda: run_ptxas(*args, **kwargs))

    @functools.lru_cache()
    def get_ptxas_version(*args, **kwargs):
        if getattr(knobs.nvidia, "mock_ptx_version", None) is not None:
            return run_ptxas(*args, **kwargs)
        version = remembered_version(*args, **kwargs)
        return run_ptxas(*args, **kwargs) if version is None else version

    def warm():
        """The default target's memo, not get_ptxas_version's cache: stock
        fills that at the first compile, and the mock knob, or the
        TRITON_PTXAS_PATH that inductor sets to torch's own ptxas, may change
        before it."""
        if getattr(knobs.nvidia, "mock_ptx_version", None) is None:
            remembered_version()

    get_ptxas_version._kiln_memo = True
    nvidia_compiler.get_ptxas_version = get_ptxas_version
    _warm_ptxas_version = warm


_warm_ptxas_version = None  # the prefetch's, once the nvidia backend's compiler is imported
_memo_locks = {}
_memo_locks_lock = threading.Lock()


def _lock_of(name):
    with _memo_locks_lock:
        return _memo_locks.setdefault(name, threading.Lock())


def install_platform_key(build_module):
    """triton.runtime.build.platform_key, remembered for this interpreter
    binary, this `file` command and this machine (Windows runs no `file`)."""
    original = getattr(build_module, "platform_key", None)
    if original is None or getattr(original, "_kiln_memo", False) or sys.platform == "win32":
        return
    run_key = getattr(original, "__wrapped__", original)

    @functools.lru_cache()
    def platform_key():
        interpreter = file_fingerprint(os.path.realpath(sys.executable))
        if interpreter is None:
            return run_key()
        file_command = shutil.which("file")
        file_tool = file_fingerprint(file_command) if file_command else None
        machine = os.uname()
        fingerprint = "\n".join((interpreter, file_tool or "no file command", machine.sysname, machine.machine))
        return remembered(f"platform_key\0{sys.executable}", fingerprint, run_key)

    platform_key._kiln_memo = True
    build_module.platform_key = platform_key
