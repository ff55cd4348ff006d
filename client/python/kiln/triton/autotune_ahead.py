"""An autotuned kernel's configs compiled at once: Triton's autotuner compiles
each config when its benchmark first runs it, one after another. Under Kiln,
once the configs to try are known (prune_configs) and the first benchmark
begins, every one of them starts compiling in a thread of _compile_threads (in
turns: the first is ready first) and the benchmarks go on as each is ready. The benchmark loop stays
stock's (the same configs, pruning and benchmarks, the timings in the same
order): a config still compiling when its turn comes waits while those ready
are benchmarked, as upstream's overlap mode does. Each thread's compile is
the JIT's own (warmup=True), so the kernel it leaves in the JIT's cache is the
one the benchmark would have compiled. A config whose compile fails is left
to the benchmark, which compiles it again and meets the error as stock does.
KILN_AUTOTUNE_AHEAD=0 turns this off."""

import concurrent.futures
import logging
import os
import threading
import time

from kiln.local import compile_threads as _compile_threads
from kiln.triton import serving

log = logging.getLogger("kiln")


def _wanted():
    return os.environ.get("KILN_AUTOTUNE_AHEAD", "1") != "0" and serving()


def _compile(kernel, call, device, set_device):
    try:
        if set_device is not None:
            set_device(device)  # the JIT compiles for the thread's current device
        kernel.run(**call)
    except Exception as error:  # the benchmark compiles it again, as stock
        log.debug("compiling a config ahead failed (%s: %s); its benchmark compiles it", type(error).__name__, error)


def _start(tuner, kwargs, configs):
    """{config: future} of each config's compile, started at once."""
    from triton.runtime.driver import driver

    device = driver.active.get_current_device()
    set_device = getattr(driver.active, "set_current_device", None)
    started = {}
    for config in configs:
        call = {**tuner.nargs, **kwargs, **config.all_kwargs(), "warmup": True}
        call.setdefault("grid", (1, ))
        started[config] = _compile_threads.submit(_compile, tuner.fn, call, device, set_device)
    if log.isEnabledFor(logging.DEBUG):
        _log_when_done(list(started.values()))
    return started


def _log_when_done(futures):
    begun, left, lock = time.perf_counter(), [len(futures)], threading.Lock()

    def one_done(_):
        with lock:
            left[0] -= 1
            if left[0] == 0:
                log.debug("%d configs compiled ahead in %.2f s", len(futures), time.perf_counter() - begun)
    for future in futures:
        future.add_done_callback(one_done)


def install(autotuner_module):
    autotuner = autotuner_module.Autotuner
    if getattr(autotuner.prune_configs, "kiln_ahead", False):
        return
    stock_prune, stock_bench, stock_warmup = autotuner.prune_configs, autotuner._bench, autotuner.warmup

    def start(self):
        kwargs, configs = self._kiln_to_start
        self._kiln_to_start = None
        try:
            self._kiln_ahead = _start(self, kwargs, configs)
        except Exception as error:  # stock's loop compiles them one by one
            log.debug("configs not compiled ahead: %s: %s", type(error).__name__, error)

    def prune_configs(self, kwargs):
        configs = stock_prune(self, kwargs)
        self._kiln_ahead, self._kiln_benchmarked, self._kiln_to_start = {}, {}, None
        if len(configs) > 1 and self.nargs is not None and _wanted():
            # Started by the first benchmark: timings the autotuner finds in
            # the cache (cache_results) need none, and stock then compiles
            # only the config they choose.
            self._kiln_to_start = (kwargs, configs)
        if getattr(self, "_kiln_wait_all", False) and self._kiln_to_start is not None:
            start(self)
            for future in self._kiln_ahead.values():
                future.result()  # _compile keeps its errors to itself
        return configs

    def _bench(self, *args, config, **meta):
        if getattr(self, "_kiln_to_start", None) is not None:
            start(self)
        # Stock's loop asks for each config in turn; one still compiling waits
        # while those already compiled are benchmarked, and their timings are
        # kept for their turn: the same benchmarks, each in one piece, and the
        # same timings in the same order, so the same choice as stock's.
        compiling = getattr(self, "_kiln_ahead", {})
        benchmarked = self.__dict__.setdefault("_kiln_benchmarked", {})
        if config in benchmarked:
            return benchmarked.pop(config)
        future = compiling.pop(config, None)
        while future is not None and not future.done():
            ready = next((other for other, its_compile in compiling.items() if its_compile.done()), None)
            if ready is None:
                concurrent.futures.wait([future, *compiling.values()], return_when=concurrent.futures.FIRST_COMPLETED)
            else:
                del compiling[ready]
                benchmarked[ready] = timed_bench(self, *args, config=ready, **meta)
        return timed_bench(self, *args, config=config, **meta)

    def timed_bench(self, *args, **kwargs):
        # A program's own do_bench too: compiles ahead keep out of every timing.
        with _compile_threads.timed():
            return stock_bench(self, *args, **kwargs)

    def warmup(self, *args, **kwargs):
        # Stock's loop warms each config in turn: all of them are compiled
        # (at once) by the time prune_configs returns to it.
        self._kiln_wait_all = True
        try:
            return stock_warmup(self, *args, **kwargs)
        finally:
            self._kiln_wait_all = False
            self._kiln_ahead = {}

    prune_configs.kiln_ahead = True
    autotuner.prune_configs, autotuner._bench, autotuner.warmup = prune_configs, _bench, warmup
