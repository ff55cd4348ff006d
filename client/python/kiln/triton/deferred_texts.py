"""Kernels served from Kiln's cache load without reading their IR texts.

Stock Triton's CompiledKernel reads every file of a kernel's group when it
loads the kernel: the metadata and cubin it launches from, and the source,
TTIR, TTGIR, LLVM IR and PTX texts that only `kernel.asm[...]` shows. Those
texts are most of the bytes (a matmul's LLVM IR alone is 200 KB) and about a
fifth of what loading a cached kernel costs, for text that a program running
its kernels never looks at.

For a group Kiln hands over (HitGroup), CompiledKernel reads the metadata and
the binary as stock does; each text is read from its file the first time
something asks for it. `kernel.asm` keeps every key from the start, so
membership, keys and length are stock's; every way to a value (indexing, get,
items, values, copies, comparison, pickling) reads it first, so no caller
ever sees a text unread. A file gone by then (a served file kilnd rewrote or
removed) is asked of kilnd again. A metadata or binary file gone between the
lookup and the load (kilnd evicted the entry) is a lookup again, a miss if
kilnd no longer has the kernel: never the program's error.

A kernel compiled in this process whose files Kiln wrote (known_texts) loads
with its texts as Kiln handed them to Triton, not read back from the files
just written: five reads a kernel, a millisecond each under Windows. Groups
Triton makes itself otherwise (its own cache) are left to stock."""

import logging
import os
import threading
from pathlib import Path

from triton.compiler.compiler import AsmDict

# The texts read on first use, in the order of the stages that make them (the
# order a stock kernel's asm has them in, the binary last). Never the binary a
# kernel launches from (cubin), nor the metadata (json) every load needs.
_DEFERRED_ORDER = {"source": 0, "ttir": 1, "ttgir": 2, "llir": 3, "ptx": 4}

log = logging.getLogger("kiln")
_loading_again = threading.local()
_this_thread = threading.local()  # .known_texts: {path: text} of the group this thread's compile just made


class HitGroup(dict):
    """{file name: path} of a kernel Kiln's cache served. Pickles as a plain
    dict: inductor sends kernels between processes, and one without Kiln must
    read them."""

    def __reduce_ex__(self, protocol):
        return dict, (dict(self),)


class _Unread:
    """A text in LazyAsm not read yet: where it is."""

    __slots__ = ("file_name", "path")

    def __init__(self, file_name, path):
        self.file_name, self.path = file_name, path


class LazyAsm(AsmDict):
    """Triton's AsmDict whose texts are read on first use (see the module's
    docstring). Values not read yet are _Unread, and never leave the dict."""

    def __init__(self, values, kernel_hash):
        super().__init__(values)
        self._kernel_hash = kernel_hash

    def _value(self, key, value):
        if type(value) is not _Unread:
            return value
        text = _read_text(self._kernel_hash, value)
        dict.__setitem__(self, key, text)
        return text

    def _read_all(self):
        for key, value in list(dict.items(self)):
            self._value(key, value)
        return self

    def __getitem__(self, key):
        return self._value(key, dict.__getitem__(self, key))  # __missing__ (sass) as AsmDict's

    def get(self, key, default=None):
        return self[key] if key in self else default

    def __iter__(self):
        # Overridden only so that dict(asm) and **asm take the values through
        # __getitem__ (CPython copies a dict subclass's storage directly unless
        # it overrides __iter__).
        return dict.__iter__(self)

    def items(self):
        return dict.items(self._read_all())

    def values(self):
        return dict.values(self._read_all())

    def copy(self):
        return dict.copy(self._read_all())

    def pop(self, *args):
        return dict.pop(self._read_all(), *args)

    def popitem(self):
        return dict.popitem(self._read_all())

    def setdefault(self, key, default=None):
        return self[key] if key in self else dict.setdefault(self, key, default)

    def __eq__(self, other):
        if isinstance(other, LazyAsm):
            other._read_all()
        return dict.__eq__(self._read_all(), other)

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None

    def __or__(self, other):
        return dict.__or__(self._read_all(), other)

    def __ror__(self, other):
        return dict.__ror__(self._read_all(), other)

    def __repr__(self):
        return dict.__repr__(self._read_all())

    def __reduce_ex__(self, protocol):
        # As Triton's own AsmDict, every text read: a process without Kiln
        # unpickles it.
        return AsmDict, (dict(dict.items(self._read_all())),)


def _suffix(path):
    """What CompiledKernel keys a file's content by in asm: its extension, without the dot."""
    return os.path.splitext(path)[1][1:]


def known_texts(group, made):
    """The texts of `group` ({file name: path}), which this thread's compile
    just wrote from `made` ({file name: bytes}), for the CompiledKernel that
    Triton makes of it next in this thread (triton.compile does, right after
    put_group)."""
    texts = {}
    for name, path in group.items():
        data = made.get(name)
        if data is None or _suffix(path) not in _DEFERRED_ORDER:
            continue
        texts[path] = data.decode() if isinstance(data, bytes) else data
    _this_thread.known_texts = texts


def _read_text(kernel_hash, unread):
    try:
        return Path(unread.path).read_text()  # as CompiledKernel reads it
    except OSError as error:
        from kiln.triton import lookups  # only now: a served file that went away

        path = lookups.path_in_kilnd(kernel_hash, unread.file_name)
        if path is None:
            raise FileNotFoundError(
                f"kiln: the {unread.file_name} of kernel {kernel_hash} is no longer in Kiln's cache "
                f"({error}); the kernel still runs, only this text is gone. Compile the kernel again "
                f"(triton.knobs.compilation.always_compile, or clear kilnd's cache of it) to see it."
            ) from error
        return Path(path).read_text()


def _load_again(kernel_hash, error):
    """The kernel whose hit lost a file between its lookup and its load: kilnd
    evicted the entry (its served files stay a grace for such readers, and an
    operator's gc waits that out), or someone removed the file. The lookup
    again finds kilnd's files as they are now, or misses and compiles, as
    triton.compile's caller asked."""
    from kiln.triton import key_inputs  # only now: a hit lost under its reader is rare

    frame = key_inputs.compile_frame()
    inputs = frame.f_locals if frame is not None else {}
    if not all(name in inputs for name in ("src", "target", "options")):
        raise error  # a Triton whose compile() keeps its inputs under other names
    log.info("kiln: a file of kernel %s went as it loaded (%s); looked up again", kernel_hash, error)
    _loading_again.active = True
    try:
        return frame.f_globals["compile"](inputs["src"], target=inputs["target"],
                                          options=dict(vars(inputs["options"])), _env_vars=inputs.get("env_vars"))
    finally:
        _loading_again.active = False


def install(compiler):
    """Wraps CompiledKernel.__init__ so that a HitGroup's texts are read on first use."""
    kernel_class = compiler.CompiledKernel
    stock_init = kernel_class.__init__
    if getattr(stock_init, "_kiln_defers_texts", False):
        return

    def init_with_texts(self, src, metadata_group, hash, texts):
        """Stock's load of the metadata and binary; each text from `texts`
        ({path: text}), or read on first use."""
        # CompiledKernel keys asm by each path's suffix, and leaves out the metadata (.json).
        suffixes = {name: _suffix(path) for name, path in metadata_group.items()
                    if not name.endswith(".json")}
        stock_init(self, src, {name: path for name, path in metadata_group.items()
                               if suffixes.get(name) not in _DEFERRED_ORDER}, hash)
        read = self.asm
        values = {}
        for name, suffix in sorted(suffixes.items(), key=lambda item: _DEFERRED_ORDER.get(item[1], 5)):
            path = metadata_group[name]
            if suffix not in _DEFERRED_ORDER:
                values[suffix] = read[suffix]
            else:
                values[suffix] = texts[path] if path in texts else _Unread(name, path)
        self.asm = LazyAsm(values, hash)

    def __init__(self, src, metadata_group, hash):
        texts, _this_thread.known_texts = getattr(_this_thread, "known_texts", None), None
        if type(metadata_group) is not HitGroup:
            if texts and all(path in texts for path in metadata_group.values()
                             if _suffix(path) in _DEFERRED_ORDER):
                init_with_texts(self, src, metadata_group, hash, texts)
                self.metadata_group = metadata_group  # stock's own dict, as stock keeps it
                return None
            return stock_init(self, src, metadata_group, hash)
        try:
            init_with_texts(self, src, metadata_group, hash, {})
            self.metadata_group = dict(metadata_group)
        except OSError as error:
            if getattr(_loading_again, "active", False):
                raise
            self.__dict__.update(_load_again(hash, error).__dict__)

    __init__._kiln_defers_texts = True
    __init__.__wrapped__ = stock_init
    __init__.__doc__ = stock_init.__doc__
    kernel_class.__init__ = __init__
