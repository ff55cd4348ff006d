"""Python's cyclic garbage collector runs once enough objects have been made,
wherever that is: its pauses (0.1-0.3 ms) land on one kernel or another as a
process's objects add up, so the benchmarks time them and show them apart.

In a fresh process that count is the same in every run, so a pause lands on
the same kernel every time, and a program that makes a few objects more or
fewer moves it to another kernel. That is true of stock Triton and Kiln alike
(Kiln's first hit imports two modules). Kernel by kernel, a median over runs
would then compare where the pauses fell, not what each kernel costs. So a
benchmark makes a different number of objects before its first kernel in each
round (shift_collector), the same number for every kind of run in that round,
and each kernel bears the pauses in proportion to the objects it makes.
"""

import gc
import time

# Python 3.12's collector runs its youngest generation every 700 objects, the
# next every 10 of those, and the oldest every 10 of those when enough objects
# wait: shifts up to 7,000 objects move all three.
SHIFTS = 7000

_kept = []


def shift_collector(objects):
    """Keeps `objects` more objects alive from now on, each tracked by the collector."""
    _kept.extend([] for _ in range(objects))


def round_shift(round_):
    """The shift of a benchmark round: spread over SHIFTS, the same for every kind of run."""
    return (round_ * 2741) % SHIFTS  # 2741 is prime to 7000: 7000 rounds before a shift repeats


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
