"""torch_key(), remembered across this user's processes as _triton_memos
remembers triton_key().

Inductor keys every cache entry with torch_key(): the SHA-256 of every Python
module of the torch package, which it computes again in every process that
compiles (0.2-0.3 s, before the first graph is served from any cache). The
memo's fingerprint is the stat of what that hash reads: every entry of every
package directory (those pkgutil walks, with an __init__), plus the two
non-module files it adds. Taking it costs about a tenth of the hash (14,000
files in torch, a third of them in packages), so a process that finds no memo
computes the value as stock does and fingerprints at exit
(_triton_memos.remembered_fingerprinting_at_exit); one that finds a memo
fingerprints first and uses the value only while nothing changed.

Installed as torch._inductor.codecache is imported (_after_import), before any
other module binds the name. Compile workers get the value from their parent
(torch_key.set), which the replacement passes on.
"""

import os
import sysconfig
import threading

from kiln.triton import memos as _triton_memos

# What torch_key() hashes besides the modules, relative to torch/_inductor.
_EXTRA_FILES = (os.path.join("codegen", "aoti_runtime", "interface.cpp"), "script.ld")


def package_fingerprint(root, extra_files=()):
    """(digest, newest change in ns) of the stat of every entry of each package
    directory under `root` (a directory with an __init__ module, as pkgutil
    walks them; bytecode caches aside) and of `extra_files`, present or not;
    None when a directory cannot be read."""
    lines, newest, pending, seen = [], 0, [root], set()

    def add(path, stat):
        nonlocal newest
        lines.append(_triton_memos._stat_line(path, stat))
        newest = max(newest, stat.st_mtime_ns, stat.st_ctime_ns)

    try:
        while pending:
            directory = pending.pop()
            with os.scandir(directory) as scanned:
                entries = [entry for entry in scanned if entry.name != "__pycache__"]
            if directory != root and not any(entry.name.startswith("__init__.") for entry in entries):
                continue  # not a package: its own stat is in its parent's lines
            for entry in entries:
                stat = entry.stat()
                add(entry.path, stat)
                if entry.is_dir() and (stat.st_dev, stat.st_ino) not in seen:  # links followed, each directory once
                    seen.add((stat.st_dev, stat.st_ino))
                    pending.append(entry.path)
        add(root, os.stat(root))
    except OSError:
        return None
    for path in extra_files:
        try:
            add(path, os.stat(path))
        except OSError:
            lines.append(f"{path}\0absent")
    return _triton_memos.digest_of(lines), newest


def install_torch_key(codecache):
    """torch._inductor.codecache.torch_key, remembered for this torch install."""
    original = codecache.torch_key
    if getattr(original, "_kiln_memo", False) or not (callable(getattr(original, "set", None))
                                                       and callable(getattr(original, "clear", None))):
        return  # a torch whose torch_key is not the settable cache this is written for
    inductor_dir = os.path.dirname(os.path.abspath(codecache.__file__))
    torch_dir = os.path.dirname(inductor_dir)
    extra_files = [os.path.join(inductor_dir, name) for name in _EXTRA_FILES]
    # Which extension modules it finds depends on the interpreter.
    name = f"torch_key\0{torch_dir}\0{sysconfig.get_config_var('EXT_SUFFIX')}"
    lock = threading.Lock()
    known = False  # whether the original holds the value

    def computed():
        nonlocal known
        value = original()
        known = True
        return value.hex()

    def torch_key():
        nonlocal known
        with lock:
            if not known:
                value = _triton_memos.remembered_fingerprinting_at_exit(
                    name, lambda: package_fingerprint(torch_dir, extra_files), computed)
                if not known:  # remembered: hand it to the original, as a compile worker's parent does
                    original.set(bytes.fromhex(value))
                    known = True
        return original()

    def set_value(value):
        nonlocal known
        with lock:
            original.set(value)
            known = True

    def clear():
        nonlocal known
        with lock:
            original.clear()
            known = False

    torch_key.set, torch_key.clear, torch_key._kiln_memo = set_value, clear, True
    codecache.torch_key = torch_key
