"""Where a first run's time goes with Kiln, phase by phase, for the first-run
benches (bench/first_run_bench.py on Linux, bench/windows_first_run_bench.py
under Wine): what each measures of kilnd's start, and of a run, and the table
they print.

  client      a process's import of Kiln's client and its connection to a
              running kilnd (triton already imported)
  kilnd       kilnd's start to its first answer, its toolchain probe (its log's
              timestamps) and its first worker ready
  per compile with kilnd up: the median time in kilnd of each call a
              compile makes (a program's own: LookupOrClaim, and a thread's
              Put; Compile where kilnd's worker compiles), the kernels kilnd
              compiled and its worker's mean time per compile (kilnd's
              statistics), and the run's whole difference to stock's, per kernel
  launchers   launcher builds kilnd made for the run (a compile-only program
              builds none)
"""

import re
import statistics
from datetime import datetime

# (client_probe.py's mode, compiles) of each shape of program the benches run.
SHAPES = {"user": ("user-program", 24), "farm": ("suite", 30)}

# How a client imports and connects, timed in a process of its own: argv[1]
# is the endpoint ("" for the default, which the environment gives).
CLIENT_START = '''
import json, sys, time
import triton
started = time.perf_counter()
from kiln.service import connection
connection.connect(sys.argv[1] or None, autostart=False)
print(json.dumps({"seconds": time.perf_counter() - started}))
'''

# kilnd's start, timed by a process that starts it (the client's autostart,
# with this Python's toolchain): to its first answer, and to its first worker
# ready (its statistics, asked every 20 ms; nothing else runs meanwhile).
KILND_START = '''
import json, os, time
os.environ["KILN_EARLY_START"] = "0"  # not started as triton's JIT loads: by the connect timed here
import triton
from kiln.service import api, autostart, connection  # loaded before kilnd's start is timed
started = time.perf_counter()
kilnd = connection.connect()
answered = time.perf_counter()
while kilnd.stub.GetStats(api.GetStatsRequest()).workers_started < 1:
    time.sleep(0.02)
print(json.dumps({"answers": answered - started, "worker": time.perf_counter() - started}))
'''

_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\]")


def _logged_at(line):
    found = _LOG_TIME.match(line)
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp() if found else None


def probe_seconds(log_text):
    """From kilnd's log: its toolchain probe's seconds (its start's line to
    the probe's answer), None if the log has no probe."""
    started = probed = None
    for line in log_text.splitlines():
        if started is None and "probing it in the background" in line:
            started = _logged_at(line)
        elif started is not None and "] toolchain: triton" in line:
            probed = _logged_at(line)
            break
    return probed - started if started is not None and probed is not None else None


def call_overhead(stats):
    """({method: its median ms in kilnd} of the calls a program's compile
    makes, the worker's mean ms per compile, kilnd's compiles, launcher
    builds) from `kiln stats --json` after a run: kilnd keeps no mean of a
    call's time, nor a median of the worker's. A program's own compile asks
    LookupOrClaim and compiles in the program, which a thread of it puts
    (Put); a Compile is kilnd's worker compiling for it."""
    latency = {entry["method"]: entry for entry in stats.get("rpc_latency", [])}
    call_ms = {method: latency[method]["p50_ms"] for method in ("LookupOrClaim", "Put", "Compile")
               if method in latency}
    compiles = int(stats.get("compiles", 0))
    worker_ms = 1e3 * stats.get("compile_seconds", 0.0) / compiles if compiles else None
    return call_ms, worker_ms, compiles, int(stats.get("launcher_builds", 0))


class Phases:
    """Phase figures gathered over a bench's rounds, for one shape of program."""

    def __init__(self):
        self.client, self.kilnd_answers, self.probe, self.worker = [], [], [], []
        self.call_ms, self.worker_ms, self.per_kernel_ms, self.launchers = {}, [], [], []
        self.compiled_in_kilnd = []

    def add_run(self, stats, seconds, stock_seconds, kernels):
        call_ms, worker_ms, compiles, launchers = call_overhead(stats)
        for method, ms in call_ms.items():
            self.call_ms.setdefault(method, []).append(ms)
        if worker_ms is not None:
            self.worker_ms.append(worker_ms)
        self.compiled_in_kilnd.append(compiles)
        self.launchers.append(launchers)
        self.per_kernel_ms.append(1e3 * (seconds - stock_seconds) / kernels)

    def print(self, title):
        def median(values, unit="s", scale=1.0):
            return f"{statistics.median(values) * scale:7.1f} {unit}" if values else "      -  "
        print(f"  where Kiln's time goes, {title} (medians):")
        print(f"    client: import and connect              {median(self.client, 'ms', 1e3)}")
        print(f"    kilnd: start to its first answer        {median(self.kilnd_answers, 'ms', 1e3)}")
        print(f"    kilnd: its toolchain probe              {median(self.probe, 'ms', 1e3)}")
        print(f"    kilnd: start to its first worker ready  {median(self.worker, 'ms', 1e3)}")
        print(f"    per compile, kilnd up: calls' p50 in kilnd: LookupOrClaim "
              f"{median(self.call_ms.get('LookupOrClaim', []), 'ms')}, Put (a thread's) "
              f"{median(self.call_ms.get('Put', []), 'ms')}, Compile {median(self.call_ms.get('Compile', []), 'ms')}")
        print(f"    kilnd up: compiled in kilnd            {max(self.compiled_in_kilnd, default=0):5d}, "
              f"its worker's mean {median(self.worker_ms, 'ms')}")
        print(f"    per kernel, kilnd up, against stock     {median(self.per_kernel_ms, 'ms')}")
        print(f"    launcher builds                         {max(self.launchers, default=0)}")


def print_results(shapes, kinds, measured, phases):
    """Each shape's kinds, their median seconds and ratio to stock's, then its phases."""
    for shape in shapes:
        mode, kernels = SHAPES[shape]
        print(f" {shape} shape ({mode}: {kernels} compiles)")
        stock = statistics.median(measured[shape]["stock"])
        for kind in kinds:
            seconds = statistics.median(measured[shape][kind])
            print(f"  {kind:10}  {seconds:6.2f} s  {seconds / stock:.2f}x   "
                  f"(runs: {', '.join(f'{s:.2f}' for s in measured[shape][kind])})")
        phases[shape].print(f"{shape} shape")
