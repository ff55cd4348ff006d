"""One triton.compile() call as Kiln follows it, and Triton's frontend inside it.

A compile runs on one thread from its cache lookup (get_group) to put_group;
`CompileGroup` is what the cache manager, the frontend guard and the stages
hook share about it: the claim kilnd gave this process on the miss, the files
Triton made, the frontend's warnings.

The frontend (`make_ir` of Triton's sources) is guarded so that:
- a frontend that fails (a CompilationError) ends this thread's claim at once,
  so no other process waits on a compile that will never come;
- it notes whether it asked for this machine's GPU (the constexpr functions of
  triton.language.target_info, native TMA): Triton's frontend reads the GPU
  it runs on, not the compile's target, so such TTIR is good only for that
  GPU, and `kiln prewarm` must not compile it for another;
- what it shows the user (warnings: deprecations, `tl.where` on a
  non-boolean; `tl.static_print` output) is kept with the kernel and shown
  again when kilnd serves the kernel to a Triton cache directory that has not
  seen it: there stock Triton would have compiled, and shown it. A cache
  directory that has the kernel already stays silent, as stock's does.
  Recording swaps process-wide state (warnings' hooks, sys.stdout) for the
  frontend's duration, under one lock: another thread's output in that window
  is shown when the frontend ends, not lost.
"""

import contextlib
import functools
import importlib
import io
import json
import sys
import threading
import uuid
import warnings

from kiln.local import index as _index
from kiln.triton import versions as _triton_versions

# This process, for kilnd's claims: asking again for a key it holds takes the
# claim over instead of waiting on itself.
CLAIMANT = uuid.uuid4().hex

_current = threading.local()
# catch_warnings swaps process-wide state: frontends that record run one at a
# time (re-entrant, as a frontend may compile nothing but could recurse).
_recording = threading.RLock()


class CompileGroup:
    def __init__(self, hex_key):
        self.hex = hex_key
        self.claim = None  # the open LookupOrClaim call while this process holds the key
        self.made = {}  # file name -> bytes, as Triton put them during the compile
        self.output = None  # what the frontend showed: {"stdout": str, "warnings": [dict]}
        self.recorded_by_kilnd = False  # kilnd stored the result: put_group sends nothing
        self.frontend_read_device = ""  # "cuda:90" (or "none") if the frontend asked for this machine's GPU
        self.compiled_here = False  # by this process's Triton, every stage stock's (compiled_here)
        self.key_inputs = None  # kiln.v1.KeyInputs (JSON bytes) of a compile here, stored with it

    def end_claim(self):
        """Ends the claim (if held): waiters in other processes stop waiting now."""
        claim, self.claim = self.claim, None
        if claim is not None:
            claim.cancel()


def begin(hex_key):
    group = CompileGroup(hex_key)
    _current.group = group
    return group


def current(hex_key=None):
    """This thread's compile, if it is the one for `hex_key` (when given)."""
    group = getattr(_current, "group", None)
    if group is None or (hex_key is not None and group.hex != hex_key):
        return None
    return group


def finish(group):
    group.end_claim()
    if getattr(_current, "group", None) is group:
        _current.group = None


# --- the guard around make_ir ------------------------------------------------

def _guarded(make_ir):
    @functools.wraps(make_ir)
    def guarded_make_ir(self, *args, **kwargs):
        group = current()
        if group is None:
            return make_ir(self, *args, **kwargs)
        caught, printed = [], io.StringIO()
        try:
            with _recording, warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(printed):
                return make_ir(self, *args, **kwargs)
        except BaseException:
            group.end_claim()
            raise
        finally:
            group.output = {"stdout": printed.getvalue(), "warnings": [_describe(warning) for warning in caught]}
            show(group.output)

    guarded_make_ir.kiln_guarded = True
    return guarded_make_ir


def _noting_device_reads(function, device_of):
    @functools.wraps(function)  # keeps __triton_builtin__, which kernels calling it need
    def noted(*args, **kwargs):
        result = function(*args, **kwargs)
        group = current()
        if group is not None and not group.frontend_read_device:
            group.frontend_read_device = device_of(result)
        return result

    noted.kiln_noting = True
    return noted


def _device_name(target):
    return f"{target.backend}:{target.arch}" if target is not None else "none"


def _device_readers():
    """(owner, attribute, how its result names the device) of what the frontend
    calls to ask for this machine's GPU."""
    found = _triton_versions.frontend_device_readers()
    # The unwatched current_target, to name the device a yes/no answer was about.
    current_target = next((getattr(owner.current_target, "__wrapped__", owner.current_target)
                           for owner, attribute in found if attribute == "current_target"), None)
    readers = []
    for owner, attribute in found:
        if attribute == "current_target":
            readers.append((owner, attribute, _device_name))
        else:  # a yes/no about the device: named by the target it asked for
            readers.append((owner, attribute, lambda _, read=current_target: _device_name(read())))
    return readers


def guard_frontends():
    """Guards make_ir of Triton's sources and of every subclass defined so far
    (Gluon's); called again before each compile, so later subclasses are too."""
    from triton.compiler.compiler import ASTSource, IRSource

    for owner, name, device_of in _device_readers():
        function = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        if not getattr(function, "kiln_noting", False):
            setattr(owner, name, _noting_device_reads(function, device_of))

    pending = [ASTSource, IRSource]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        make_ir = cls.__dict__.get("make_ir")
        if make_ir is not None and not getattr(make_ir, "kiln_guarded", False):
            cls.make_ir = _guarded(make_ir)


def unguard_frontends():
    from triton.compiler.compiler import ASTSource, IRSource

    for owner, name, _ in _device_readers():
        function = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        if getattr(function, "kiln_noting", False):
            setattr(owner, name, function.__wrapped__)

    pending = [ASTSource, IRSource]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        make_ir = cls.__dict__.get("make_ir")
        if getattr(make_ir, "kiln_guarded", False):
            cls.make_ir = make_ir.__wrapped__


# --- what the frontend showed ------------------------------------------------

def _describe(warning):
    category = warning.category
    return {"message": str(warning.message), "category": f"{category.__module__}:{category.__qualname__}",
            "filename": warning.filename, "lineno": warning.lineno}


def _category(name):
    module, _, qualname = name.partition(":")
    try:
        value = importlib.import_module(module)
        for part in qualname.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError):
        return UserWarning
    return value if isinstance(value, type) and issubclass(value, Warning) else UserWarning


def show(output):
    """Prints and warns again; the process's warning filters decide as they
    did for the original warnings."""
    if output["stdout"]:
        sys.stdout.write(output["stdout"])
    for warning in output["warnings"]:
        warnings.warn_explicit(warning["message"], _category(warning["category"]), warning["filename"],
                               warning["lineno"])


def worth_keeping(output):
    return output is not None and (output["stdout"] or output["warnings"])


def encode(output):
    return json.dumps(output).encode()


def kept_beside(group, key_inputs):
    """What kilnd keeps of a kernel beside Triton's files, as {blob name:
    bytes}: what its frontend showed (where worth keeping: a hit shows it
    again), and what its key came from (`key_inputs`, for `kiln prewarm` and
    a bundle's untrusted import, which compile it again from its TTIR)."""
    kept = {}
    if group is not None and worth_keeping(group.output):
        kept[_index.OUTPUT_BLOB] = encode(group.output)
    if key_inputs is not None:
        kept[_index.KEY_INPUTS_BLOB] = key_inputs
    return kept


def replay(data):
    try:
        output = json.loads(data)
        output["stdout"], output["warnings"]  # noqa: B018  (both must be there)
    except (ValueError, KeyError, TypeError):
        return
    show(output)
