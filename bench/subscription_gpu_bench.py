"""A first run already warm through a subscription: bench/autotune_program.py
(a GEMM of 16 autotuned configs and a normalization of 8, the autotuner's
timings cached: TRITON_CACHE_AUTOTUNING=1) recorded in one kilnd, exported
into a directory that fresh kilnds subscribe to (bundle_sources), then run
from a fresh process against each. Rounds interleave:

  stock            stock Triton, an empty cache
  kiln-record      Kiln against a fresh kilnd: the recording (round 1's is exported, signed)
  kiln-warm        a fresh process against that kilnd (its local files absent)
  subscribed       a fresh kilnd with empty data, subscribed, trusting the publisher's key
  subscribed-untrusted   the same, trusting no key: kilnd compiles every kernel at import

With --program deep the program is bench/inductor_program.py's training step
of torch.compile (about 60 kernels; inductor's pool of compile processes, as
stock runs it, which points Triton at torch's ptxas).

Each subscribed kilnd is started, and the program run once it reports the
import, so the figure is the program's first call. Prints each kind's median
from the first call to both results and its ratio to stock, how many
compiles and launcher builds each subscribed kilnd ran during the program
(0 expected: the import builds the launchers ahead), the import's own time,
and whether every result was correct. Run on the GPU
machine:

  python3 bench/subscription_gpu_bench.py gpu_bundle [--rounds 3] [--program autotune|deep]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import autotune_gpu_bench  # noqa: E402  (beside this file)
import inductor_gpu_bench  # noqa: E402
from autotune_gpu_bench import Kilnd, prepare  # noqa: E402

KINDS = ("stock", "kiln-record", "kiln-warm", "subscribed", "subscribed-untrusted")


def run_autotune(kind, work, kilnd=None):
    return autotune_gpu_bench.run(kind, work, 16, True, kilnd=kilnd)


def run_deep(kind, work, kilnd=None):
    # Inductor's defaults (its pool), as stock and Kiln's users run it.
    measured = inductor_gpu_bench.run("stock-pool" if kilnd is None else "kiln-pool", work, "deep", kilnd=kilnd)
    return dict(measured, seconds=measured["first_call_s"])


PROGRAMS = {"autotune": run_autotune, "deep": run_deep}


def compiles(kilnd):
    return int(re.search(r"compile: +(\d+) run by workers", kilnd.stats()).group(1))


def launchers_built(stats):
    return int(re.search(r"launchers: (\d+) built", stats).group(1))


def wait_for_import(kilnd, shelf, seconds=600):
    """Seconds until kilnd reports the shelf's bundle imported and the
    launchers it brought recipes for built (as a subscription that ran
    before the program did has)."""
    started = time.monotonic()
    while True:
        stats = kilnd.stats()
        ahead = re.search(r"(\d+) launchers to build", stats)
        if f"bundle source {shelf}: 1 of 1 files" in stats and ahead and launchers_built(stats) >= int(ahead.group(1)):
            return time.monotonic() - started
        if time.monotonic() - started > seconds:
            raise SystemExit(f"no import within {seconds} s:\n{stats}")
        time.sleep(0.05)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--program", choices=sorted(PROGRAMS), default="autotune")
    options = parser.parse_args()
    run = PROGRAMS[options.program]
    bundle, root = prepare(options.bundle, "kiln-subscription-")
    shelf = root / "shelf"
    shelf.mkdir()
    key, public = root / "publisher.pem", root / "publisher.pub.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(public)], check=True)
    results = {kind: [] for kind in KINDS}
    during = {"subscribed": [], "subscribed-untrusted": []}  # compiles kilnd ran while the program ran
    import_seconds = {"subscribed": [], "subscribed-untrusted": []}
    for number in range(options.rounds):
        work = root / f"{number}-stock"
        work.mkdir()
        results["stock"].append(run("stock", work))

        work = root / f"{number}-kiln-record"
        work.mkdir()
        recorder = Kilnd(bundle, work)
        results["kiln-record"].append(run("kiln", work, kilnd=recorder))
        warm = root / f"{number}-kiln-warm"
        warm.mkdir()
        results["kiln-warm"].append(run("kiln-warm", warm, kilnd=recorder))
        if number == 0:
            exported = subprocess.run([str(bundle / "kiln"), "export", str(shelf / f"{options.program}.kilnbundle"),
                                       "--sign", str(key)], env=recorder.env, capture_output=True, text=True)
            if exported.returncode != 0:
                raise SystemExit(exported.stderr)
            print("  " + exported.stdout.strip())
        recorder.stop()

        for kind, trust in (("subscribed", [f"--trusted-bundle-keys={public}"]), ("subscribed-untrusted", [])):
            work = root / f"{number}-{kind}"
            work.mkdir()
            node = Kilnd(bundle, work, f"--bundle-sources={shelf}", *trust)
            import_seconds[kind].append(wait_for_import(node, shelf))
            before, built_before = compiles(node), launchers_built(node.stats())
            results[kind].append(run("kiln", work, kilnd=node))
            during[kind].append((compiles(node) - before, launchers_built(node.stats()) - built_before))
            if number == 0:
                print(f"  {kind}: " + "; ".join(line.strip() for line in node.stats().splitlines()
                                               if "imported" in line or "bundle source" in line
                                               or "launchers:" in line or "refused" in line))
            node.stop()
        print(f"round {number + 1}: " + ", ".join(f"{kind} {results[kind][-1]['seconds']:.2f} s" for kind in KINDS))

    stock = statistics.median(r["seconds"] for r in results["stock"])
    warm = statistics.median(r["seconds"] for r in results["kiln-warm"])
    print(f"\nGPU: {subprocess.run(['nvidia-smi', '--query-gpu=name', '--format=csv,noheader'], capture_output=True, text=True).stdout.strip()}, "
          f"cores: {os.cpu_count()}, rounds: {options.rounds}, program: {options.program}")
    for kind in KINDS:
        seconds = statistics.median(r["seconds"] for r in results[kind])
        print(f"{kind:22s} {seconds:7.3f} s  {seconds / stock:5.2f}x stock  {seconds / warm:5.2f}x kiln-warm")
    for kind, counts in during.items():
        print(f"{kind}: (kilnd compiles, launcher builds) during the program {counts}; import and launchers took "
              f"{', '.join(f'{s:.1f}' for s in import_seconds[kind])} s")
    print("all correct:", all(r["correct"] for kind in KINDS for r in results[kind]))


if __name__ == "__main__":
    main()
