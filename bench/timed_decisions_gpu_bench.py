"""Whether Kiln changes what torch.compile decides by timing, on the GPU:
bench/timed_decisions_program.py (pad_mm over a sequence of 333, inductor's
autotuned reductions) in rounds that alternate a cold stock run and a cold
Kiln run (a fresh kilnd, fresh caches, a fresh process each).

Reports the Triton kernels each run's graph loaded (their names) and the
config each chose, and compares every Kiln run with stock's: the same kernels
as every stock run, and stock's config for each kernel whose config stock
itself chose the same in every run. Then the median first call of each.

  python3 bench/timed_decisions_gpu_bench.py gpu_bundle [--rounds 5] [--out runs.json]
      [--sequence 333] [--mlp 2816] [--stock-only]
  python3 bench/timed_decisions_gpu_bench.py --report runs1.json runs2.json   (runs of several calls together)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from autotune_gpu_bench import Kilnd, prepare  # noqa: E402

PROGRAM = Path(__file__).resolve().with_name("timed_decisions_program.py")


def run(kind, work, shape, kilnd=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN", "TRITON_", "TORCHINDUCTOR_"))}
    env.update(TRITON_CACHE_DIR=str(work / "triton"), TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"),
               KILN_FILES_DIR=str(work / "files"), TIMED_SEQUENCE=str(shape[0]), TIMED_MLP=str(shape[1]))
    if kilnd is not None:
        env.update(KILN="1", KILN_STRICT="1", KILN_ENDPOINT=kilnd.env["KILN_ENDPOINT"])
    result = subprocess.run([sys.executable, str(PROGRAM)], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{result.stderr[-4000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]), kind=kind)


def report(runs):
    stock = [r for r in runs if r["kind"] == "stock"]
    kiln = [r for r in runs if r["kind"] == "kiln"]
    stock_names = {tuple(sorted(r["kernels"])) for r in stock}
    print(f"{len(stock)} stock runs, {len(kiln)} Kiln runs; stock's kernels: "
          f"{', '.join(str(len(names)) for names in stock_names)} "
          f"({'the same in every stock run' if len(stock_names) == 1 else 'they differ between stock runs'})")
    stable = {}
    for name in stock[0]["kernels"]:
        configs = {r["kernels"].get(name) for r in stock}
        if len(configs) == 1:
            stable[name] = configs.pop()
    print(f"kernels whose config stock chose the same in every run: {len(stable)} of {len(stock[0]['kernels'])}")
    for names in stock_names:
        print(f"  a stock kernel set: {', '.join(names)}")
    if not kiln:
        return
    all_same = True
    for number, r in enumerate(kiln):
        names_same = tuple(sorted(r["kernels"])) in stock_names
        differing = [name for name, config in stable.items() if r["kernels"].get(name) != config]
        all_same &= names_same and not differing
        print(f"  kiln run {number}: {len(r['kernels'])} kernels ({'stock' if names_same else 'NOT stock'}'s), "
              f"pattern matches {r['pattern_matches']} (stock: {sorted({s['pattern_matches'] for s in stock})}), "
              f"configs differing from stock's stable ones: {differing or 'none'}")
    print(f"every Kiln run generated stock's kernels and chose stock's stable configs: {all_same}")
    for kind, kind_runs in (("stock", stock), ("kiln", kiln)):
        print(f"  {kind}: first call median {statistics.median(r['first_call_s'] for r in kind_runs):.2f} s "
              f"(runs {', '.join(str(r['first_call_s']) for r in kind_runs)}), all correct: "
              f"{all(r['correct'] for r in kind_runs)}")
    print(f"  ratio kiln / stock: {statistics.median(r['first_call_s'] for r in kiln) / statistics.median(r['first_call_s'] for r in stock):.2f}x")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", type=Path, nargs="?")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", type=Path, nargs="+")
    parser.add_argument("--sequence", type=int, default=333, help="the program's sequence length")
    parser.add_argument("--mlp", type=int, default=2816, help="the width of its MLP")
    parser.add_argument("--stock-only", action="store_true",
                        help="stock runs alone: whether stock is itself stable on this shape")
    options = parser.parse_args()
    shape = (options.sequence, options.mlp)
    if options.report:
        report([r for path in options.report for r in json.loads(path.read_text())])
        return
    bundle, root = prepare(options.bundle, "kiln-timed-")
    runs = []
    for number in range(options.rounds):
        work = root / f"{number}-stock"
        work.mkdir()
        runs.append(run("stock", work, shape))
        print(f"round {number}: stock {runs[-1]['first_call_s']} s, {len(runs[-1]['kernels'])} kernels, "
              f"pattern matches {runs[-1]['pattern_matches']}", flush=True)
        if options.stock_only:
            continue
        work = root / f"{number}-kiln"
        work.mkdir()
        kilnd = Kilnd(bundle, work)
        try:
            runs.append(run("kiln", work, shape, kilnd))
        finally:
            kilnd.stop()
        print(f"round {number}: kiln {runs[-1]['first_call_s']} s, {len(runs[-1]['kernels'])} kernels, "
              f"pattern matches {runs[-1]['pattern_matches']}", flush=True)
    if options.out:
        options.out.write_text(json.dumps(runs))
    report(runs)


if __name__ == "__main__":
    main()
