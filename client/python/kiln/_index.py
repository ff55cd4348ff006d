"""The local indexes: which files make up an entry this user's processes can
read, so that a process serves it from those files as stock Triton serves its
file cache: no round trip, no gRPC import, no hashing. Two of them, one format:

- kilnd's (served_files.h): the files kilnd itself writes for its local
  clients (after each of their compiles, and on lookups asking for files),
  found through "<endpoint>.files" beside its socket or endpoint file;
- this client's own, under <files dir>/index, for entries whose bytes kilnd
  sent (it serves files only to its own account) or that this process made.

    <root>/index/<hh>/<62 hex>.json   {"files": {name: [path, size]}}

named by the SHA-256 of "<namespace>\0<key>". An entry is used only if every
file is there with its recorded size; files are written once under names
derived from their SHA-256, so an entry can go stale (a file removed) but
never point at other content of the same name. Hits served here reach kilnd
later, in batches, for its stats and LRU.
"""

import atexit
import hashlib
import json
import logging
import os
import threading
import uuid

from . import _paths

log = logging.getLogger("kiln")

_FLUSH_DELAY = 2.0  # seconds after the first unrecorded hit: off the program's startup
_pending = {}  # namespace -> [key], hits not yet sent to kilnd
_pending_lock = threading.Lock()
_flush_timer = None


def _entry_path(root, namespace, key):
    digest = hashlib.sha256(f"{namespace}\0{key}".encode()).hexdigest()
    return os.path.join(root, "index", digest[:2], digest[2:] + ".json")


def _read(path, name):
    try:
        with open(path, encoding="utf-8") as index:
            entry = json.load(index)
        listed = entry["files"]
        if name not in listed:
            return None
        files = {}
        for file_name, (file_path, size) in listed.items():
            if os.stat(file_path).st_size != size:
                return None
            files[file_name] = file_path
        return files
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lookup(namespace, key, name):
    """{file name: path} of the entry that has `name`, when every file is still
    there: from kilnd's index (which has every entry it sent as files), else this
    client's; None otherwise."""
    for root_of in (_paths.served_files_dir, _paths.files_dir):
        root = root_of()
        if root is None:
            continue
        files = _read(_entry_path(root, namespace, key), name)
        if files is not None:
            _count_hit(namespace, key)
            return files
    return None


def record(namespace, key, files):
    """Remembers in this client's index that `files` ({file name: path}) make up
    the entry; best effort."""
    try:
        entry = {"files": {file_name: [path, os.stat(path).st_size] for file_name, path in files.items()}}
        target = _entry_path(_paths.files_dir(), namespace, key)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        temp = f"{target}.{uuid.uuid4().hex[:12]}.tmp"
        with open(temp, "w", encoding="utf-8") as out:
            out.write(json.dumps(entry))
        os.replace(temp, target)
    except OSError as error:
        log.debug("no local index entry for %s/%s: %s", namespace, key, error)


def _count_hit(namespace, key):
    global _flush_timer
    with _pending_lock:
        _pending.setdefault(namespace, []).append(key)
        if _flush_timer is None:
            _flush_timer = threading.Timer(_FLUSH_DELAY, flush)
            _flush_timer.daemon = True
            _flush_timer.start()


def flush(timeout=5.0):
    """Sends the hits served here to kilnd (RecordHits); lost if kilnd is unreachable."""
    global _flush_timer
    with _pending_lock:
        batches, _flush_timer = dict(_pending), None
        _pending.clear()
    if not batches:
        return
    try:
        from . import _api, _service

        stub = _service.connect(autostart=False).stub
        for namespace, keys in batches.items():
            for start in range(0, len(keys), 10000):
                stub.RecordHits(_api.RecordHitsRequest(namespace=namespace, keys=keys[start:start + 10000]),
                                timeout=timeout)
    except Exception as error:  # statistics only: never the program's problem
        log.debug("local hits not recorded in kilnd: %s", error)


@atexit.register
def _flush_at_exit():
    # A short program that only hit locally imports gRPC here, at its exit, so
    # that kilnd's stats and LRU still see every hit.
    if _pending:
        flush(timeout=1.0)
