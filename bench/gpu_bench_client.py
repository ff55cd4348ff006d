"""One process of bench/gpu_bench.py: for each suite kernel at this GPU's own
target, the time from asking Triton for it to having it loaded and launchable
(triton.compile, then loading the cubin and the launcher module). Prints JSON:
{"kernels": {kernel name: milliseconds}, "collector_ms": {kernel name: the part
of its milliseconds that Python's garbage collector ran}, "objects": {kernel
name: the objects it left for the collector to count towards its next pause},
"triton_key_ms": the process's one triton_key() (before its first kernel),
"to_first_kernel_ms": from its launch ($GPU_BENCH_LAUNCHED_NS, the parent's
time.monotonic_ns()) to its first kernel launchable, "grpc_imported": whether it
called kilnd, "kiln_used": whether Kiln's client served Triton's cache}.

With --collector-phase N, the collector's count is shifted by N after the
first kernel, so its pauses land on other kernels (collector_pauses.py).

With --phases, each kernel's time is split into the steps of a warm hit, with
--cold-phases into those of a cold compile (the kernel's lookup, each of
Triton's stages, where Kiln's first remote stage holds its Compile call, and
the launcher build):
{phase: ms} for each kernel, the same steps for stock Triton and Kiln. The timing wrappers cost
a little, the same for both. "kilnd ..." phases are what kilnd reported its
worker spent in a stage: they lie inside the client's stage times, so they are
not part of the sum that "other" completes."""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

import triton  # noqa: E402
from triton.compiler.compiler import ASTSource  # noqa: E402

import kernel_suite  # noqa: E402
from collector_pauses import CollectorPauses, shift_collector  # noqa: E402  (beside this file)

# Where a warm hit spends its time (ms by phase): the cache manager finding the
# kernel's group, CompiledKernel reading it, the launcher module's lookup and
# import, and loading the cubin; "other" is the rest (the cache key, Triton's
# own code).
_spent = {}


def _timed(phase, function):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            _spent[phase] = _spent.get(phase, 0.0) + (time.perf_counter() - start) * 1e3
    return timed


class _TimedManager:
    def __init__(self, manager):
        self._manager = manager

    def get_group(self, filename):
        return _timed("group lookup", self._manager.get_group)(filename)

    def get_file(self, filename):
        return _timed("launcher lookup", self._manager.get_file)(filename)

    def __getattr__(self, name):
        return getattr(self._manager, name)


_inside = {}  # what kilnd reported of its own stages (ms), inside the client's phases


def _report_kilnd_stages():
    """Records the stage times kilnd reports with each Compile (once Kiln's hook is in)."""
    triton_side = sys.modules.get("kiln.triton.remote")
    if triton_side is None or getattr(triton_side._stub, "reports_stages", False):
        return
    stub = triton_side._stub

    class _ReportingStub:
        def __init__(self, inner):
            self._inner = inner

        def Compile(self, request):
            response = self._inner.Compile(request)
            for stage, seconds in response.stage_seconds.items():
                _inside[f"kilnd {stage}"] = _inside.get(f"kilnd {stage}", 0.0) + seconds * 1e3
            return response

        def __getattr__(self, name):
            return getattr(self._inner, name)

    def reporting_stub():
        return _ReportingStub(stub())

    reporting_stub.reports_stages = True
    triton_side._stub = reporting_stub


def _time_cold_phases():
    from triton.backends.nvidia import compiler as nvidia, driver as nvidia_driver

    add_stages = nvidia.CUDABackend.add_stages

    def timed_add_stages(self, stages, options, language):
        add_stages(self, stages, options, language)  # Kiln's hook has wrapped them by now
        _report_kilnd_stages()
        for ext in list(stages):
            stages[ext] = _timed(f"stage {ext}", stages[ext])

    nvidia.CUDABackend.add_stages = timed_add_stages
    nvidia_driver.compile_module_from_src = _timed("launcher build", nvidia_driver.compile_module_from_src)
    # The kernel's own lookup (through Kiln: the first one connects to kilnd),
    # not the launcher's, which the launcher build holds.
    from triton.compiler import compiler

    get_cache_manager = compiler.get_cache_manager
    compiler.get_cache_manager = lambda key: _TimedManager(get_cache_manager(key))


def _time_phases():
    from triton.compiler import compiler
    from triton.runtime import build, driver

    for module in (compiler, build):
        get_cache_manager = module.get_cache_manager
        module.get_cache_manager = lambda key, get=get_cache_manager: _TimedManager(get(key))
    compiler.CompiledKernel.__init__ = _timed("read group", compiler.CompiledKernel.__init__)
    build._load_module_from_path = _timed("launcher import", build._load_module_from_path)
    utils = driver.active.utils
    utils.load_binary = _timed("cubin load", utils.load_binary)


def main():
    from triton.runtime.cache import triton_key

    phases = "--phases" in sys.argv[1:] or "--cold-phases" in sys.argv[1:]
    if "--phases" in sys.argv[1:]:
        _time_phases()
    elif phases:
        _time_cold_phases()
    start = time.perf_counter()
    triton_key()  # once per process, before its first kernel: timed on its own
    triton_key_ms = (time.perf_counter() - start) * 1e3
    times, collector_ms, objects = {}, {}, {}
    shift = int(sys.argv[sys.argv.index("--collector-phase") + 1]) if "--collector-phase" in sys.argv else 0
    collector = CollectorPauses().start()
    for index, case in enumerate(kernel_suite.SUITE):
        if index == 1:
            # After the first kernel: its imports end in full collections, which
            # start every count again and would undo a shift made before it.
            shift_collector(shift)
        _spent.clear()
        _inside.clear()
        collected_before, objects_before = collector.ms, collector.objects()
        start = time.perf_counter()
        kernel = triton.compile(ASTSource(case.fn, case.signature, case.constexprs), options=case.options)
        kernel._init_handles()
        total = (time.perf_counter() - start) * 1e3
        if index == 0:
            to_first_kernel_ms = (time.monotonic_ns() - int(os.environ["GPU_BENCH_LAUNCHED_NS"])) / 1e6
        collector_ms[case.name] = collector.ms - collected_before
        objects[case.name] = collector.objects() - objects_before
        if phases:
            times[case.name] = dict(_spent, other=total - sum(_spent.values()), total=total, **_inside)
        else:
            times[case.name] = total
    # Triton took its cache manager from Kiln (a warm hit never imports kiln.triton.remote).
    triton_side = sys.modules.get("kiln.triton.remote")
    kiln_used = "kiln._cache" in sys.modules and (triton_side is None or triton_side._installed is not False)
    print(json.dumps({"kernels": times, "collector_ms": collector_ms, "objects": objects, "triton_key_ms": triton_key_ms,
                      "to_first_kernel_ms": to_first_kernel_ms,
                      "grpc_imported": "grpc" in sys.modules, "kiln_used": kiln_used}))


if __name__ == "__main__":
    main()
