"""One process of test_inductor_threads.py: hands inductor's AsyncCompile the
Triton kernels of a graph's module (pointwise kernels written as inductor
writes them, for an sm90), waits for them as the module does, and prints one
JSON line. No GPU is here: Triton's driver is autotuned_kernels'
CompileOnlyDriver, and inductor's two steps that need a device (choosing the
GPU driver, loading each cubin into a launcher) are left out; what is tested
is the compile.

usage: inductor_kernels_program.py KERNELS SALT [--failing] [--hanging-in-kilnd] [--compile-threads N]
                                   [--torch-ptxas]

KERNELS: how many kernels; SALT: a number in their source, so that a run can
have kernels no cache has seen. --failing: the last kernel does not compile.
--hanging-in-kilnd: the last kernel's module, loaded in a kilnd worker's job
(KILN_INDUCTOR_IN_KILND=1), sleeps for an hour; anywhere else it loads.
--compile-threads: inductor's config.compile_threads (1 unless given).
--torch-ptxas: Triton runs torch's ptxas from the start, as in inductor's
compile processes, so that its version is in every kernel's key.

Prints: how many configs of each kernel inductor holds compiled, each
kernel's cubins (sha256 per config compiled, twice if compiled twice), the names of the threads
triton.compile ran in, what async_compile.triton returned, whether inductor's
pool of compile processes started, and the error, if any, as stock's type
and first line."""

import hashlib
import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402,F401
import triton  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

from autotuned_kernels import CompileOnlyDriver  # noqa: E402

TEMPLATE = '''
import triton
import triton.language as tl
from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties

@triton_heuristics.pointwise(
    size_hints={'x': 1048576},
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*fp32', 'out_ptr0': '*fp32', 'xnumel': 'i32', 'XBLOCK': 'constexpr'},
                 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9,
                                            regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                                            warp_size=32),
                 'constants': {},
                 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]],
                              (2,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'NAME', 'mutated_arg_names': [],
                   'optimize_mem': True, 'no_x_dim': False, 'num_load': 1, 'num_reduction': 0,
                   'backend_hash': 'B' * 64, 'are_deterministic_algorithms_enabled': False,
                   'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True,
                   'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True,
                   'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256,
                   'spill_threshold': 16, 'store_cubin': False},
    min_elem_per_thread=0
)
@triton.jit
def NAME(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + (xindex), xmask)
    tmp1 = libdevice.tanh(tmp0 * SCALE)
    tl.store(out_ptr0 + (xindex), BODY, xmask)
'''

# A kilnd worker's job compiles into a Triton cache directory named so (kiln_worker.py).
HANG_IN_KILND = """
import os, time
if "kiln-inductor-" in os.environ.get("TRITON_CACHE_DIR", ""):
    time.sleep(3600)
"""

compile_threads = set()
cubins = {}  # kernel name -> sha256 of the cubin of each config compiled


def _recording(compile):
    def recorded(source, *args, **kwargs):
        compile_threads.add(threading.current_thread().name.rsplit("_", 1)[0])
        compiled = compile(source, *args, **kwargs)
        cubins.setdefault(source.fn.__name__, []).append(hashlib.sha256(compiled.asm["cubin"]).hexdigest())
        return compiled
    return recorded


def main():
    count, salt = int(sys.argv[1]), sys.argv[2]
    driver.set_active(CompileOnlyDriver())
    from torch._inductor import async_compile, config
    from torch._inductor.runtime import triton_heuristics, triton_helpers

    config.compile_threads = (int(sys.argv[sys.argv.index("--compile-threads") + 1])
                              if "--compile-threads" in sys.argv else 1)
    triton_helpers.set_driver_to_gpu = lambda: None  # the stand-in driver stays
    triton_heuristics.CachingAutotuner._make_launchers = lambda self: None  # loads cubins: needs a GPU
    triton.compile = _recording(triton.compile)
    # Inductor keys its caches by Triton's backend hash as it generates a
    # graph, before it points TRITON_PTXAS_PATH at torch's ptxas: Triton then
    # remembers the ptxas it found first (its own, where torch's differs) in
    # every kernel's key, whichever ptxas compiles.
    if "--torch-ptxas" in sys.argv:
        from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path

        _set_triton_ptxas_path()
    from torch.utils._triton import triton_hash_with_backend

    triton_hash_with_backend()

    compiler = async_compile.AsyncCompile()
    scope, result = {}, {}
    try:
        for index in range(count):
            name = f"triton_poi_fused_mul_tanh_{index}"
            body = "tmp1 + undefined_name" if "--failing" in sys.argv and index == count - 1 else "tmp1"
            source = TEMPLATE.replace("NAME", name).replace("SCALE", f"{index + 1}.{salt}").replace("BODY", body)
            if "--hanging-in-kilnd" in sys.argv and index == count - 1:
                source = HANG_IN_KILND + source
            scope[name] = compiler.triton(name, source)
            result["returned"] = type(scope[name]).__name__
        compiler.wait(scope)
        result["configs_compiled"] = {name: len(kernel.compile_results) for name, kernel in scope.items()}
    except Exception as error:  # the test compares it with stock's
        result["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
    result["cubins"] = {name: sorted(digests) for name, digests in cubins.items()}
    result["compile_threads"] = sorted(compile_threads)
    result["pool_started"] = bool(getattr(async_compile, "_pool_set", None))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
