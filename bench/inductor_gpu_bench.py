"""Cold torch.compile, first call (bench/inductor_program.py), each run a fresh
process with empty local caches, in rounds that interleave:

  stock-serial    stock, TORCHINDUCTOR_COMPILE_THREADS=1 (as inductor always is on Windows)
  kiln-serial     Kiln against a fresh kilnd, same setting: a graph's kernels compiled
                  at once in Kiln's threads (kiln/inductor/threads.py)
  kiln-warm       kiln-serial's kilnd again, a fresh process with no local files
  stock-pool      stock, inductor's default pool of compile processes
  kiln-pool       Kiln against a fresh kilnd, inductor's pool as in stock
  kiln-threads    Kiln against a fresh kilnd, Kiln's threads in place of inductor's
                  pool (KILN_INDUCTOR_AHEAD=pool)
  kiln-serial-running, kiln-threads-running
                  the same against a kilnd that is already running: it has compiled
                  another model before (the transformer), so its workers have
                  imported torch; only the measured run's CPU counts
  kiln-one-by-one Kiln, TORCHINDUCTOR_COMPILE_THREADS=1, KILN_INDUCTOR_AHEAD=0 (not by default)
  kiln-pool-4     Kiln, inductor's pool of 4 processes (TORCHINDUCTOR_COMPILE_THREADS=4; not by default)
  kiln-pool-8     the same with 8
  stock-serial-compiled, stock-pool-compiled
                  stock-serial and stock-pool again, on the Triton cache their own run
                  of the round filled but with a fresh inductor cache: everything a
                  cold first call costs but Triton's compiles (tracing, lowering,
                  inductor's benchmarks, the pool), the floor under any cold run
                  whose kernels are stock's

Prints each kind's median first call and CPU (the program with the processes it
waited for, plus kilnd and its workers), as ratios to stock-serial and
stock-pool, the Triton kernels the graphs hold, and whether every run matched
eager. Run on the GPU machine:

  python3 bench/inductor_gpu_bench.py gpu_bundle [--model deep|transformer] [--rounds 2] [--kinds ...]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

from autotune_gpu_bench import Kilnd, prepare  # noqa: E402

PROGRAM = Path(__file__).resolve().with_name("inductor_program.py")
KINDS = ("stock-serial", "kiln-serial", "kiln-warm", "kiln-serial-running", "stock-pool", "kiln-pool", "kiln-threads",
         "kiln-threads-running", "kiln-one-by-one", "kiln-pool-4", "kiln-pool-8", "stock-serial-compiled",
         "stock-pool-compiled")
DEFAULT_KINDS = KINDS[:-5]
SERIAL = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
SETTINGS = {"stock-serial": SERIAL, "kiln-serial": SERIAL, "kiln-warm": SERIAL, "stock-pool": {}, "kiln-pool": {},
            "kiln-threads": {"KILN_INDUCTOR_AHEAD": "pool"}, "kiln-serial-running": SERIAL,
            "kiln-threads-running": {"KILN_INDUCTOR_AHEAD": "pool"},
            "kiln-one-by-one": dict(SERIAL, KILN_INDUCTOR_AHEAD="0"),
            "kiln-pool-4": {"TORCHINDUCTOR_COMPILE_THREADS": "4"}, "kiln-pool-8": {"TORCHINDUCTOR_COMPILE_THREADS": "8"},
            "stock-serial-compiled": SERIAL, "stock-pool-compiled": {}}
EXTRA_KILN_ENV = {name[len("BENCH_"):]: value for name, value in os.environ.items() if name.startswith("BENCH_KILN_")}


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(kind, work, model, kilnd=None, triton_cache=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN", "TRITON_", "TORCHINDUCTOR_"))}
    env.update(TRITON_CACHE_DIR=str(triton_cache or work / "triton"), TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"),
               KILN_FILES_DIR=str(work / "files"), **SETTINGS[kind])
    if kilnd is not None:
        env.update(KILN="1", KILN_STRICT="1", KILN_ENDPOINT=kilnd.env["KILN_ENDPOINT"], **EXTRA_KILN_ENV)
    cpu_before, kilnd_before = children_cpu(), kilnd.cpu_seconds() if kilnd else 0
    result = subprocess.run([sys.executable, str(PROGRAM), model], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{result.stderr[-4000:]}")
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    measured["kilnd_cpu_s"] = (kilnd.cpu_seconds() - kilnd_before) if kilnd else 0
    measured["cpu_s"] = children_cpu() - cpu_before + measured["kilnd_cpu_s"]
    for line in result.stderr.splitlines():
        if "compiled at once" in line or "kilnd's workers" in line:
            print(f"  {kind}: {line.strip()}")
    if kilnd is not None and os.environ.get("BENCH_STATS"):
        print(f"  {kind}: kilnd stats:\n" + "\n".join("    " + line for line in kilnd.stats().splitlines()))
    return measured


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--model", default="deep", choices=("deep", "transformer"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kinds", default=",".join(DEFAULT_KINDS), help="which kinds of run, comma-separated")
    options = parser.parse_args()
    kinds = [kind for kind in KINDS if kind in options.kinds.split(",")]
    bundle, root = prepare(options.bundle, "kiln-inductor-")
    results = {kind: [] for kind in kinds}
    for number in range(options.rounds):
        for kind in kinds:
            if kind == "kiln-warm":  # run with kiln-serial's kilnd, below
                continue
            work = root / f"{number}-{kind}"
            work.mkdir()
            if kind.startswith("kiln"):
                kilnd = Kilnd(bundle, work)
                if kind.endswith("-running"):
                    before = root / f"{number}-{kind}-before"
                    before.mkdir()
                    run(kind, before, "transformer" if options.model != "transformer" else "deep", kilnd)
                results[kind].append(run(kind, work, options.model, kilnd))
                if kind == "kiln-serial" and "kiln-warm" in kinds:
                    warm = root / f"{number}-kiln-warm"
                    warm.mkdir()
                    results["kiln-warm"].append(run("kiln-warm", warm, options.model, kilnd))
                kilnd.stop()
            elif kind.endswith("-compiled"):
                filler = kind.removesuffix("-compiled")
                filled = root / f"{number}-{filler}" / "triton"
                if not filled.is_dir():
                    raise SystemExit(f"{kind} needs {filler} among the kinds")
                results[kind].append(run(kind, work, options.model, triton_cache=filled))
            else:
                results[kind].append(run(kind, work, options.model))
        print(f"round {number + 1}: " + ", ".join(
            f"{kind} {results[kind][-1]['first_call_s']:.2f} s (cpu {results[kind][-1]['cpu_s']:.1f}"
            + (f", kilnd's {results[kind][-1]['kilnd_cpu_s']:.1f})" if kind.startswith("kiln") else ")")
            for kind in kinds if results[kind]), flush=True)

    def median(kind, field):
        return statistics.median(r[field] for r in results[kind]) if results.get(kind) else None

    print(f"\nmodel: {options.model}, cores: {os.cpu_count()}, rounds: {options.rounds}, "
          f"Triton kernels: {sorted({r['triton_kernels'] for kind in kinds for r in results[kind]})}")
    for kind in kinds:
        base = "stock-pool" if kind.startswith(("kiln-pool", "stock-pool", "kiln-threads")) else "stock-serial"
        seconds, cpu = median(kind, "first_call_s"), median(kind, "cpu_s")
        line = f"{kind:16s} first call {seconds:7.2f} s  cpu {cpu:7.1f} s"
        if results.get(base):
            line += (f"   {seconds / median(base, 'first_call_s'):5.2f}x {base} wall,"
                     f" {cpu / median(base, 'cpu_s'):5.2f}x cpu")
        print(line)
    print("all correct:", all(r["correct"] for kind in kinds for r in results[kind]))


if __name__ == "__main__":
    main()
