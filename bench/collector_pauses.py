"""Python's cyclic garbage collector runs once enough objects have been made,
wherever that is: its pauses (0.1-0.3 ms) land on one kernel or another as a
process's objects add up, so the benchmarks time them and show them apart."""

import gc
import time


class CollectorPauses:
    """The milliseconds the collector has run in this process since start()."""

    def __init__(self):
        self.ms = 0.0
        self._started = None

    def start(self):
        gc.callbacks.append(self._on_collect)
        return self

    def _on_collect(self, phase, info):
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.ms += (time.perf_counter() - self._started) * 1e3
            self._started = None
