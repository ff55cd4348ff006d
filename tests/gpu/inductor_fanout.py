"""N processes torch.compiling the same models at once, on the GPU machine:

  python3 tests/gpu/inductor_fanout.py gpu_bundle [--processes 8] [--cores 4]

Each process (inductor_program.py: a 2-block fp16 transformer and an MLP) has
empty local caches of its own, and all start together. Runs stock and through
one fresh kilnd, with one process and with N, and with --cores again pinned to
that many cores (taskset). Prints wall time, the CPU time of the processes
(their compile workers included) and of kilnd (its Triton workers included),
inductor's graph cache counters, autotuning benchmarks run, and kilnd's hits
after waiting; then the issue's checks: exactly one process compiled each
graph and benchmarked each kernel's configs, every output
equal to eager, and the N processes' CPU within 2x one process's."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hermetic  # noqa: E402  (tests/hermetic.py)

from gpu_bundle import install_client

HERE = Path(__file__).resolve().parent


def cpu_seconds(usage):
    return usage.ru_utime + usage.ru_stime


class Kilnd:
    def __init__(self, bundle, work):
        self.bundle, self.env = bundle, dict(os.environ, LD_LIBRARY_PATH=str(bundle / "lib"))
        self.socket = work / "kilnd.sock"
        self.process = subprocess.Popen([str(bundle / "kilnd"), f"--data-dir={work / 'data'}",
                                         f"--local-socket={self.socket}", f"--toolchain={sys.executable}",
                                         "--log-level=warn"], env=self.env)
        self.kiln("health", "--wait", "60")

    def kiln(self, *args):
        return subprocess.run([str(self.bundle / "kiln"), "--endpoint", f"unix:{self.socket}", *args],
                              env=self.env, check=True, capture_output=True, text=True).stdout

    def stop(self):
        """Stops it; returns its CPU seconds, its workers' included."""
        self.process.terminate()
        _, _, usage = os.wait4(self.process.pid, 0)
        return cpu_seconds(usage)


def run(label, count, bundle, work, cores):
    """count processes started together; one line of figures."""
    work.mkdir(parents=True)
    base = hermetic.stock_env("TORCHINDUCTOR")
    kilnd = Kilnd(bundle, work) if label == "kiln" else None
    start = work / "start"
    pin = ["taskset", "-c", f"0-{cores - 1}"] if cores else []
    processes = []
    for i in range(count):
        env = dict(base, TORCHINDUCTOR_CACHE_DIR=str(work / f"p{i}" / "inductor"),
                   TRITON_CACHE_DIR=str(work / f"p{i}" / "triton"), KILN_FILES_DIR=str(work / f"p{i}" / "files"))
        if kilnd:
            env.update(KILN="1", KILN_ENDPOINT=f"unix:{kilnd.socket}")
        out = open(work / f"p{i}.out", "w")
        processes.append(subprocess.Popen([*pin, sys.executable, str(HERE / "inductor_program.py"),
                                           "--start-file", str(start)], env=env, stdout=out,
                                          stderr=subprocess.STDOUT))
    time.sleep(3)  # let every interpreter get to its start line (imports are not what is measured)
    began = time.monotonic()
    start.touch()
    client_cpu = 0.0
    for process in processes:
        _, status, usage = os.wait4(process.pid, 0)
        client_cpu += cpu_seconds(usage)
        if status != 0:
            sys.exit((work / f"p{processes.index(process)}.out").read_text()[-4000:])
    wall = time.monotonic() - began
    waited = 0
    if kilnd:
        stats = json.loads(kilnd.kiln("stats", "--json"))
        waited = sum(int(n["waited_hits"]) for n in stats["lookups_by_namespace"]
                     if n["namespace"].endswith("/inductor"))
    kilnd_cpu = kilnd.stop() if kilnd else 0.0
    results = [json.loads((work / f"p{i}.out").read_text().splitlines()[-1]) for i in range(count)]
    misses = sum(r["inductor"].get("fxgraph_cache_miss", 0) for r in results)
    hits = sum(r["inductor"].get("fxgraph_cache_hit", 0) for r in results)
    benchmarks = sum(r["autotune_benchmarks"] for r in results)
    firsts = sorted(r["transformer"]["first_call_s"] for r in results)
    correct = all(r[m]["allclose"] for r in results for m in ("transformer", "mlp"))
    print(f"{label:5} x{count} {'on ' + str(cores) + ' cores' if cores else 'all cores':12} wall {wall:6.1f} s, "
          f"CPU {client_cpu:7.1f} s + kilnd {kilnd_cpu:6.1f} s = {client_cpu + kilnd_cpu:7.1f} s; "
          f"transformer first call {firsts[0]:.1f}-{firsts[-1]:.1f} s; FX graphs {misses} compiled, {hits} hits, "
          f"{waited} hits after waiting; {benchmarks} autotune benchmarks; outputs {'equal eager' if correct else 'WRONG'}", flush=True)
    return {"wall": wall, "cpu": client_cpu + kilnd_cpu, "misses": misses, "hits": hits, "correct": correct,
            "benchmarks": benchmarks}


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--cores", type=int, default=4)
    args = parser.parse_args()
    bundle = args.bundle.resolve()
    install_client(bundle)
    work = Path(tempfile.mkdtemp(prefix="kiln-fanout-"))
    runs = {}
    for cores in (0, args.cores):
        for label in ("stock", "kiln"):
            for count in ((1, args.processes) if not cores else (args.processes,)):
                runs[label, count, cores] = run(label, count, bundle, work / f"{label}-{count}-{cores}", cores)
    n = args.processes
    one_kiln, many_kiln = runs["kiln", 1, 0], runs["kiln", n, 0]
    graphs = one_kiln["misses"]
    checks = {
        "each graph compiled once": many_kiln["misses"] == graphs and many_kiln["hits"] == (n - 1) * graphs,
        "each kernel autotuned once": many_kiln["benchmarks"] == one_kiln["benchmarks"],
        "outputs equal eager": all(r["correct"] for r in runs.values()),
        f"CPU of {n} <= 2x one": many_kiln["cpu"] <= 2 * one_kiln["cpu"],
        f"wall on {args.cores} cores better than stock": runs["kiln", n, args.cores]["wall"] < runs["stock", n, args.cores]["wall"],
    }
    print(f"CPU, {n} processes / one: stock {runs['stock', n, 0]['cpu'] / runs['stock', 1, 0]['cpu']:.2f}x, "
          f"kiln {many_kiln['cpu'] / one_kiln['cpu']:.2f}x")
    for check, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}: {check}")


if __name__ == "__main__":
    main()
