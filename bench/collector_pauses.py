"""Python's cyclic garbage collector runs once enough objects have been made,
wherever that is: its pauses (0.1-0.3 ms) land on one kernel or another as a
process's objects add up, so the benchmarks time them and show them apart.

In a fresh process that count is the same in every run, so a pause lands on
the same kernel every time, and a program that makes a few objects more or
fewer moves it to another kernel. That is true of stock Triton and Kiln alike
(Kiln's first hit imports two modules). Kernel by kernel, a median over runs
would then compare where the pauses fell, not what each kernel costs. So a
benchmark moves the collector's count by a different amount in each round
(shift_collector), the same for every kind of run in that round, and each
kernel bears the pauses in proportion to the objects it makes. The shift comes
after the first kernel: its imports end in full collections, which start every
count again.
"""

import gc
import time

# Python 3.11 and 3.12 collect their youngest generation every 700 objects
# made, the middle one every 10 of those collections, and the oldest every 10
# of the middle one's (once enough objects wait for it). A shift places all
# three: so many extra objects, and so many collections of each older
# generation made beforehand.
_YOUNG, _MIDDLE, _OLD = 700, 10, 10
SHIFTS = _YOUNG * _MIDDLE * _OLD

_kept = []


def shift_collector(shift):
    """Moves the collector's next pauses by `shift` (0 to SHIFTS - 1)."""
    for _ in range(shift // (_YOUNG * _MIDDLE) % _OLD):
        gc.collect(1)  # counts towards the oldest generation's next collection
    for _ in range(shift // _YOUNG % _MIDDLE):
        gc.collect(0)  # counts towards the middle generation's
    _kept.extend([] for _ in range(shift % _YOUNG))  # objects count towards the youngest's


def round_shift(round_):
    """The shift of a benchmark round: spread over SHIFTS, the same for every kind of run."""
    return (round_ * 27431) % SHIFTS  # 27431 is prime to SHIFTS: no shift repeats within SHIFTS rounds


class CollectorPauses:
    """The milliseconds the collector has run in this process since start(),
    and the objects made since then that count towards its next pause."""

    def __init__(self):
        self.ms = 0.0
        self._started = None
        self._counted = 0  # objects counted by the youngest generation until its collections

    def start(self):
        self._counted = -gc.get_count()[0]
        gc.callbacks.append(self._on_collect)
        return self

    def objects(self):
        """Objects made less objects freed since start(), of those the collector tracks."""
        return self._counted + gc.get_count()[0]

    def _on_collect(self, phase, info):
        if phase == "start":
            self._counted += gc.get_count()[0]  # any collection starts the count again
            self._started = time.perf_counter()
        elif self._started is not None:
            self.ms += (time.perf_counter() - self._started) * 1e3
            self._started = None
