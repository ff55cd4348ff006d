"""Kiln's own modules, loaded from the .pyc files Python keeps for them with a
third of the file system calls of Python's path finder.

Why: a file system call under Windows is costly (under Wine, where the Windows
benchmarks run, a few hundred microseconds), and Python's path finder makes
about nine for each module it loads: the folder's stat, the source's stat
twice, the .pyc's open, fstat, reads and close. A process that compiles loads
about 35 of Kiln's modules: about 0.15 s of every such python.exe under Wine,
the first process after an install included. Here each of Kiln's package
folders, and its __pycache__, is listed once (under Windows a listing carries
each file's size and time), and a module costs its .pyc's open, read and close.

Python's own rules decide what loads, so only the count of calls differs: a
.pyc is used when it is this interpreter's (its magic number and name) and was
made from the source as it is now (the source's mtime and size in its header,
as Python checks a timestamp-based .pyc). Everything else goes to Python's
finder as before, which writes the .pyc for the next process: no .pyc yet, a
stale or hash-based one, a name that is not a plain .py module or regular
package, a reload, a pycache_prefix."""

import _imp
import marshal
import os
import sys

# importlib's machinery as the interpreter has it from its start (importlib.machinery
# and importlib.util re-export these): those modules, with importlib and
# importlib._abc, would be four more imports at every start under KILN=1.
from _frozen_importlib import ModuleSpec
from _frozen_importlib_external import MAGIC_NUMBER, SourceFileLoader

_PYC_FLAGS_TIMESTAMP = 0  # PEP 552: a .pyc checked against its source's mtime and size
_HEADER_SIZE = 16


class _Listing:
    """A folder's plain .py files, the names of its subfolders, the stems of
    its other files, and its __pycache__'s .pyc files. Files are kept as their
    DirEntry: under Windows its stat is the listing's own, no call."""

    def __init__(self, folder):
        self.sources, self.folders, self.other_stems, self.pycs = {}, set(), set(), {}
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir():
                    self.folders.add(entry.name)
                elif entry.name.endswith(".py") and entry.name.count(".") == 1:
                    self.sources[entry.name[:-3]] = entry
                else:  # an extension module, a .pyc beside its source...: Python's finder decides
                    self.other_stems.add(entry.name.partition(".")[0])
        try:
            with os.scandir(os.path.join(folder, "__pycache__")) as entries:
                for entry in entries:
                    if entry.name.endswith(".pyc") and entry.is_file():
                        self.pycs[entry.name] = entry
        except OSError:  # none yet
            pass


class _PycLoader(SourceFileLoader):
    """Python's loader of a source module, given the .pyc it would read."""

    def __init__(self, fullname, path, pyc):
        super().__init__(fullname, path)
        self._pyc = pyc

    def get_code(self, fullname):
        pyc, self._pyc = self._pyc, None
        if pyc is not None and fullname == self.name:
            try:
                code = marshal.loads(memoryview(pyc)[_HEADER_SIZE:])
            except (EOFError, ValueError, TypeError):
                # A damaged .pyc with a sound header, on which Python's loader
                # fails (marshal's error): the source compiled instead.
                return self.source_to_code(self.get_data(self.path), self.path)
            _imp._fix_co_filename(code, self.path)  # as Python's loader: the folder may have moved
            return code
        return super().get_code(fullname)


class _OwnModulesFinder:
    """On sys.meta_path, ahead of Python's path finder, for kiln.* only."""

    def __init__(self):
        self._listings = {}  # folder -> _Listing, or None where it cannot be listed
        optimization = sys.flags.optimize
        self._pyc_suffix = f".{sys.implementation.cache_tag}{f'.opt-{optimization}' if optimization else ''}.pyc"

    def invalidate_caches(self):
        self._listings.clear()

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("kiln.") or not path or len(path) != 1 or target is not None:
            return None  # not Kiln's, a namespace package's, or a reload: Python's finder
        try:
            return self._spec(fullname, path[0])
        except Exception:  # never worse than Python's finder
            return None

    def _listing(self, folder):
        if folder not in self._listings:
            try:
                self._listings[folder] = _Listing(folder)
            except OSError:
                self._listings[folder] = None
        return self._listings[folder]

    def _spec(self, fullname, folder):
        stem = fullname.rpartition(".")[2]
        listing = self._listing(folder)
        if listing is None:
            return None
        if stem in listing.folders:  # a package first, as Python's finder has it
            package_folder = os.path.join(folder, stem)
            package_listing = self._listing(package_folder)
            if package_listing is None:
                return None
            return self._spec_of(fullname, package_folder, package_listing, "__init__", package=True)
        return self._spec_of(fullname, folder, listing, stem, package=False)

    def _spec_of(self, fullname, folder, listing, stem, package):
        source = listing.sources.get(stem)
        pyc_entry = listing.pycs.get(stem + self._pyc_suffix)
        if source is None or stem in listing.other_stems or pyc_entry is None:
            return None
        pyc = _read(pyc_entry.path, pyc_entry.stat().st_size)
        if pyc is None or not _made_from(pyc, source.stat()):
            return None
        spec = ModuleSpec(fullname, _PycLoader(fullname, source.path, pyc), origin=source.path,
                          is_package=package)
        spec.has_location = True
        spec.cached = pyc_entry.path
        if package:
            spec.submodule_search_locations = [folder]
        return spec


def _read(path, size):
    """The file's bytes when it still has `size` of them; None otherwise."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except OSError:
        return None
    try:
        data = os.read(descriptor, size + 1)
    finally:
        os.close(descriptor)
    return data if len(data) == size else None


def _made_from(pyc, source_stat):
    """Python's check of a timestamp-based .pyc (importlib's _validate_timestamp_pyc)."""
    return (len(pyc) > _HEADER_SIZE and pyc[:4] == MAGIC_NUMBER
            and int.from_bytes(pyc[4:8], "little") == _PYC_FLAGS_TIMESTAMP
            and int.from_bytes(pyc[8:12], "little") == int(source_stat.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(pyc[12:16], "little") == source_stat.st_size & 0xFFFFFFFF)


def install():
    """Puts the finder on sys.meta_path, once; not where .pyc files live
    elsewhere than beside their sources (PYTHONPYCACHEPREFIX) or are not kept."""
    if sys.implementation.cache_tag is None or getattr(sys, "pycache_prefix", None):
        return
    if not any(isinstance(finder, _OwnModulesFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OwnModulesFinder())
