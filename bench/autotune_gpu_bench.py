"""Cold autotuning, time to first result (bench/autotune_program.py: a GEMM
with 16 configs, a normalization with 8), each run a fresh process with an
empty Triton cache, in rounds that interleave:

  stock           stock Triton (the autotuner compiles each config as it benchmarks it)
  stock-threads   stock Triton, every config first compiled in N threads (--threads, 16)
  kiln-serial     Kiln against a fresh kilnd, configs compiled one by one (KILN_AUTOTUNE_AHEAD=0)
  kiln            Kiln against a fresh kilnd, configs compiled at once (kiln/triton/autotune_ahead.py)
  kiln-warm       the last kilnd again, from a fresh process with no local files
  stock-warm      stock again, on the Triton cache its cold run left

--cache-autotuning runs all of them with TRITON_CACHE_AUTOTUNING=1: the cold
runs store the autotuner's timings in the cache, and the warm runs find them
there (kiln-warm through kilnd) and benchmark nothing.

Prints each kind's median and its ratio to stock, whether every run chose
the same best configs and computed correct results, and the three fastest
configs of each kernel with their timings. Run on the GPU machine:

  python3 bench/autotune_gpu_bench.py gpu_bundle [--rounds 3] [--threads 16] [--cache-autotuning] [--timeline]

--timeline prints, for each kind's first round, when each config's compile
and each benchmark began and ended (autotune_program.py --timeline).
"""

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import hermetic  # noqa: E402  (tests/hermetic.py)
import process_table  # noqa: E402  (tests/process_table.py)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
from gpu_bundle import install_client  # noqa: E402

PROGRAM = Path(__file__).resolve().with_name("autotune_program.py")
KINDS = ("stock", "stock-threads", "kiln-serial", "kiln", "kiln-warm", "stock-warm")
# KILN_* settings of the Kiln runs, from this process's environment as
# BENCH_KILN_* (BENCH_KILN_DEBUG=1 shows when the configs compiled ahead were done).
EXTRA_KILN_ENV = {name[len("BENCH_"):]: value for name, value in os.environ.items() if name.startswith("BENCH_KILN_")}


class Kilnd:
    def __init__(self, bundle, directory, *flags):
        self.bundle, self.directory = bundle, directory
        self.env = dict(os.environ, LD_LIBRARY_PATH=str(bundle / "lib"),
                        KILN_ENDPOINT=f"unix:{directory / 'kilnd.sock'}")
        self.process = subprocess.Popen([str(bundle / "kilnd"), f"--data-dir={directory / 'data'}",
                                         f"--local-socket={directory / 'kilnd.sock'}", f"--toolchain={sys.executable}",
                                         *flags],
                                        env=self.env, stdout=open(directory / "kilnd.log", "w"),
                                        stderr=subprocess.STDOUT)
        subprocess.run([str(bundle / "kiln"), "health", "--wait", "60"], env=self.env, check=True)

    def stats(self):
        return subprocess.run([str(self.bundle / "kiln"), "stats"], env=self.env, capture_output=True,
                              text=True).stdout

    def cpu_seconds(self):
        """CPU kilnd and every process under it (workers, their ptxas, the
        inductor fork server and its children) have used so far."""
        return process_table.tree_cpu_seconds(self.process.pid)

    def stop(self):
        self.process.terminate()
        self.process.wait()


def run(kind, work, threads, cache_autotuning, kilnd=None, timeline=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN", "TRITON_"))}
    env.update(TRITON_CACHE_DIR=str(work / "triton"), KILN_FILES_DIR=str(work / "files"))
    if cache_autotuning:
        env["TRITON_CACHE_AUTOTUNING"] = "1"
    args = ["--timeline"] if timeline else []
    if kind == "stock-threads":
        args += ["--precompile-threads", str(threads)]
    if kilnd is not None:
        env.update(KILN="1", KILN_STRICT="1", KILN_ENDPOINT=kilnd.env["KILN_ENDPOINT"])
        if kind == "kiln-serial":
            env["KILN_AUTOTUNE_AHEAD"] = "0"
        env.update(EXTRA_KILN_ENV)
    result = subprocess.run([sys.executable, str(PROGRAM), *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{result.stderr[-4000:]}")
    for line in result.stderr.splitlines():
        if "compiled ahead" in line:
            print(f"  {kind}: {line}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def prepare(bundle, prefix):
    """Enters a home of its own (none of this account's kilnd, caches or files),
    installs the bundle's client, and makes the runs' directory."""
    hermetic.enter()
    bundle = bundle.resolve()
    install_client(bundle)
    return bundle, Path(tempfile.mkdtemp(prefix=prefix))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--kinds", default=",".join(KINDS), help="which kinds of run, comma-separated (stock always)")
    parser.add_argument("--cache-autotuning", action="store_true", help="TRITON_CACHE_AUTOTUNING=1 in every run")
    parser.add_argument("--timeline", action="store_true", help="print each kind's first round's timeline")
    options = parser.parse_args()
    kinds = [kind for kind in KINDS if kind == "stock" or kind in options.kinds.split(",")]
    bundle, root = prepare(options.bundle, "kiln-autotune-")
    results = {kind: [] for kind in kinds}
    for number in range(options.rounds):
        cached = options.cache_autotuning
        run_kind = functools.partial(run, threads=options.threads, cache_autotuning=cached,
                                     timeline=options.timeline and number == 0)
        for kind in kinds:
            if kind == "kiln-warm":  # run with kiln's kilnd, below
                continue
            if kind == "stock-warm":  # where stock's cold run left its cache
                results[kind].append(run_kind(kind, root / f"{number}-stock"))
                continue
            work = root / f"{number}-{kind}"
            work.mkdir()
            if kind in ("kiln-serial", "kiln"):
                kilnd = Kilnd(bundle, work)
                results[kind].append(run_kind(kind, work, kilnd=kilnd))
                if kind == "kiln" and "kiln-warm" in kinds:
                    warm = work.parent / f"{number}-kiln-warm"
                    warm.mkdir()
                    results["kiln-warm"].append(run_kind("kiln-warm", warm, kilnd=kilnd))
                # compile: N run by workers, ...; workers: N started, ...
                print(f"  {kind}'s kilnd: " + "; ".join(kilnd.stats().splitlines()[4:6]))
                kilnd.stop()
            else:
                results[kind].append(run_kind(kind, work))
        print(f"round {number + 1}: " + ", ".join(
            f"{kind} {results[kind][-1]['seconds']:.2f} s (benchmarks {results[kind][-1]['benchmark_seconds']:.2f})"
            for kind in kinds))

    stock = statistics.median(r["seconds"] for r in results["stock"])
    print(f"\ncores: {os.cpu_count()}, threads for stock-threads: {options.threads}, rounds: {options.rounds}, "
          f"TRITON_CACHE_AUTOTUNING: {int(options.cache_autotuning)}")
    for kind in kinds:
        seconds = statistics.median(r["seconds"] for r in results[kind])
        print(f"{kind:14s} {seconds:7.2f} s  {seconds / stock:5.2f}x stock")
    every = [r for kind in kinds for r in results[kind]]
    print("all correct:", all(r["correct"] for r in every))
    for name in ("gemm_best", "normalize_best"):
        chosen = {kind: sorted({r[name] for r in results[kind]}) for kind in kinds}
        print(f"{name}: " + "; ".join(f"{kind}: {' | '.join(configs)}" for kind, configs in chosen.items()))
    for kind in kinds:
        if "timeline" in results[kind][0]:
            print(f"\ntimeline of {kind}, first round (s from the first call):")
            for what, begun, ended in results[kind][0]["timeline"]:
                print(f"  {begun:6.3f} {ended:6.3f}  {what}")
    # How near the choice is: where the fastest configs lie within the
    # benchmarks' own noise, stock's runs may choose differently too.
    for name in ("gemm_top", "normalize_top"):
        print(f"{name}, ms, first round: " + "; ".join(f"{kind}: {', '.join(results[kind][0][name])}" for kind in kinds))


if __name__ == "__main__":
    main()
