"""The warm path on the CPU: per-kernel time of triton.compile for the 15-kernel
suite at sm80 and sm90, each phase in a fresh process, stock Triton and through
kilnd measured in one run on one machine (no GPU needed).

  stock cold     empty Triton cache dir
  stock warm     the same cache dir again (stock's file cache)
  kiln cold      kilnd and the client's files empty (kilnd's worker already up)
  kiln warm, files absent   kilnd warm; a new Triton cache dir and Kiln files dir
                            (a new venv, container or user session)
  kiln warm, files present  the same dirs again (the next run of the same program)

usage: python bench/warm_bench.py [--build-dir build] [--repeat 3]
Prints per-phase totals (the median of --repeat runs) and ratios against stock,
and on its own the once-per-process triton_key() (Kiln remembers it across
processes, in the files dir and in the local kilnd: a fresh files dir reads it
from kilnd's files).
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import hermetic  # noqa: E402  (tests/hermetic.py)

ROOT = Path(__file__).resolve().parents[1]

CLIENT = r"""
import json, sys, time
sys.path[:0] = sys.argv[1:3]
from collector_pauses import CollectorPauses
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
from triton.runtime.cache import triton_key
import kernel_suite
start = time.perf_counter()
triton_key()  # once per process, before its first kernel: timed on its own
key_ms = (time.perf_counter() - start) * 1e3
collector = CollectorPauses().start()
times, collected = {}, {}
for case in kernel_suite.SUITE:
    for arch in (80, 90):
        collected_before = collector.ms
        start = time.perf_counter()
        triton.compile(ASTSource(case.fn, case.signature, case.constexprs), target=GPUTarget("cuda", arch, 32),
                       options=case.options)
        times[f"{case.name}-sm{arch}"] = (time.perf_counter() - start) * 1e3
        collected[f"{case.name}-sm{arch}"] = collector.ms - collected_before
print(json.dumps({"triton_key": key_ms, "kernels": times, "collector": collected}))
"""


_triton_key_ms = {}  # phase -> [ms of triton_key() in each round]
# The garbage collector's pauses, shown apart (collector_pauses.py says why).
_collector_ms = {}  # phase -> [{kernel: ms the collector ran in it} in each round]


def run(env, phase):
    result = subprocess.run([sys.executable, "-c", CLIENT, str(ROOT / "tests" / "python"), str(ROOT / "bench")],
                            capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(result.stderr[-3000:])
    measured = json.loads(result.stdout.splitlines()[-1])
    _triton_key_ms.setdefault(phase, []).append(measured["triton_key"])
    _collector_ms.setdefault(phase, []).append(measured["collector"])
    return measured["kernels"]


def start_kilnd(build_dir, work):
    socket = work / "kilnd.sock"
    process = subprocess.Popen([str(build_dir / "service" / "kilnd"), f"--data-dir={work / 'data'}",
                                f"--local-socket={socket}", f"--toolchain={sys.executable}", "--log-level=warn"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([str(build_dir / "client" / "cpp" / "kiln"), "--endpoint", f"unix:{socket}", "health", "--wait",
                    "60"], check=True, stdout=subprocess.DEVNULL)
    return process, socket


def one_round(build_dir, base):
    work = Path(tempfile.mkdtemp(prefix="kiln-warm-bench-"))
    stock_env = dict(base, TRITON_CACHE_DIR=str(work / "stock"))
    phases = {"stock cold": run(stock_env, "stock cold"), "stock warm": run(stock_env, "stock warm")}
    kilnd, socket = start_kilnd(build_dir, work)
    kiln = dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{socket}")
    try:
        phases["kiln cold"] = run(dict(kiln, TRITON_CACHE_DIR=str(work / "k1"), KILN_FILES_DIR=str(work / "f1")),
                                  "kiln cold")
        fresh = dict(kiln, TRITON_CACHE_DIR=str(work / "k2"), KILN_FILES_DIR=str(work / "f2"))
        for phase in ("kiln warm, files absent", "kiln warm, files present"):
            phases[phase] = run(fresh, phase)
    finally:
        kilnd.terminate()
        kilnd.wait()
        shutil.rmtree(work, ignore_errors=True)
    return phases


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    base = hermetic.stock_env()
    rounds = [one_round(args.build_dir.resolve(), base) for _ in range(args.repeat)]
    first = next(iter(rounds[0]["stock cold"]))
    against = {"kiln cold": "stock cold", "kiln warm, files absent": "stock warm",
               "kiln warm, files present": "stock warm"}

    def total(phase, skip_first=False):
        return statistics.median(sum(ms for kernel, ms in r[phase].items() if not (skip_first and kernel == first))
                                 for r in rounds)

    kernels = len(rounds[0]["stock cold"])
    print(f"{kernels} kernels, median of {args.repeat} rounds; ms for the whole suite, and after the first kernel "
          f"(which carries each process's one-time costs)")
    for phase in rounds[0]:
        line = f"  {phase:26} {total(phase):9.1f} ms  after the first: {total(phase, True):8.1f} ms"
        if phase in against:
            line += (f"  ratio {total(phase) / total(against[phase]):.2f}x / "
                     f"{total(phase, True) / total(against[phase], True):.2f}x {against[phase]}")
        print(line)
    def kernel_ms(phase, kernel, without_collector):
        return statistics.median(r[phase][kernel] - (c[kernel] if without_collector else 0.0)
                                 for r, c in zip(rounds, _collector_ms[phase]))

    for phase in ("kiln warm, files absent", "kiln warm, files present"):
        for without_collector in (False, True):
            ratios = {k: kernel_ms(phase, k, without_collector) / kernel_ms("stock warm", k, without_collector)
                      for k in rounds[0][phase] if k != first}
            worst = max(ratios, key=ratios.get)
            print(f"  {phase}: worst kernel after the first{', without the collector' if without_collector else ''} "
                  f"{worst} {ratios[worst]:.2f}x stock warm")
    print("garbage collector's pauses after the first kernel (median ms a run, and on how many kernels)")
    for phase in ("stock warm", "kiln warm, files absent", "kiln warm, files present"):
        runs = [{k: ms for k, ms in c.items() if k != first} for c in _collector_ms[phase]]
        print(f"  {phase:26} {statistics.median(sum(c.values()) for c in runs):9.2f} ms  on "
              f"{statistics.median(sum(ms > 0 for ms in c.values()) for c in runs):.0f} kernels")
    print("once per process, before its first kernel: triton_key(), the hash of Triton's install (median ms)")
    for phase, times in _triton_key_ms.items():
        line = f"  {phase:26} {statistics.median(times):9.1f} ms"
        if phase in against:
            line += f"  ratio {statistics.median(times) / statistics.median(_triton_key_ms[against[phase]]):.2f}x"
        print(line)


if __name__ == "__main__":
    main()
