"""Per-kernel time to a launchable kernel in a fresh process: through kilnd vs
stock Triton, cold (nothing cached) and warm (stock: its file cache populated;
kilnd: its cache populated, the client's local files absent, then present).
Warm runs take a few milliseconds per kernel, within the noise of one process,
so they are repeated (--rounds, interleaved) and each kernel's median is shown.
Run on the GPU machine (see README):

  python3 bench/gpu_bench.py gpu_bundle [--rounds 3] [--phases] [--cold-phases N] [--simultaneous]

--phases also shows where the warm runs spend their time (gpu_bench_client.py),
--cold-phases N where cold runs do, over N more rounds of a stock cold run and a
Kiln cold run against a fresh kilnd (medians). --simultaneous runs each round's
three warm runs at once, one CPU each, and also compares them round by round:
the machine's speed moves whole runs by 10-20% from one moment to the next,
more than the difference measured. The runs of a round shift the garbage
collector's count by the same amount after their first kernel, a different
amount in each round, so its pauses fall on different kernels from round to
round (collector_pauses.py).
"""

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import hermetic  # noqa: E402  (tests/hermetic.py)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))

from gpu_bundle import install_client  # noqa: E402
from simultaneous_runs import cpu_shares, start_on  # noqa: E402

from collector_pauses import round_shift  # noqa: E402  (beside this file)

CLIENT = Path(__file__).resolve().parent / "gpu_bench_client.py"


# Every order of the three kinds, one per round in turn, so each kind takes
# each place as often: in runs one after another, a place in the round moved
# a kind's kernels by up to 20% (absent, always before present in an earlier
# design, came out 1.01x stock while present came out 0.79x).
ORDERS = tuple(itertools.permutations(("stock", "absent", "present")))


# The runs whose one-time figures are shown, each with the run it is compared to.
SHOWN_BESIDE_STOCK = (("stock cold", None), ("kiln cold", "stock cold"), ("stock", None), ("absent", "stock"),
                      ("present", "stock"))


_called_kilnd = []  # warm runs that made a call to kilnd (imported gRPC), by kind
_triton_key_ms = {}  # kind of run -> [ms of each run's triton_key()]
_to_first_kernel_ms = {}  # kind of run -> [ms from each run's launch to its first kernel launchable]
_collector_ms = {}  # kind of run -> [{kernel: ms the garbage collector ran in it} of each run]
_objects = {}  # kind of run -> [{kernel: objects it left for the collector to count} of each run]


def launch(env, *flags, cpus=None, round_=0):
    """Starts one timed process, on the CPUs `cpus` alone if given, with the
    collector's pauses placed as in the other runs of round `round_`."""
    phase = ["--collector-phase", str(round_shift(round_))]
    # CLOCK_MONOTONIC is the system's: the process reads the same clock.
    env = dict(env, GPU_BENCH_LAUNCHED_NS=str(time.monotonic_ns()))
    return start_on(cpus, [sys.executable, str(CLIENT), *flags, *phase], env)


def collect(process, env, kind=None, key_label=None):
    """The kernel times of a process launch() started; `kind` for a warm run,
    `key_label` where its triton_key() time is shown."""
    stdout, stderr = process.communicate()
    if process.returncode != 0:
        sys.exit(stderr[-3000:])
    report = json.loads(stdout.splitlines()[-1])
    if report["kiln_used"] != (env.get("KILN") == "1"):
        # A client missing from this Python would make every "kiln" figure stock's.
        sys.exit(f"a {'Kiln' if env.get('KILN') == '1' else 'stock'} run was "
                 f"{'served by Kiln' if report['kiln_used'] else 'not served by Kiln'}: is the client "
                 f"wheel installed for {sys.executable}?")
    if kind and report["grpc_imported"]:
        _called_kilnd.append(kind)
    if key_label:
        _triton_key_ms.setdefault(key_label, []).append(report["triton_key_ms"])
        _to_first_kernel_ms.setdefault(key_label, []).append(report["to_first_kernel_ms"])
        _collector_ms.setdefault(key_label, []).append(report["collector_ms"])
        _objects.setdefault(key_label, []).append(report["objects"])
    return report["kernels"]


def run(env, *flags, kind=None, label=None, round_=0):
    """Times one process; `kind` for a warm run, `label` for another whose
    triton_key() is shown (not where flags wrap Triton's steps in timers)."""
    return collect(launch(env, *flags, round_=round_), env, kind, key_label=None if flags else kind or label)


def simultaneous_round(envs, round_):
    """One warm run of each kind, all at once, each on a CPU of its own (the
    kinds take turns on the CPUs): runs in the same moments share the machine's
    state, which moved whole runs by 10-20% between moments."""
    shares = cpu_shares(list(envs), round_, per_kind=1)
    processes = {kind: launch(env, cpus=shares[kind], round_=round_) for kind, env in envs.items()}
    return {kind: collect(process, envs[kind], kind, key_label=kind) for kind, process in processes.items()}


def paired_ratios(warm_runs, kind):
    """kernel -> the median over rounds of that round's kind/stock ratio, and
    how many rounds had the kind at most as slow as stock."""
    ratios = {}
    for name in warm_runs["stock"][0]:
        per_round = [run[name] / stock[name] for run, stock in zip(warm_runs[kind], warm_runs["stock"])]
        ratios[name] = (statistics.median(per_round), sum(r <= 1.0 for r in per_round))
    return ratios


def without_collector(warm_runs):
    """The warm runs' kernel times less the garbage collector's pauses in each."""
    return {kind: [{name: ms - collected[name] for name, ms in run.items()}
                   for run, collected in zip(runs, _collector_ms[kind])]
            for kind, runs in warm_runs.items()}


def summed(kernels, skip=None):
    """The sum of a figure over a run's kernels, but `skip` (the first: each process's one-time costs)."""
    return sum(ms for name, ms in kernels.items() if name != skip)


def median_run(runs):
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]}


def median_phases(runs, skip):
    """phase -> the sum over kernels (but `skip`) of each kernel's median ms."""
    phases = {phase for run in runs for times in run.values() for phase in times}
    return {phase: sum(statistics.median(run[name].get(phase, 0.0) for run in runs)
                       for name in runs[0] if name != skip) for phase in phases}


def start_kilnd(bundle, base, data_dir, socket, log=None):
    """A kilnd of the bundle with an empty cache, and the environment of its clients;
    with `log` (a file), it logs there from the info level up."""
    lib_env = dict(base, LD_LIBRARY_PATH=str(bundle / "lib"))
    kilnd = subprocess.Popen([str(bundle / "kilnd"), f"--data-dir={data_dir}", f"--local-socket={socket}",
                              f"--toolchain={sys.executable}", f"--log-level={'info' if log else 'warn'}"],
                             env=lib_env, stdout=log, stderr=subprocess.STDOUT if log else None)
    subprocess.run([str(bundle / "kiln"), "--endpoint", f"unix:{socket}", "health", "--wait", "60"],
                   env=lib_env, check=True, stdout=subprocess.DEVNULL)
    return kilnd, dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{socket}")


def cold_phases(bundle, base, work, rounds, skip):
    """Phases of cold runs, stock and Kiln, each against empty caches (a fresh kilnd
    for every Kiln run): summed over the kernels after the first, and of the first."""
    runs = {"stock": [], "kiln": []}
    for round_ in range(rounds):
        runs["stock"].append(run(dict(base, TRITON_CACHE_DIR=str(work / f"cs-{round_}")), "--cold-phases",
                                 round_=round_))
        kilnd, kiln_env = start_kilnd(bundle, base, work / f"cd-{round_}", work / f"cs{round_}")
        try:
            runs["kiln"].append(run(dict(kiln_env, TRITON_CACHE_DIR=str(work / f"ck-{round_}"),
                                         KILN_FILES_DIR=str(work / f"cf-{round_}")), "--cold-phases",
                                     round_=round_))
        finally:
            kilnd.terminate()
            kilnd.wait()
    return ({kind: median_phases(kind_runs, skip) for kind, kind_runs in runs.items()},
            {kind: first_kernel_phases(kind_runs, skip) for kind, kind_runs in runs.items()}, runs)


def first_kernel_phases(runs, first):
    """phase -> the median ms of the first kernel, which pays each process's one-time costs."""
    phases = {phase for run in runs for phase in run[first]}
    return {phase: statistics.median(run[first].get(phase, 0.0) for run in runs) for phase in phases}


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phases", action="store_true", help="also time the steps of the warm runs")
    parser.add_argument("--cold-phases", type=int, default=0, metavar="N",
                        help="also time the steps of cold runs, over N more rounds")
    parser.add_argument("--simultaneous", action="store_true",
                        help="run each round's warm runs at once, one CPU each, and compare them round by round")
    parser.add_argument("--dump", type=Path, metavar="FILE",
                        help="also write every run's figures (warm runs, their collector pauses and phases, by kind) "
                             "to FILE as JSON, and those of --cold-phases to FILE with the suffix .cold.json")
    args = parser.parse_args()
    bundle = args.bundle.resolve()
    install_client(bundle)
    work = Path(tempfile.mkdtemp(prefix="kiln-gpu-bench-"))
    base = hermetic.stock_env()
    stock_env = dict(base, TRITON_CACHE_DIR=str(work / "stock"))
    stock_cold = run(stock_env, label="stock cold")
    first = next(iter(stock_cold))

    kilnd, kiln_env = start_kilnd(bundle, base, work / "data", work / "s")
    warm_runs = {"stock": [], "absent": [], "present": []}
    phase_runs = {"stock": [], "absent": [], "present": []}
    try:
        kiln_cold = run(dict(kiln_env, TRITON_CACHE_DIR=str(work / "k1"), KILN_FILES_DIR=str(work / "f1")),
                        label="kiln cold")
        present_env = dict(kiln_env, TRITON_CACHE_DIR=str(work / "kp"), KILN_FILES_DIR=str(work / "fp"))
        run(present_env)  # its files present from now on

        def absent_env(round_):
            """A new process, venv or container: the client's files absent."""
            return dict(kiln_env, TRITON_CACHE_DIR=str(work / f"k2-{round_}"),
                        KILN_FILES_DIR=str(work / f"f2-{round_}"))

        for round_ in range(args.rounds if args.simultaneous else 0):
            for kind, kernels in simultaneous_round(
                    {"stock": stock_env, "absent": absent_env(round_), "present": present_env}, round_).items():
                warm_runs[kind].append(kernels)
        for round_ in range(0 if args.simultaneous else args.rounds):
            envs = {"stock": stock_env, "absent": absent_env(round_),
                    "present": present_env}  # the same program again: its files present
            order = ORDERS[round_ % len(ORDERS)]
            for kind in order:
                warm_runs[kind].append(run(envs[kind], kind=kind, round_=round_))
            if args.phases:  # apart from the timed runs, which the wrappers slow
                envs["absent"] = dict(envs["absent"], TRITON_CACHE_DIR=str(work / f"k3-{round_}"),
                                      KILN_FILES_DIR=str(work / f"f3-{round_}"))
                for kind in order:
                    phase_runs[kind].append(run(envs[kind], "--phases", kind=kind, round_=round_))
    finally:
        kilnd.terminate()
        kilnd.wait()
    stock_warm, kiln_warm, kiln_local = (median_run(warm_runs[k]) for k in ("stock", "absent", "present"))
    if args.dump:
        args.dump.write_text(json.dumps({"cold": {"stock": stock_cold, "kiln": kiln_cold}, "warm": warm_runs,
                                         "collector": _collector_ms, "objects": _objects, "phases": phase_runs}))

    print(f"warm: median of {args.rounds} rounds")
    print(f"{'kernel':28} {'stock cold':>10} {'kiln cold':>10} {'ratio':>6} | {'stock warm':>10} "
          f"{'kiln absent':>11} {'ratio':>6} {'kiln present':>12} {'ratio':>6}   (ms to a launchable kernel)")
    for name in stock_cold:
        print(f"{name:28} {stock_cold[name]:10.1f} {kiln_cold[name]:10.1f} {kiln_cold[name] / stock_cold[name]:6.2f} | "
              f"{stock_warm[name]:10.1f} {kiln_warm[name]:11.1f} {kiln_warm[name] / stock_warm[name]:6.2f} "
              f"{kiln_local[name]:12.1f} {kiln_local[name] / stock_warm[name]:6.2f}")
    for label, skip in (("total", None), ("after the first", first)):
        totals = [summed(d, skip) for d in (stock_cold, kiln_cold, stock_warm, kiln_warm, kiln_local)]
        print(f"{label:28} {totals[0]:10.1f} {totals[1]:10.1f} {totals[1] / totals[0]:6.2f} | "
              f"{totals[2]:10.1f} {totals[3]:11.1f} {totals[3] / totals[2]:6.2f} {totals[4]:12.1f} "
              f"{totals[4] / totals[2]:6.2f}")

    if args.simultaneous:
        bare = without_collector(warm_runs)
        ratios = {(kind, runs is bare): paired_ratios(runs, kind) for kind in ("absent", "present")
                  for runs in (warm_runs, bare)}
        print(f"\nwarm, paired by round (runs at once): median of the {args.rounds} rounds' ratios to stock, "
              f"and the rounds at most as slow as stock; then the same without the garbage collector's pauses")
        for name in stock_cold:
            print(f"{name:28}" + "".join(
                f" {kind} {ratios[kind, bare_][name][0]:5.2f} ({ratios[kind, bare_][name][1]:2}/{args.rounds})"
                for bare_ in (False, True) for kind in ("absent", "present")))
        for kind in ("absent", "present"):
            for label, runs in (("", warm_runs), (", without the collector", bare)):
                after_first = [summed(run, first) / summed(stock, first)
                               for run, stock in zip(runs[kind], runs["stock"])]
                print(f"after the first kernel, {kind}{label}: median ratio {statistics.median(after_first):.3f}, "
                      f"{sum(r <= 1.0 for r in after_first)}/{args.rounds} rounds at most as slow as stock")
        for kind in ("stock", "absent", "present"):
            paused = [summed(collected, first) for collected in _collector_ms[kind]]
            print(f"garbage collector after the first kernel, {kind}: median {statistics.median(paused):.2f} ms "
                  f"a run; pauses on {statistics.median(sum(ms > 0 for ms in run.values()) for run in _collector_ms[kind]):.0f} "
                  f"kernels; objects counted towards its pauses: median "
                  f"{statistics.median(summed(made, first) for made in _objects[kind]):.0f} a run")
    print("\nonce per process, before its first kernel: triton_key(), the hash of Triton's install (median ms; "
          "Kiln remembers it with its files and in the local kilnd, so it is computed again only where neither "
          "has it)")
    for kind, stock_kind in SHOWN_BESIDE_STOCK:
        if kind in _triton_key_ms:
            ms = statistics.median(_triton_key_ms[kind])
            ratio = f"  ratio {ms / statistics.median(_triton_key_ms[stock_kind]):.2f}x" if stock_kind else ""
            print(f"{kind:28} {ms:10.1f}{ratio}")
    paired_note = "; paired by round: the median of the rounds' ratios to stock, and the rounds at most as slow"
    print("\nfrom a process's launch to its first kernel launchable (interpreter, imports, triton_key(), the first "
          "kernel: what a program waits for; median ms)" + (paired_note if args.simultaneous else ""))
    for kind, stock_kind in SHOWN_BESIDE_STOCK:
        if kind in _to_first_kernel_ms:
            ms = statistics.median(_to_first_kernel_ms[kind])
            line = f"{kind:28} {ms:10.1f}"
            if stock_kind:
                line += f"  ratio {ms / statistics.median(_to_first_kernel_ms[stock_kind]):.2f}x"
            if stock_kind == "stock" and args.simultaneous:
                paired = [launch_ms / stock
                          for launch_ms, stock in zip(_to_first_kernel_ms[kind], _to_first_kernel_ms["stock"])]
                line += f"  paired {statistics.median(paired):.2f}x ({sum(r <= 1.0 for r in paired)}/{len(paired)})"
            print(line)
    kiln_calls = [kind for kind in _called_kilnd if kind != "stock"]
    print(f"warm kiln runs that called kilnd (imported gRPC): {len(kiln_calls)} of "
          f"{2 * args.rounds * (2 if args.phases else 1)}")
    if args.phases:
        by_kind = {kind: median_phases(runs, first) for kind, runs in phase_runs.items()}
        print(f"\nwarm, after the first kernel, by phase (ms, sum of per-kernel medians of {args.rounds} rounds)")
        print(f"{'phase':28} {'stock':>10} {'kiln absent':>11} {'kiln present':>12}")
        for phase in sorted(by_kind["stock"], key=lambda p: p == "total"):
            print(f"{phase:28} {by_kind['stock'][phase]:10.3f} {by_kind['absent'].get(phase, 0):11.3f} "
                  f"{by_kind['present'].get(phase, 0):12.3f}")


    if args.cold_phases:
        after_first, of_first, cold_runs = cold_phases(bundle, base, work, args.cold_phases, first)
        if args.dump:
            args.dump.with_suffix(".cold.json").write_text(json.dumps(cold_runs))
        print(f"\ncold by phase (ms, medians of {args.cold_phases} rounds; after the first kernel: the sum "
              f"of per-kernel medians)")
        print(f"{'phase':28} {'stock first':>11} {'kiln first':>10} | {'stock after':>11} {'kiln after':>10}")
        phases = set(after_first["stock"]) | set(after_first["kiln"]) | set(of_first["stock"]) | set(of_first["kiln"])
        for phase in sorted(phases, key=lambda p: (p == "total", p)):
            print(f"{phase:28} {of_first['stock'].get(phase, 0):11.1f} {of_first['kiln'].get(phase, 0):10.1f} | "
                  f"{after_first['stock'].get(phase, 0):11.1f} {after_first['kiln'].get(phase, 0):10.1f}")


if __name__ == "__main__":
    main()
