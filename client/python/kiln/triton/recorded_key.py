"""Stock triton_key() with libtriton's SHA-256 read from the install's record,
not computed: a first day's key in milliseconds rather than 0.3 s.

triton_key() is the SHA-256 of Triton's Python sources and of libtriton, a
400 MB library on Linux (120 MB on Windows). A process with no memo of the
key (memos.py: a user's first day, a fresh venv or container) hashes all of
it, and its first kernel waits. pip and uv write each installed file's SHA-256
and size into the wheel's RECORD (the same digest, base64 rather than hex),
so the library's digest is known without reading it, while the library is
the file the installer wrote.

"The file the installer wrote": its size is RECORD's and it was last changed
no later than RECORD was written (an in-place edit or rebuild changes its
mtime, and on POSIX its ctime, which nothing but root can set back). Where
either fails, where no RECORD lists it (an editable or source install), or
two disagree, the key is stock's, hashed.

The key is computed by stock's own function, run with its module's `open`
and `hashlib` seen through stand-ins: opening libtriton yields a marker in
place of its bytes, and the SHA-256 fed exactly that marker answers with the
recorded digest. Everything else (which files, in what order, how they are
joined) is the installed Triton's own code, so a Triton that changes how it
composes its key changes this key with it. Should the marker reach anything
but a SHA-256 it answers for (another Triton's way of hashing the library),
the key is stock's, hashed."""

import base64
import binascii
import builtins
import hashlib
import inspect
import os
import sys
import sysconfig
import types


class _NotAsRecorded(Exception):
    """The library's bytes were used in a way the recorded digest cannot stand for."""


def key_without_hashing_libtriton(original):
    """triton_key() as `original` (stock's, perhaps lru-cached) computes it,
    with libtriton's digest from RECORD; None where that cannot be trusted
    (the caller then runs `original`)."""
    function = inspect.unwrap(original)
    code, module_globals = getattr(function, "__code__", None), getattr(function, "__globals__", None)
    if code is None or module_globals is None or function.__closure__:
        return None
    module_file = module_globals.get("__file__")
    if not module_file:
        return None
    triton_dir = os.path.dirname(os.path.dirname(os.path.abspath(module_file)))
    library = os.path.join(triton_dir, "_C", "libtriton." + sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1])
    recorded = recorded_sha256(library)
    if recorded is None:
        return None
    stand_ins = _StandIns(library, recorded)
    shimmed = types.FunctionType(code, dict(module_globals, open=stand_ins.open, hashlib=stand_ins),
                                 function.__name__, function.__defaults__)
    try:
        key = shimmed()
    except _NotAsRecorded:
        return None
    return key if stand_ins.opened == stand_ins.answered else None


def recorded_sha256(path):
    """The hex SHA-256 that the RECORD of the wheel which installed `path`
    gives it, while the file is as installed; None otherwise."""
    path = os.path.abspath(path)
    site_packages = os.path.dirname(os.path.dirname(os.path.dirname(path)))  # .../triton/_C/libtriton.so
    relative = os.path.relpath(path, site_packages).replace(os.sep, "/")
    try:
        installed = os.stat(path)
        listed = [entry.path for entry in os.scandir(site_packages)
                  if entry.name.endswith(".dist-info") and entry.name.lower().startswith(("triton", "pytorch_triton"))]
    except OSError:
        return None
    found = set()
    for dist_info in listed:
        record = os.path.join(dist_info, "RECORD")
        digest = _digest_in_record(record, relative, installed)
        if digest is not None:
            found.add(digest)
    return found.pop() if len(found) == 1 else None


def _digest_in_record(record, relative, installed):
    """`relative`'s hex SHA-256 in `record`, if its size is the installed
    file's and the file has not changed since the record was written."""
    try:
        written = os.stat(record)
        with builtins.open(record, encoding="utf-8") as lines:
            line = next((line for line in lines if line.startswith(relative + ",")), None)
    except (OSError, UnicodeError):
        return None
    if line is None:
        return None
    fields = line.rstrip("\r\n").rsplit(",", 2)
    if len(fields) != 3 or not fields[1].startswith("sha256=") or fields[2] != str(installed.st_size):
        return None
    # ctime on POSIX: an edit's mtime can be set back (cp -p, touch -r), its ctime
    # cannot. On Windows st_ctime is the creation time, which says nothing of edits.
    changed = installed.st_mtime_ns if sys.platform == "win32" else max(installed.st_mtime_ns, installed.st_ctime_ns)
    if changed > written.st_mtime_ns:
        return None
    encoded = fields[1][len("sha256="):]
    try:
        digest = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):
        return None
    return digest.hex() if len(digest) == 32 else None


class _StandIns:
    """What stock's triton_key() sees as `open` and `hashlib`: the library,
    opened, reads as one marker; a SHA-256 fed exactly the marker answers
    with the recorded digest. Everything else is the real thing."""

    def __init__(self, library, recorded):
        self._library = os.path.normcase(os.path.abspath(library))
        self.recorded = recorded
        self.marker = os.urandom(32)
        self.opened = 0  # times the library was opened
        self.answered = 0  # digests given as recorded

    def open(self, file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.normcase(os.path.abspath(file)) == self._library:
            self.opened += 1
            return _MarkerFile(self.marker)
        return builtins.open(file, *args, **kwargs)

    def sha256(self, data=b"", **kwargs):
        return _Sha256(self, data, **kwargs)

    def __getattr__(self, name):  # hashlib's other functions, as they are
        return getattr(hashlib, name)


class _MarkerFile:
    def __init__(self, marker):
        self._unread = [marker]

    def read(self, _size=-1):
        return self._unread.pop() if self._unread else b""

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        return False


class _Sha256:
    def __init__(self, stand_ins, data=b"", **kwargs):
        self._stand_ins = stand_ins
        self._real = hashlib.sha256(**kwargs)
        self._fed_marker = self._fed_other = False
        self.update(data)

    def update(self, data):
        if len(data) == len(self._stand_ins.marker) and bytes(data) == self._stand_ins.marker:
            if self._fed_marker:
                raise _NotAsRecorded()
            self._fed_marker = True
        elif data:
            self._fed_other = True
            self._real.update(data)

    def hexdigest(self):
        if not self._fed_marker:
            return self._real.hexdigest()
        if self._fed_other:
            raise _NotAsRecorded()
        self._stand_ins.answered += 1
        return self._stand_ins.recorded

    def digest(self):
        if self._fed_marker:
            raise _NotAsRecorded()
        return self._real.digest()
