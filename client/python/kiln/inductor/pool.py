"""Inductor's pool of compile workers only in a process that compiles a graph.

Stock inductor starts its pool (a worker per CPU, each importing torch) at
the first Triton kernel it compiles or loads, so loading a cached graph's
kernels starts it too (and the dynamo backend and compile_fx warm it up as
they start, whether or not the graphs will come from a cache). Measured on the GPU
machine (tests/gpu/inductor_fanout.py), that pool is about 17 s of the 44 s of
CPU a process spends when every graph is a cache hit, and it is what the 8
processes of a job started together fight over for their cores. Through
kilnd, a cached graph's Triton kernels are kilnd hits, read from files in
milliseconds: a process that only loads graphs has no use for the pool. So,
with Kiln on:

- until this process is to compile a graph, `AsyncCompile.use_process_pool`
  answers no, so a cached graph's kernels load in this process, as they do
  in stock whenever the pool is not ready yet; from then on it is stock's,
  and the kernels of a compiled graph are compiled in the pool;
- what inductor asked for before that to start the pool early (the dynamo
  backend's `maybe_warm_pool`, `compile_fx`'s `AsyncCompile.wakeup` for a
  graph with CUDA inputs) runs then, and never if no graph compiles.

A graph is to compile as soon as AOTAutograd's cache misses or is bypassed
(`AOTAutogradCache.try_load` loads no function): AOTAutograd then traces the
joint graph before inductor lowers it, and the pool starts up meanwhile, as
stock's does. Where AOTAutograd's cache is off, the first graph's lowering
(`fx_codegen_and_compile`) opens the gate. (Opening it only there, and
replaying only `maybe_warm_pool`, had left the pool's start to the first
Triton kernel, after lowering. On the H100 machine, 3 rounds of each could
not tell the two apart, nor either from stock: medians 20.5 and 20.5 s
against stock's 20.1 s, whose runs spread from 17.5 to 21.1 s.)

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
_asked = []  # inductor's own calls that start the pool, asked for before a graph compiled


def _allow_pool():
    global _compiling
    if _compiling:
        return
    _compiling = True
    while _asked:
        _asked.pop(0)()


def _deferred_until_compiling(start_pool):
    """`start_pool` (inductor's own) as it is once a graph compiles; until
    then a call is remembered, to run when one does."""
    @functools.wraps(start_pool)
    def start_when_compiling(*args, **kwargs):
        if _inductor_threads.replaces_pool():
            return
        if _compiling:
            start_pool(*args, **kwargs)
        elif all(asked.func is not start_pool for asked in _asked):
            _asked.append(functools.partial(start_pool, *args, **kwargs))

    return start_when_compiling


def install_async_compile(module):
    async_compile = getattr(module, "AsyncCompile", None)
    use_process_pool = getattr(async_compile, "use_process_pool", None)
    # Both classmethods in the torch versions Kiln knows; anything else starts as in stock.
    wakeup = getattr(getattr(async_compile, "wakeup", None), "__func__", None)
    if use_process_pool is None or wakeup is None or not callable(getattr(module, "maybe_warm_pool", None)):
        log.debug("inductor's compile pool not found: it starts as in stock")
        return
    if getattr(use_process_pool, "_kiln_pool_gate", False):
        return

    def gated(cls):
        return _compiling and not _inductor_threads.replaces_pool() and use_process_pool()

    gated._kiln_pool_gate = True
    module.maybe_warm_pool = _deferred_until_compiling(module.maybe_warm_pool)
    async_compile.wakeup = classmethod(_deferred_until_compiling(wakeup))
    async_compile.use_process_pool = classmethod(gated)


def install_autograd_cache(module):
    cache = getattr(module, "AOTAutogradCache", None)
    try_load = getattr(cache, "try_load", None)
    if not callable(try_load):
        log.debug("AOTAutogradCache.try_load not found: inductor's compile pool may start as a graph lowers")
        return
    if getattr(try_load, "_kiln_pool_gate", False):
        return

    @functools.wraps(try_load)
    def try_load_or_allow_pool(*args, **kwargs):
        answer = try_load(*args, **kwargs)
        loaded = answer[0] if isinstance(answer, tuple) else answer  # torch 2.15: (function, its config)
        if loaded is None:
            _allow_pool()
        return answer

    try_load_or_allow_pool._kiln_pool_gate = True
    cache.try_load = staticmethod(try_load_or_allow_pool)


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
