"""Launchers that kilnd builds while their kernels compile.

Stock Triton builds a kernel's launcher, a C module that a C compiler takes a
fraction of a second to build, when the kernel is first loaded. That is after
its compile, on the way to the first launch. The launcher's source follows from
the kernel's signature and constants alone, and triton.compile has both before
it looks the kernel up. The exception is tensor descriptors, whose layout only
the compile decides.

So on a miss for this machine's own GPU, which means a kernel this process
compiles in order to run it, the client asks kilnd for the launcher at once
and does not wait, and kilnd builds it while the kernel compiles. The build
Triton asks for later takes that answer (take()). Inductor's kernels are left
out where inductor launches them through a launcher of its own.

The launcher asked for is made the way Triton's nvidia driver makes it
(CudaLauncher). Where Triton makes a different one, the answer goes unused,
and kilnd has built one launcher (cached for later) for nothing.
"""

import collections
import os
import sys
import sysconfig
import threading

from kiln.service import api as _api
from kiln.service.errors import RpcError
from kiln.triton import key_inputs as _key_inputs
from kiln.triton import launcher_origin as _launcher_origin
from kiln.triton import loaded_launchers as _loaded_launchers

# Started builds that no launcher took are dropped beyond this many: kernels
# compiled but never loaded here, or whose launcher Triton found in a cache.
_KEPT = 16
_lock = threading.Lock()
_started = collections.OrderedDict()  # C source -> (request, future)


def _forget_started():
    # A child of fork() has none of its parent's calls in flight, and the lock
    # may have been held by a thread that is not there.
    global _lock, _started
    _lock, _started = threading.Lock(), collections.OrderedDict()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_started)


def request(name, source, library_dirs, include_dirs, libraries, origin):
    """The kiln.v1.BuildLauncherRequest for a module Triton builds from `source`."""
    from kiln.triton.versions import triton_key

    return _api.BuildLauncherRequest(
        module_name=name, c_source=source,
        python_abi=_api.PythonAbi(version="%d.%d" % sys.version_info[:2], abiflags=getattr(sys, "abiflags", ""),
                                  ext_suffix=sysconfig.get_config_var("EXT_SUFFIX"),
                                  platform=sysconfig.get_platform(), include_dir=sysconfig.get_paths()["include"]),
        include_dirs=[d for d in include_dirs if d], library_dirs=list(library_dirs), libraries=list(libraries),
        triton_key=triton_key(), origin=origin)


def _launcher_arguments(src, target):
    """make_launcher's arguments for the kernel of `src`, as Triton's CudaLauncher
    will pass them, where this process runs the kernel on its GPU; else None."""
    from triton.runtime.driver import driver

    nvidia = sys.modules.get("triton.backends.nvidia.driver")
    # The driver exists by now wherever this process launches kernels (compile()
    # asked it for the target); it is never created here.
    active = getattr(driver, "_active", None)
    if nvidia is None or not isinstance(active, getattr(nvidia, "CudaDriver", ())):
        return None
    signature, fn = getattr(src, "signature", None), getattr(src, "fn", None)
    if not isinstance(signature, dict) or fn is None:
        return None
    if any(isinstance(kind, str) and kind.startswith("tensordesc") for kind in signature.values()):
        return None
    if active.get_current_target() != target or _inductor_launches_statically():
        return None
    constants = {(fn.arg_names.index(index),) if isinstance(index, str) else index: value
                 for index, value in getattr(src, "constants", {}).items()}
    return constants, dict(signature), None


def _inductor_launches_statically():
    """Inductor launches the kernels it compiles through a launcher of its own,
    which needs no C module (its config's use_static_cuda_launcher)."""
    config = sys.modules.get("torch._inductor.config")
    return bool(config is not None and getattr(config, "use_static_cuda_launcher", False))


def start(stub):
    """Starts kilnd building the launcher of the kernel that triton.compile has
    just missed, if this process will run it here. It never fails the compile."""
    try:
        frame = _key_inputs.compile_frame()
        if frame is None:
            return
        arguments = _launcher_arguments(frame.f_locals.get("src"), frame.f_locals.get("target"))
        if arguments is None:
            return
        nvidia = sys.modules["triton.backends.nvidia.driver"]
        source = nvidia.make_launcher(*arguments)
        if _loaded_launchers.has_loaded(source):
            return  # an earlier kernel's launcher serves this one too
        with _lock:
            if source in _started:
                return
        literal = _launcher_origin.literal_of(arguments)
        origin = _api.LauncherOrigin(make_launcher_args=literal) if literal is not None else None
        build = request("__triton_launcher", source, nvidia.library_dirs(), nvidia.include_dirs, nvidia.libraries,
                        origin)
        future = stub.start_call("BuildLauncher", build)
    except Exception:  # noqa: BLE001  (a Triton of other shapes: Triton asks for its launcher later, as ever)
        return
    with _lock:
        _started[source] = (build, future)
        while len(_started) > _KEPT:
            _started.popitem(last=False)[1][1].cancel()


def _same_module(started, build):
    """Whether two requests build the same module. Their origins may differ
    where they give the same source: CudaLauncher passes the compile's empty
    list of tensor descriptors where start() passes None."""
    return _without_origin(started) == _without_origin(build)


def _without_origin(request):
    copy = type(request)()
    copy.CopyFrom(request)
    copy.ClearField("origin")
    return copy


def take(build):
    """kilnd's answer to `build` if it was started early (waiting for it if
    needed), or None: not started, or the early call failed."""
    with _lock:
        started = _started.pop(build.c_source, None)
    if started is None or not _same_module(started[0], build):
        return None
    try:
        return started[1].result()
    except RpcError:
        return None  # the caller asks again, and reports what that call says
