"""Artifacts as local files. Triton's cache API hands out paths: kilnd's served
files where kilnd names them (a local client of its own account), otherwise
every blob kilnd returns as bytes is materialized once under files_dir() with a
short, content-addressed name: <hh>/<38 hex><extension>. A file is written under a
unique temporary name and renamed into place; an existing file with the right
content is reused, never rewritten, so a file another process holds open
(a loaded launcher module on Windows) is never replaced.

A compile's files that kilnd serves the next process (its own account,
locally) are this process's alone (scratch): Triton needs a path for each as
its stages make it, and kilnd writes its own served files and index once it
has stored the kernel. They live under files_dir()/scratch/<pid>-<nonce>/,
unique names no other process reads, and go at this process's exit: a kernel
then costs no lasting file of the client's own. One that becomes a shared file
after all is moved where materialize puts it (promote)."""

import atexit
import contextlib
import hashlib
import os
import shutil
import time
import uuid
from pathlib import Path

from kiln.service import paths as _paths


def extension(name):
    """Everything from the first dot: '.cubin', '.json', '.cpython-311-x86_64-linux-gnu.so'.
    Triton tells artifacts apart by the path's suffix, and imports modules by it."""
    dot = name.find(".")
    return name[dot:] if dot > 0 else ""


# The files here are read and written with the OS's calls alone (os.open,
# os.read, os.write): Python's file objects add a stat, an isatty and a seek
# to each file, which under Windows (Wine, 2 cores) made writing a compile's
# seven files three times as costly (180 files: 0.2 s against 0.06 s).
_READ = os.O_RDONLY | getattr(os, "O_BINARY", 0)
_WRITE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)


def read(path):
    descriptor = os.open(path, _READ)
    try:
        chunks = []
        # Not larger: each read allocates its whole size first, and most files
        # read here (index entries, memos) are a few hundred bytes.
        while chunk := os.read(descriptor, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(descriptor)


def _write_new(path, data):
    """Writes `data` to a new file at `path` (FileExistsError if there is one)."""
    descriptor = os.open(path, _WRITE_NEW, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view):]
    finally:
        os.close(descriptor)


def _has_content(path, data, digest):
    try:
        if os.stat(path).st_size != len(data):
            return False
        return hashlib.sha256(read(path)).digest() == digest
    except OSError:
        return False


_made_dirs = set()  # directories this process knows exist: one mkdir each, not one per file


def _content_path(name, digest):
    """(directory, path) of the content-addressed file of `digest` and `name`'s extension."""
    hex_digest = digest.hex()
    directory = os.path.join(_paths.files_dir(), hex_digest[:2])
    return directory, os.path.join(directory, hex_digest[2:40] + extension(name))


def materialize(name, data, digest=None):
    """The path of a file holding `data`, named for its content and `name`'s extension."""
    digest = digest or hashlib.sha256(data).digest()
    directory, path = _content_path(name, digest)
    if _has_content(path, data, digest):
        return path
    if directory not in _made_dirs:
        os.makedirs(directory, exist_ok=True)
        _made_dirs.add(directory)
    temp = os.path.join(directory, f".{uuid.uuid4().hex[:12]}.tmp")
    try:
        _write_new(temp, data)
    except FileNotFoundError:  # the directory went away under us: once more
        _made_dirs.discard(directory)
        os.makedirs(directory, exist_ok=True)
        _write_new(temp, data)
    try:
        os.replace(temp, path)
    except OSError:
        # The target is held open (Windows) or was just written by another
        # process: either way, one with the right content is as good as ours.
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if not _has_content(path, data, digest):
            raise
    return path


_SCRATCH_DIR = "scratch"
# A scratch dir unchanged this long is a killed process's: the next process to
# make one removes it. A live process's dir changes with each of its compiles.
_SCRATCH_ABANDONED_SECONDS = 24 * 3600
_own_scratch = None  # (pid, dir): this process's scratch dir, once made


def _remove_scratch(pid, directory):
    if os.getpid() == pid:  # not a forked child's exit: the dir is its parent's
        shutil.rmtree(directory, ignore_errors=True)


def _scratch_dir():
    global _own_scratch
    if _own_scratch is None or _own_scratch[0] != os.getpid():
        root = os.path.join(_paths.files_dir(), _SCRATCH_DIR)
        with contextlib.suppress(OSError), os.scandir(root) as others:
            abandoned_before = time.time() - _SCRATCH_ABANDONED_SECONDS
            for other in others:
                with contextlib.suppress(OSError):
                    if other.stat(follow_symlinks=False).st_mtime < abandoned_before:
                        shutil.rmtree(other.path, ignore_errors=True)
        _own_scratch = (os.getpid(), os.path.join(root, f"{os.getpid()}-{uuid.uuid4().hex[:8]}"))
        atexit.register(_remove_scratch, *_own_scratch)
    return _own_scratch[1]


def scratch(name, data):
    """A file of this process's own holding `data`, with `name`'s extension."""
    path = os.path.join(_scratch_dir(), uuid.uuid4().hex[:16] + extension(name))
    for attempt in (1, 2):
        try:
            _write_new(path, data)
            return path
        except FileNotFoundError:  # not made yet, or removed under us: (once more) made
            if attempt == 2:
                raise
            os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def is_scratch(path):
    return _own_scratch is not None and os.path.dirname(path) == _own_scratch[1]


def discard(path):
    """Removes a scratch file (one already gone is no matter)."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def promote(path, name, data, digest=None):
    """The content-addressed file of `data`, made from the scratch file `path` holding it."""
    digest = digest or hashlib.sha256(data).digest()
    directory, target = _content_path(name, digest)
    if _has_content(target, data, digest):
        discard(path)
        return target
    try:
        if directory not in _made_dirs:
            os.makedirs(directory, exist_ok=True)
            _made_dirs.add(directory)
        os.replace(path, target)
        return target
    except OSError:  # held open (Windows), or moved meanwhile: written as any other
        discard(path)
        return materialize(name, data, digest)


_served_files_readable = None  # None: not known yet


def wanted_as_served_files():
    """Whether to ask kilnd for blobs as the files it serves (Blob.path): a hit
    then moves no bytes. Not once this process found it may not read them (a
    machine kilnd whose files are its own account's)."""
    return _served_files_readable is not False


def readable_served(entry):
    """False when `entry` names served files this process may not read; then it
    asks for bytes from now on."""
    global _served_files_readable
    if _served_files_readable is None:
        served = next((blob.path for blob in entry.blobs if blob.path), None)
        if served is None:
            return True
        _served_files_readable = os.access(served, os.R_OK)
    return _served_files_readable


def path_of(blob):
    """A file with the blob's content: kilnd's served file, or one written here."""
    if blob.path:
        return blob.path
    return materialize(blob.name, blob.data, blob.sha256)


def write_text(path, text):
    """Writes `text` to `path` whole or not at all: under a unique temporary
    name beside it, then renamed over it, so a reader never sees part of it.
    Raises OSError, leaving no temporary file behind."""
    temp = f"{path}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        _write_new(temp, text.encode("utf-8"))
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def link(source, target):
    """Makes `target` a hard link to (or, across file systems, a copy of) `source`.
    False when `target` was there already."""
    target = Path(target)
    if target.exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{uuid.uuid4().hex[:12]}.tmp")
    try:
        os.link(source, temp)
    except OSError:
        temp.write_bytes(Path(source).read_bytes())
    try:
        os.replace(temp, target)
    except OSError:
        temp.unlink(missing_ok=True)
    return True


def mirror_cubin(path, cache_key, filename):
    """Inductor's static CUDA launcher reads <triton cache dir>/<key>/<kernel>.cubin
    (and falls back to Triton's launcher without it): gives it a copy there. True
    when Triton's cache dir did not have it yet (not a cubin: False)."""
    if not filename.endswith(".cubin"):
        return False
    from triton import knobs

    try:
        return link(path, os.path.join(knobs.cache.dir, cache_key, filename))
    except OSError:
        return True
