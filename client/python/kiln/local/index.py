"""The local indexes: which files make up an entry this user's processes can
read, so that a process serves it from those files as stock Triton serves its
file cache: no round trip, no import of kilnd's client, no hashing. Two of them, one format:

- kilnd's (served_files.h): the files kilnd itself writes for its local
  clients (after each of their compiles, and on lookups asking for files),
  found through "<endpoint>.files" beside its socket or endpoint file;
- this client's own, under <files dir>/index, for entries whose bytes kilnd
  sent (it serves files only to its own account) or that this process made.

    <root>/index/<h>/<63 hex>.json   {"files": {name: [path, size]}}

named by the SHA-256 of "<namespace>\0<key>". An entry is used only if every
file is there with its recorded size; files are written once under names
derived from their SHA-256, so an entry can go stale (a file removed) but
never point at other content of the same name. kilnd also links each entry of
one file (a launcher module) under the same digest,

    <root>/links/<h>/<63 hex><extension>  -> the file

so that Triton's get_file costs one stat, as in its own file cache; a link
whose file is gone is a miss.

Hits served here reach kilnd later, in batches, for its stats and LRU: those
from kilnd's files as a journal file kilnd collects (<root>/hits, see
cache/hit_journal.h), so a process that only hits never imports kilnd's client,
not even at exit; those from this client's own index with a RecordHits call,
made once this process has that client loaded anyway, or at exit.
"""

import atexit
import hashlib
import json
import logging
import os
import sys
import threading
import uuid

from kiln.local import compile_threads as _compile_threads
from kiln.local import files as _files
from kiln.service import paths as _paths

# Blobs Kiln stores with a Triton kernel's entry besides Triton's own files, so
# the indexes list them, never part of the group Triton gets (triton/cache_manager): what the
# kernel's frontend showed (triton/frontend), and the inputs of its key
# (kiln.v1.KeyInputs as JSON: what `kiln prewarm` needs to compile it for
# other targets). Here, not with the frontend: a hit imports only this.
OUTPUT_BLOB = "kiln.frontend-output.json"
KEY_INPUTS_BLOB = "kiln.key-inputs.json"

log = logging.getLogger("kiln")

_FLUSH_DELAY = 2.0  # seconds after the first unrecorded hit: off the program's startup
_pending = {}  # namespace -> [key]: hits from this client's own index, for RecordHits
_journal = {}  # kilnd's served files dir -> [(namespace, key)]: hits from its files
_pending_lock = threading.Lock()
_flush_timer = None


def _keyed_path(root, subdir, namespace, key, extension):
    digest = hashlib.sha256(f"{namespace}\0{key}".encode()).hexdigest()
    # Not os.path.join: this runs on every hit, and the parts need no checks.
    return f"{root}{os.sep}{subdir}{os.sep}{digest[:1]}{os.sep}{digest[1:]}{extension}"


def _entry_path(root, namespace, key):
    return _keyed_path(root, "index", namespace, key, ".json")


def _read(path, name):
    try:
        listed = json.loads(_files.read(path))["files"]
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
            _count_hit(namespace, key, root if root_of is _paths.served_files_dir else None)
            return files
    return None


def lookup_file(namespace, key, name):
    """The path of `name`, the file of a one-file entry: kilnd's link to it, else
    as lookup() finds it; None when it is not there."""
    root = _paths.served_files_dir()
    if root is not None:
        link = _keyed_path(root, "links", namespace, key, _files.extension(name))
        try:
            os.stat(link)  # follows the link: fails when its file is gone
        except OSError:
            pass
        else:
            _count_hit(namespace, key, root)
            return link
    files = lookup(namespace, key, name)
    return None if files is None else files[name]


def record(namespace, key, files):
    """Remembers in this client's index that `files` ({file name: path}) make up
    the entry; best effort."""
    try:
        entry = {"files": {file_name: [path, os.stat(path).st_size] for file_name, path in files.items()}}
        target = _entry_path(_paths.files_dir(), namespace, key)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _files.write_text(target, json.dumps(entry))
    except OSError as error:
        log.debug("no local index entry for %s/%s: %s", namespace, key, error)


def _count_hit(namespace, key, served_root):
    """Remembers a hit for kilnd: `served_root` is kilnd's served files dir when
    its files served it, None when this client's own index did."""
    global _flush_timer
    with _pending_lock:
        if served_root is not None:
            _journal.setdefault(served_root, []).append((namespace, key))
        else:
            _pending.setdefault(namespace, []).append(key)
        if _flush_timer is None:
            _flush_timer = threading.Timer(_FLUSH_DELAY, flush)
            _flush_timer.daemon = True
            _flush_timer.start()


def _write_journal(root, hits):
    """Hands `hits` to kilnd as a journal file; False when it cannot be written
    (a kilnd older than the journal, a key a line cannot hold)."""
    if any("\t" in key or "\n" in key or "\t" in namespace or "\n" in namespace for namespace, key in hits):
        return False
    directory = f"{root}{os.sep}hits"
    try:
        _files.write_text(f"{directory}{os.sep}{uuid.uuid4().hex}.hits",
                          "".join(f"{namespace}\t{key}\n" for namespace, key in hits))
    except OSError as error:
        log.debug("hits not journaled in %s: %s", directory, error)
        return False
    return True


def flush(timeout=5.0, at_exit=False):
    """Hands the hits served here to kilnd, and what _compile_threads compiled
    ahead (kilnd's stats): hits journaled where its files served
    them, else sent with RecordHits, which waits (no import of the client's
    connection mid-run) until this process has it loaded or exits. Statistics only: lost if kilnd is
    unreachable."""
    global _flush_timer
    with _pending_lock:
        journal, _flush_timer = dict(_journal), None
        _journal.clear()
    for root, hits in journal.items():
        if not _write_journal(root, hits):
            with _pending_lock:
                for namespace, key in hits:
                    _pending.setdefault(namespace, []).append(key)
    if not at_exit and "kiln.service.connection" not in sys.modules:
        return
    with _pending_lock:
        batches = dict(_pending)
        _pending.clear()
    compiled_ahead, seconds_saved = _compile_threads.take_unreported()
    if not batches and not compiled_ahead:
        return
    try:
        from kiln.service import api as _api
        from kiln.service import connection as _service

        stub = _service.connect(autostart=False).stub
        for namespace, keys in batches.items():
            for start in range(0, len(keys), 10000):
                stub.RecordHits(_api.RecordHitsRequest(namespace=namespace, keys=keys[start:start + 10000]),
                                timeout=timeout)
        if compiled_ahead:
            stub.RecordHits(_api.RecordHitsRequest(namespace="triton", compiled_ahead=compiled_ahead,
                                                   ahead_seconds_saved=seconds_saved), timeout=timeout)
    except Exception as error:  # statistics only: never the program's problem
        log.debug("local hits not recorded in kilnd: %s", error)


@atexit.register
def _flush_at_exit():
    # Only hits from this client's own index make a program that never
    # connected to kilnd connect here, at its exit.
    if _pending or _journal or _compile_threads.has_unreported():
        flush(timeout=1.0, at_exit=True)
