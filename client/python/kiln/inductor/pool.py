"""Inductor's pool of compile workers only in a process that compiles a graph.

Stock inductor starts its pool (a worker per CPU, each importing torch) at
the first Triton kernel it compiles or loads, so loading a cached graph's
kernels starts it too (and the dynamo backend warms it up as it starts,
whether or not the graphs will come from a cache). Measured on the GPU
machine (tests/gpu/inductor_fanout.py), that pool is about 17 s of the 44 s of
CPU a process spends when every graph is a cache hit, and it is what the 8
processes of a job started together fight over for their cores. Through
kilnd, a cached graph's Triton kernels are kilnd hits, read from files in
milliseconds: a process that only loads graphs has no use for the pool. So,
with Kiln on:

- until inductor starts compiling a graph (`fx_codegen_and_compile`, a
  cache miss or a bypass), `AsyncCompile.use_process_pool` answers no, so a
  cached graph's kernels load in this process, as they do in stock whenever
  the pool is not ready yet; from then on it is stock's, and the kernels of
  a compiled graph are compiled in the pool;
- a warm-up asked for before that (`maybe_warm_pool`) runs when the first
  graph starts compiling, before lowering, and never if none does.

The pool works for Triton kernels only (inductor's C++ kernels compile on
threads), so CPU-only compiles lose nothing either. A cached graph whose
kernels kilnd no longer has (evicted apart from it) compiles them in this
process, at once in Kiln's compile threads (threads.py) as any graph does
while no pool is up.
"""

import functools
import logging

from kiln.inductor import threads as _inductor_threads

log = logging.getLogger("kiln")

_compiling = False  # this process has started compiling a graph: the pool is stock's from now on
_warm_pool = None  # inductor's own maybe_warm_pool
_warm_asked = False  # inductor asked to warm the pool up before a graph compiled


def _allow_pool():
    global _compiling
    if _compiling:
        return
    _compiling = True
    if _warm_asked and _warm_pool is not None:
        _warm_pool()


def install_async_compile(module):
    global _warm_pool
    async_compile = getattr(module, "AsyncCompile", None)
    use_process_pool = getattr(async_compile, "use_process_pool", None)
    if use_process_pool is None or not callable(getattr(module, "maybe_warm_pool", None)):
        log.debug("inductor's compile pool not found: it starts as in stock")
        return
    if getattr(use_process_pool, "_kiln_pool_gate", False):
        return
    _warm_pool = module.maybe_warm_pool

    def maybe_warm_pool():
        global _warm_asked
        if _inductor_threads.replaces_pool():
            return
        if _compiling:
            _warm_pool()
        else:
            _warm_asked = True

    def gated(cls):
        return _compiling and not _inductor_threads.replaces_pool() and use_process_pool()

    gated._kiln_pool_gate = True
    module.maybe_warm_pool = maybe_warm_pool
    async_compile.use_process_pool = classmethod(gated)


def install_compile_fx(module):
    compile_graph = getattr(module, "fx_codegen_and_compile", None)
    if not callable(compile_graph):
        log.debug("fx_codegen_and_compile not found: inductor's compile pool starts as in stock")
        _allow_pool()
        return
    if getattr(compile_graph, "_kiln_pool_gate", False):
        return

    @functools.wraps(compile_graph)
    def compile_with_pool(*args, **kwargs):
        _allow_pool()
        return compile_graph(*args, **kwargs)

    compile_with_pool._kiln_pool_gate = True
    module.fx_codegen_and_compile = compile_with_pool
