"""torch.compile warm starts through kilnd, on the GPU machine:

  python3 tests/gpu/inductor_warm.py gpu_bundle [--repeat N [--simultaneous]]

Runs, each in a fresh process: stock cold and stock fully warm (the same local
inductor and Triton caches again); process A through kilnd with empty local
caches; process B through kilnd with fresh empty local caches (warm only in
kilnd); a wider model through kilnd (must miss and be correct); and with kilnd
stopped (stock behaviour, one warning). With --repeat, the warm runs (stock
fully warm, B with fresh empty local caches, B again with its local caches
present) are repeated N times, interleaved, and their medians compared; with
--simultaneous, the three run at once in each of N rounds, each on a third of
the CPUs, and are also compared round by round."""

import argparse
import statistics

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hermetic  # noqa: E402  (tests/hermetic.py)

from gpu_bundle import install_client
from simultaneous_runs import cpu_shares, start_on

HERE = Path(__file__).resolve().parent
ORDERS = (("stock", "kiln", "kiln, local files present"), ("kiln", "stock", "kiln, local files present"),
          ("kiln", "kiln, local files present", "stock"))


def launch(env, *args, cpus=None):
    """Starts inductor_program.py, on the CPUs `cpus` alone if given."""
    return start_on(cpus, [sys.executable, str(HERE / "inductor_program.py"), *args], env)


def collect(process):
    stdout, stderr = process.communicate()
    if process.returncode != 0:
        sys.exit(stderr[-4000:])
    return json.loads(stdout.splitlines()[-1]), stderr


def run(env, *args):
    return collect(launch(env, *args))


def simultaneous_round(envs, round_):
    """One run of each kind at once, each on a third of the CPUs (the kinds take
    turns on them): runs in the same moments share the machine's state, which
    moved single runs by 30% between moments."""
    shares = cpu_shares(list(envs), round_)
    processes = {kind: launch(env, cpus=shares[kind]) for kind, env in envs.items()}
    return {kind: collect(process)[0] for kind, process in processes.items()}


def fresh(env, work, name):
    return dict(env, TORCHINDUCTOR_CACHE_DIR=str(work / name / "inductor"),
                TRITON_CACHE_DIR=str(work / name / "triton"), KILN_FILES_DIR=str(work / name / "files"))


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--simultaneous", action="store_true",
                        help="run each repeat's three warm runs at once, a third of the CPUs each, and compare "
                             "them round by round")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="also profile the first calls of one more stock fully warm run, B run and B "
                             "run again (its local files present), into DIR/{stock,kiln,kiln-present}.<model>.txt")
    args = parser.parse_args()
    bundle = args.bundle.resolve()
    install_client(bundle)
    work = Path(tempfile.mkdtemp(prefix="kiln-inductor-"))
    base = hermetic.stock_env("TORCHINDUCTOR")
    stock_env = fresh(base, work, "stock")
    stock_cold, _ = run(stock_env)
    stock_warm, _ = run(stock_env)

    lib_env = dict(base, LD_LIBRARY_PATH=str(bundle / "lib"))
    socket = work / "kilnd.sock"
    kilnd = subprocess.Popen([str(bundle / "kilnd"), f"--data-dir={work / 'data'}", f"--local-socket={socket}",
                              f"--toolchain={sys.executable}", "--log-level=warn"], env=lib_env)
    subprocess.run([str(bundle / "kiln"), "--endpoint", f"unix:{socket}", "health", "--wait", "60"], env=lib_env,
                   check=True, stdout=subprocess.DEVNULL)
    kiln_env = dict(base, KILN="1", KILN_ENDPOINT=f"unix:{socket}")
    try:
        a, _ = run(fresh(kiln_env, work, "a"))
        stats_a = subprocess.run([str(bundle / "kiln"), "--endpoint", f"unix:{socket}", "stats", "--json"],
                                 env=lib_env, capture_output=True, text=True).stdout
        b, _ = run(fresh(kiln_env, work, "b"))
        stats_b = subprocess.run([str(bundle / "kiln"), "--endpoint", f"unix:{socket}", "stats", "--json"],
                                 env=lib_env, capture_output=True, text=True).stdout
        wider, _ = run(fresh(kiln_env, work, "wider"), "--wider")
        repeats = {"stock": [stock_warm], "kiln": [b], "kiln, local files present": []}
        if args.simultaneous:
            repeats = {kind: [] for kind in repeats}
            present_env = fresh(kiln_env, work, "present")
            run(present_env)  # its local caches present from now on
        for i in range(args.repeat if args.simultaneous else 0):
            envs = {"stock": stock_env, "kiln": fresh(kiln_env, work, f"b{i}"),
                    "kiln, local files present": present_env}
            for kind, result in simultaneous_round(envs, i).items():
                repeats[kind].append(result)
        for i in range(0 if args.simultaneous else args.repeat - 1):
            # Each kind takes each place in turn (fresh local caches always before
            # present): a fixed order lets one kind always follow another.
            envs = {"stock": stock_env, "kiln": fresh(kiln_env, work, f"b{i}")}
            envs["kiln, local files present"] = envs["kiln"]
            for kind in ORDERS[i % len(ORDERS)]:
                repeats[kind].append(run(envs[kind])[0])
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            run(stock_env, "--profile", str(args.profile / "stock"))
            run(fresh(kiln_env, work, "profiled"), "--profile", str(args.profile / "kiln"))
            run(fresh(kiln_env, work, "profiled"), "--profile", str(args.profile / "kiln-present"))
    finally:
        kilnd.terminate()
        kilnd.wait()
    stopped, stopped_err = run(fresh(kiln_env, work, "stopped"))

    def line(label, result):
        print(f"{label:34} transformer {result['transformer']['first_call_s']:6.2f} s "
              f"({'ok' if result['transformer']['allclose'] else 'WRONG'}), "
              f"mlp {result['mlp']['first_call_s']:6.2f} s ({'ok' if result['mlp']['allclose'] else 'WRONG'}); "
              f"inductor {result['inductor']}")

    line("stock, cold", stock_cold)
    line("stock, fully warm local caches", stock_warm)
    line("A: kilnd, empty local caches", a)
    line("B: kilnd warm, empty local caches", b)
    line("wider model through kilnd", wider)
    line("kilnd stopped", stopped)
    sa, sb = json.loads(stats_a), json.loads(stats_b)
    print(f"kilnd during B: {int(sb['hits']) - int(sa['hits'])} hits, {int(sb['misses']) - int(sa['misses'])} misses, "
          f"{int(sb['compiles']) - int(sa['compiles'])} kernel compiles")
    warnings = [l for l in stopped_err.splitlines() if "kiln:" in l]
    print(f"warnings with kilnd stopped: {len(warnings)}: {warnings[:2]}")
    ratio = b["transformer"]["first_call_s"] / stock_warm["transformer"]["first_call_s"]
    print(f"B / fully-warm local, transformer: {ratio:.2f}x")
    if args.repeat > 1:
        medians = {kind: {model: statistics.median(r[model]["first_call_s"] for r in runs)
                          for model in ("transformer", "mlp")} for kind, runs in repeats.items() if runs}
        for kind, median in medians.items():
            called = sum(r.get("kilnd_client_imported", False) for r in repeats[kind])
            print(f"median of {len(repeats[kind])}, {kind:26} transformer {median['transformer']:6.3f} s, "
                  f"mlp {median['mlp']:6.3f} s; ratio to stock "
                  f"{median['transformer'] / medians['stock']['transformer']:.2f}x / "
                  f"{median['mlp'] / medians['stock']['mlp']:.2f}x; called kilnd in {called}")
            print(f"  each run, transformer / mlp (s): "
                  + ", ".join(f"{r['transformer']['first_call_s']:.2f}/{r['mlp']['first_call_s']:.2f}"
                              for r in repeats[kind]))
    if args.simultaneous:
        print(f"paired by round (runs at once): median of the {args.repeat} rounds' ratios to stock, and the "
              f"rounds at most as slow as stock")
        for kind in ("kiln", "kiln, local files present"):
            for label, less in (("", 0), ("less the collector's pauses", 1)):
                line = f"  {kind:26}"
                for model in ("transformer", "mlp"):
                    def spent(run):
                        return run[model]["first_call_s"] - less * run[model]["collector_s"]

                    ratios = [spent(r) / spent(stock_run) for r, stock_run in zip(repeats[kind], repeats["stock"])]
                    line += (f" {model} {statistics.median(ratios):.2f}x "
                             f"({sum(ratio <= 1.0 for ratio in ratios)}/{len(ratios)})")
                print(line + (f" {label}" if label else ""))
        print("  the collector's pauses in each first call (median ms, transformer / mlp): " + ", ".join(
            f"{kind} {1e3 * statistics.median(r['transformer']['collector_s'] for r in runs):.1f} / "
            f"{1e3 * statistics.median(r['mlp']['collector_s'] for r in runs):.1f}"
            for kind, runs in repeats.items()))
    correct = all(r[m]["allclose"] for r in (a, b, wider, stopped) for m in ("transformer", "mlp"))
    print("PASS" if correct and ratio <= 1.5 and len(warnings) == 1 else "FAIL")


if __name__ == "__main__":
    main()
