"""A torch.compile kernel compiled whole in kilnd's workers.

In Kiln's compile threads (threads.py) the frontend and Triton's stages up to
LLIR run in this process, and only LLIR to cubin in kilnd's workers. The
frontend holds this process's GIL, so a graph of a hundred kernels compiles no
faster than its frontends run one after another. Inductor's own pool gets
round that with a process per CPU, each importing torch again.

Where kilnd is this user's own, it can do what a worker of that pool does,
in its long-lived workers of this Python (which import torch once, not once
per process): load the kernel's generated module and compile every config of
it with stock Triton. It stores each config's kernel under the Triton key this
process then looks up, so the compile thread's own precompile finds them all
and runs no frontend. Anything else (an old kilnd, another user's kilnd, a
module that fails there) and the thread compiles as before, meeting any error
of the kernel's as stock does.

Off unless KILN_INDUCTOR_IN_KILND=1: measured on the H100 machine it is not
yet faster than the frontends here. Each of kilnd's workers imports torch and
inductor's runtime for its first kernel (seconds of CPU each, 16 of them),
where inductor's pool imports torch once and forks its workers.
"""

import logging
import os
import re
import sys

from kiln.service.errors import RpcError, StatusCode

log = logging.getLogger("kiln")

# Why kilnd compiles no kernel module for this process, once it said so.
_refused = None
_REFUSALS = (StatusCode.PERMISSION_DENIED, StatusCode.UNIMPLEMENTED)
# The device inductor generated the kernel for, in its triton_meta: DeviceProperties(..., cc=90, ...).
_DEVICE_ARCH = re.compile(r"\bcc=(\d+)\b")


def start(kernel_name, source_code):
    """Sends the kernel's module to kilnd; returns the call's future, or None
    where kilnd does not take it."""
    if _refused is not None or os.environ.get("KILN_INDUCTOR_IN_KILND", "0") != "1":
        return None
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        from triton._C.libtriton import get_cache_invalidating_env_vars

        from kiln.service import api as _api
        from kiln.service import connection as _service
        from kiln.triton import remote as _remote
        from kiln.triton.versions import triton_key

        request = _api.CompileInductorKernelRequest(
            triton_key=triton_key(), local_python_executable=sys.executable, kernel_name=kernel_name,
            source=source_code, inductor_cache_dir=cache_dir(), env=get_cache_invalidating_env_vars(),
            tool_paths=_remote.tool_paths(), requester=_remote.requester(),
            ptxas_versions=_ptxas_versions(source_code))
        return _service.connect().stub.CompileInductorKernel.future(request)
    except Exception as error:  # the compile thread compiles it itself
        log.debug("%s not sent to kilnd's workers: %s: %s", kernel_name, type(error).__name__, error)
        return None


def _ptxas_versions(source_code):
    """`ptxas --version` as this process's Triton has it for each arch the
    kernel names (inductor writes its device's `cc=` into the module), which
    its keys hold: Triton remembers the first answer per arch, and inductor
    asks before it points TRITON_PTXAS_PATH at torch's ptxas, so the answer
    may be another ptxas's than the one that compiles. Asking now gives what
    the compile here would get."""
    from triton.backends.nvidia import compiler as nvidia

    from kiln.triton.versions import ptxas_is_per_arch

    if not ptxas_is_per_arch(nvidia):
        return {0: nvidia.get_ptxas_version()}
    return {arch: nvidia.get_ptxas_version(arch) for arch in {int(cc) for cc in _DEVICE_ARCH.findall(source_code)}}


def finish(call, kernel_name):
    """Waits for kilnd to compile the kernel; whatever it did not store, the
    thread that loads the kernel next compiles itself."""
    global _refused
    try:
        response = call.result()
    except RpcError as error:
        if error.code() in _REFUSALS:
            _refused = error.details()
            log.debug("kilnd compiles no kernel modules for this process: %s", _refused)
        else:
            log.debug("%s not compiled in kilnd's workers: %s", kernel_name, error.details())
        return
    if response.WhichOneof("result") != "compiled":
        log.debug("%s did not compile in kilnd's workers: %s\n%s", kernel_name, response.error.message,
                  response.error.log)
        return
    from kiln.local import compile_threads as _compile_threads

    _compile_threads.note_remote_seconds(response.worker_seconds)
