"""A torch.compile graph's Triton kernels compiled at once.

With one compile thread (TORCHINDUCTOR_COMPILE_THREADS=1, and always on
Windows, where inductor allows no other), and with more while its pool of
compile processes is not up yet, inductor compiles each Triton kernel of a
graph when the graph's module defines it (`async_compile.triton`), one after
another, then `async_compile.wait(globals())` has nothing to wait for.
Under Kiln each of those kernels starts compiling in a thread of
_compile_threads instead (the frontend here, LLIR to cubin on kilnd's
workers), `triton` hands the module a future, and `wait` collects them, as
inductor's own parallel mode does with its pool's futures:

- a thread does what inductor's pool workers do: loads the kernel's module
  and compiles every config of it (`precompile(warm_cache_only=True)`, which
  names its target, so no device state is needed);
- `wait`, in the calling thread, does what inductor's parent does with a
  worker's kernel: `precompile()` (the launchers, on the kernel's device, and
  the static-launch bundle) and its metrics;
- a kernel whose compile failed in a thread is compiled again by stock's
  `triton` in `wait`, so its error is stock's, raised where stock's wait
  would.

KILN_INDUCTOR_AHEAD=0 turns this off; =pool also puts Kiln's threads in place
of inductor's pool of compile processes (each of which imports torch) where
inductor would start one.
"""

import logging
import os
import time

from kiln.inductor import kilnd_workers as _kilnd_workers
from kiln.local import compile_threads as _compile_threads
from kiln.triton import serving

log = logging.getLogger("kiln")

# What inductor's modules must have for this (torch 2.8 to 2.15 have them);
# without one, inductor compiles as stock.
_NEEDED = ("AsyncCompile", "CompiledTritonKernels", "get_compile_threads", "_load_triton_kernel_from_source")


def _mode():
    return os.environ.get("KILN_INDUCTOR_AHEAD", "1")


def replaces_pool():
    """Kiln's threads compile a graph's kernels where inductor would start its
    pool of compile processes (KILN_INDUCTOR_AHEAD=pool)."""
    return _mode() == "pool" and serving()


def _takes_over(module, device_str):
    """Whether Kiln's threads compile this kernel: wherever inductor would
    compile it in the calling thread (one compile thread, or its pool not
    started or not ready yet), or in place of the pool when asked."""
    mode = _mode()
    if mode == "0" or device_str != "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    if not serving():
        return False
    return mode == "pool" or module.get_compile_threads() <= 1 or not module.AsyncCompile.use_process_pool()


class _Compiling:
    """A kernel compiling in a thread, as `async_compile.triton` hands it to
    the graph's module; `wait` swaps it for the kernel."""

    def __init__(self, future, finish):
        self._future, self._finish = future, finish

    def result(self):
        return self._finish(self._future)


def _bundle_key(kernel, compiled_kernels, source_code):
    """The static-launch bundle key inductor's parent passes precompile, where
    its precompile takes one (torch 2.9 and later)."""
    import inspect

    if "static_triton_bundle_key" not in inspect.signature(kernel.precompile).parameters:
        return {}
    return {"static_triton_bundle_key": compiled_kernels.key(source_code)}


def _record_metrics(module, kernel_name, kernel, elapsed_us):
    """Inductor's compile-time metrics, as its parent records a pool worker's
    kernel (best effort: they are not worth a failed compile)."""
    try:
        info = kernel.autotune_cache_info or {}
        info["compile_time_us"] = elapsed_us
        module._add_triton_kernel_info(kernel_name, info)
        module.get_metrics_context().add_top_n("triton_kernel_compile_times_us", kernel_name, elapsed_us)
    except Exception as error:
        log.debug("inductor's metrics of %s not recorded: %s: %s", kernel_name, type(error).__name__, error)


def install(module):
    """On torch._inductor.async_compile."""
    if not all(hasattr(module, name) for name in _NEEDED):
        log.debug("inductor's async_compile lacks %s: a graph's kernels compile as in stock",
                  [name for name in _NEEDED if not hasattr(module, name)])
        return
    async_compile = module.AsyncCompile
    if getattr(async_compile.triton, "_kiln_threads", False):
        return
    stock_triton, stock_wait = async_compile.triton, async_compile.wait
    compiled_kernels = module.CompiledTritonKernels
    # Inductor points Triton at its own ptxas and libdevice before compiling
    # (environment and knobs, process-wide): done here, before the threads.
    tool_paths = [getattr(module, name) for name in ("_set_triton_ptxas_path", "_set_triton_libdevice_path")
                  if callable(getattr(module, name, None))]

    def compile_in_thread(kernel_name, source_code, begun):
        # After kilnd's workers compiled the kernel, its configs are hits here.
        kernel = module._load_triton_kernel_from_source(kernel_name, source_code)
        kernel.precompile(warm_cache_only=True)
        return kernel, (time.perf_counter_ns() - begun) // 1000

    def triton(self, kernel_name, source_code, device_str="cuda"):
        started = compiled_kernels.get(source_code)
        if isinstance(started, _Compiling):  # started when the kernel was generated
            compiled_kernels.remove_future(source_code)
            return started
        if not _takes_over(module, device_str) or started is not None:
            return stock_triton(self, kernel_name, source_code, device_str)
        try:
            import torch

            module.counters["inductor"]["async_compile_cache_miss"] += 1
            module._compile_start()
            compile_id = torch._guards.CompileContext.current_compile_id()
            is_backward = getattr(module.V.graph, "is_backward", False)
            for set_path in tool_paths:
                set_path()
            in_kilnd = _kilnd_workers.start(kernel_name, source_code)
            future = _compile_threads.submit(
                compile_in_thread, kernel_name, source_code, time.perf_counter_ns(),
                after=None if in_kilnd is None else lambda: _kilnd_workers.finish(in_kilnd, kernel_name))
        except Exception as error:  # inductor's internals moved: stock compiles it
            log.debug("a graph's kernel not compiled ahead: %s: %s", type(error).__name__, error)
            return stock_triton(self, kernel_name, source_code, device_str)

        def finish(future):
            try:
                kernel, elapsed_us = future.result()
            except Exception as error:
                log.debug("compiling %s ahead failed (%s: %s); compiling it as stock", kernel_name,
                          type(error).__name__, error)
                kernel = stock_triton(self, kernel_name, source_code, device_str)
                return kernel.result() if isinstance(kernel, module.CodeCacheFuture) else kernel
            if hasattr(kernel, "set_compile_info"):
                kernel.set_compile_info(compile_id, is_backward)
            kernel.precompile(warm_cache_only=False, **_bundle_key(kernel, compiled_kernels, source_code))
            _record_metrics(module, kernel_name, kernel, elapsed_us)
            return kernel

        return _Compiling(future, finish)

    def wait(self, scope):
        begun, collected = time.perf_counter(), 0
        for name, value in list(scope.items()):
            if isinstance(value, _Compiling):
                scope[name] = value.result()
                collected += 1
        if collected:
            log.debug("%d kernels of a graph compiled at once; %.2f s waited for them", collected,
                      time.perf_counter() - begun)
        return stock_wait(self, scope)

    triton._kiln_threads = True
    async_compile.triton, async_compile.wait = triton, wait


def install_codegen(module):
    """On torch._inductor.codegen.triton: a kernel starts compiling as soon as
    inductor has generated it, while it generates the graph's other kernels,
    as inductor does with its pool once the pool is up; the graph's module
    then finds it under way (CompiledTritonKernels)."""
    scheduling = getattr(module, "TritonScheduling", None)
    emit = getattr(scheduling, "_emit_kernel_to_wrapper", None)
    if emit is None or getattr(emit, "_kiln_threads", False):
        if emit is None:
            log.debug("TritonScheduling._emit_kernel_to_wrapper not found: kernels start compiling when loaded")
        return

    def _emit_kernel_to_wrapper(self, wrapper, kernel, src_code, kernel_name, subs_name, *args, **kwargs):
        try:
            _start_early(subs_name, src_code)
        except Exception as error:  # it compiles when the graph's module loads it
            log.debug("%s not started early: %s: %s", subs_name, type(error).__name__, error)
        return emit(self, wrapper, kernel, src_code, kernel_name, subs_name, *args, **kwargs)

    _emit_kernel_to_wrapper._kiln_threads = True
    scheduling._emit_kernel_to_wrapper = _emit_kernel_to_wrapper


def _start_early(kernel_name, source_code):
    import sys

    async_module = sys.modules.get("torch._inductor.async_compile")
    if async_module is None or not getattr(async_module.AsyncCompile.triton, "_kiln_threads", False):
        return
    device_str = async_module.V.graph.get_current_device_or_throw().type
    compiler = async_module.AsyncCompile()
    if (not _takes_over(async_module, device_str) or compiler.use_process_pool()
            or async_module.CompiledTritonKernels.get(source_code) is not None):
        return  # inductor's pool starts it itself, or it is under way
    compiling = compiler.triton(kernel_name, source_code, device_str)
    if isinstance(compiling, _Compiling):
        async_module.CompiledTritonKernels.save(source_code, compiling)
