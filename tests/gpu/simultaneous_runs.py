"""Timed processes of several kinds run at once, each on a share of the CPUs of
its own: runs in the same moments share the machine's state, which moves
whole runs by 10-30% from one moment to the next (bench/gpu_bench.py and
tests/gpu/inductor_warm.py with --simultaneous)."""

import os
import subprocess


def cpu_shares(kinds, round_, per_kind=None):
    """{kind: the CPUs its run in round `round_` gets}: `per_kind` CPUs each (an
    equal share if None), the kinds taking turns on the shares round by round;
    with fewer CPUs than kinds, some kinds share one."""
    cpus = sorted(os.sched_getaffinity(0))
    size = per_kind or max(1, len(cpus) // len(kinds))
    shares = [share for index in range(len(kinds)) if (share := set(cpus[index * size:(index + 1) * size]))]
    return {kind: shares[(index + round_) % len(shares)] for index, kind in enumerate(kinds)}


def start_on(cpus, argv, env):
    """Starts `argv` with its output piped, on the CPUs `cpus` alone if given."""
    pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=pin)
