"""Decisions made by timing (the autotuner's benchmarks, inductor's: pad_mm,
max-autotune's choices; do_bench wherever a program calls it) are timed with
nothing of Kiln's running beside them in this process: inside one, Kiln's
compile threads run no Python (local/compile_threads.timed), so they take no
GIL from the launches being timed. Their compiles go on in kilnd's workers,
other processes, meanwhile, and their Python parts between the benchmarks."""

import functools

from kiln.local import compile_threads as _compile_threads


def _timed(function):
    if getattr(function, "kiln_timed", False):
        return function

    @functools.wraps(function)
    def timed(*args, **kwargs):
        with _compile_threads.timed():
            return function(*args, **kwargs)

    timed.kiln_timed = True
    return timed


def install_triton_testing(testing):
    """triton.testing's benchmarks; the autotuner calls do_bench through the
    module, and inductor imports it from there when it first benchmarks."""
    for name in ("do_bench", "do_bench_cudagraph"):
        if callable(getattr(testing, name, None)):
            setattr(testing, name, _timed(getattr(testing, name)))


def install_inductor_benchmarking(benchmarking):
    """Inductor's benchmarkers (torch._inductor.runtime.benchmarking), each
    class's own methods."""
    base = getattr(benchmarking, "Benchmarker", None)
    if base is None:
        return
    for benchmarker in list(vars(benchmarking).values()):
        if isinstance(benchmarker, type) and issubclass(benchmarker, base):
            for name in ("benchmark", "benchmark_cpu", "benchmark_gpu"):
                if name in vars(benchmarker):
                    setattr(benchmarker, name, _timed(vars(benchmarker)[name]))
