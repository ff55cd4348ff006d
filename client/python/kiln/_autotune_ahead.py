"""An autotuned kernel's configs compiled at once: Triton's autotuner compiles
each config when its benchmark first runs it, one after another. Under Kiln,
once the configs to try are known (prune_configs), every one of them starts
compiling in a thread of this process; the benchmark loop stays stock's (the
same configs, order and pruning) and waits only for the config it is about to
run. The threads run the frontend here (it needs this Python) while the
stages from LLIR to the cubin run in kilnd's worker processes, many at once,
and Triton's own pass managers let go of the GIL; each thread's compile is the
JIT's own (warmup=True), so the kernel it leaves in the JIT's cache is the one
the benchmark would have compiled. A config whose compile fails is left to the
benchmark, which compiles it again and meets the error as stock does.
KILN_AUTOTUNE_AHEAD=0 turns this off; KILN_AUTOTUNE_THREADS sets how many
threads (default: half the cores, 2 to 8)."""

import logging
import os
import sys
import threading

log = logging.getLogger("kiln")

_MANAGER = "kiln._cache:KilnCacheManager"
_executor = None
_executor_lock = threading.Lock()


def _wanted():
    """Only while Kiln serves this process (not before kiln.enable(), not
    after kiln.disable() or a fall back to stock)."""
    if os.environ.get("KILN_AUTOTUNE_AHEAD", "1") == "0" or os.environ.get("TRITON_CACHE_MANAGER") != _MANAGER:
        return False
    triton_side = sys.modules.get("kiln._triton")
    return triton_side is None or triton_side.active_or_untried()


def _threads():
    global _executor
    with _executor_lock:
        if _executor is None:
            from concurrent.futures import ThreadPoolExecutor

            # Half the cores, at most 8: kilnd's workers need the rest, and the
            # frontends share this process's GIL (on an H100 machine of 16
            # cores, 4 and 8 threads beat 16 to the first result).
            count = (int(os.environ.get("KILN_AUTOTUNE_THREADS", "0"))
                     or max(2, min(8, (os.cpu_count() or 4) // 2)))
            _executor = ThreadPoolExecutor(max_workers=count, thread_name_prefix="kiln-autotune")
        return _executor


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
    pool = _threads()
    started = {}
    for config in configs:
        call = {**tuner.nargs, **kwargs, **config.all_kwargs(), "warmup": True}
        call.setdefault("grid", (1, ))
        started[config] = pool.submit(_compile, tuner.fn, call, device, set_device)
    if log.isEnabledFor(logging.DEBUG):
        _log_when_done(list(started.values()))
    return started


def _log_when_done(futures):
    import time

    begun, left, lock = time.perf_counter(), [len(futures)], threading.Lock()

    def one_done(_):
        with lock:
            left[0] -= 1
            if left[0] == 0:
                log.debug("%d configs compiled ahead in %.2f s", len(futures), time.perf_counter() - begun)
    for future in futures:
        future.add_done_callback(one_done)


def _wait(future):
    try:
        future.result()
    except Exception:  # _compile catches every error of its own
        pass


def install(autotuner_module):
    autotuner = autotuner_module.Autotuner
    if getattr(autotuner.prune_configs, "kiln_ahead", False):
        return
    stock_prune, stock_bench, stock_warmup = autotuner.prune_configs, autotuner._bench, autotuner.warmup

    def prune_configs(self, kwargs):
        configs = stock_prune(self, kwargs)
        self._kiln_ahead = {}
        try:
            if len(configs) > 1 and self.nargs is not None and _wanted():
                self._kiln_ahead = _start(self, kwargs, configs)
        except Exception as error:  # stock's loop compiles them one by one
            log.debug("configs not compiled ahead: %s: %s", type(error).__name__, error)
        if getattr(self, "_kiln_wait_all", False):
            for future in self._kiln_ahead.values():
                _wait(future)
        return configs

    def _bench(self, *args, config, **meta):
        future = getattr(self, "_kiln_ahead", {}).pop(config, None)
        if future is not None:
            _wait(future)
        return stock_bench(self, *args, config=config, **meta)

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
