"""The client's local index: which of its content-addressed files make up an
entry it already got from kilnd, so that the next process of this user on this
machine serves it from those files as stock Triton serves its file cache: no
round trip, no gRPC import, no hashing.

    <files dir>/index/<hh>/<38 hex>.json   {"files": {name: [path, size]}, "output": path | null}

named by the SHA-256 of (namespace, key, file name). An entry is used only if
every file is there with its recorded size; files are written once under
names derived from their SHA-256 (_files.materialize), so an index entry can
go stale (a file removed) but never point at other content of the same name.
Hits served here reach kilnd later, in batches, for its stats and LRU.
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


def _entry_path(namespace, key, name):
    digest = hashlib.sha256(f"{namespace}\0{key}\0{name}".encode()).hexdigest()
    return _paths.files_dir() / "index" / digest[:2] / f"{digest[2:40]}.json"


def lookup(namespace, key, name):
    """{file name: path} and the frontend output's path (or None), when every file is
    still there; None otherwise."""
    try:
        with open(_entry_path(namespace, key, name), encoding="utf-8") as index:
            entry = json.load(index)
        files = {}
        for file_name, (path, size) in entry["files"].items():
            if os.stat(path).st_size != size:
                return None
            files[file_name] = path
    except (OSError, ValueError, KeyError, TypeError):
        return None
    _count_hit(namespace, key)
    return files, entry.get("output")


def record(namespace, key, name, files, output=None):
    """Remembers that `files` ({file name: path}) make up the entry; best effort."""
    try:
        entry = {"files": {file_name: [path, os.stat(path).st_size] for file_name, path in files.items()},
                 "output": output}
        target = _entry_path(namespace, key, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{uuid.uuid4().hex[:12]}.tmp")
        temp.write_text(json.dumps(entry), encoding="utf-8")
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
