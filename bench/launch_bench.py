"""Launch overhead on the GPU machine: the CPU time of launching a small kernel
through Triton's JIT, with stock's launcher module and with the one kilnd built
(its compiler: `launcher_cc`, or the first of tcc, gcc, clang found), each in
fresh processes, interleaved over --rounds, medians compared. Also prints
which compiler kilnd used.

  python3 bench/launch_bench.py gpu_bundle [--rounds 5] [--launches 20000]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import hermetic  # noqa: E402  (tests/hermetic.py)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))

from gpu_bench import start_kilnd  # noqa: E402  (beside this file)
from gpu_bundle import install_client  # noqa: E402

PROGRAM = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
import kernel_suite
launches = int(sys.argv[2])
n = 1024
x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
out = torch.empty_like(x)
kernel = kernel_suite.add_kernel
kernel[(1,)](x, y, out, n, BLOCK=1024)  # compiled or loaded, and its launcher
torch.cuda.synchronize()
assert torch.allclose(out, x + y)
best = None
for _ in range(5):
    start = time.perf_counter()
    for _ in range(launches):
        kernel[(1,)](x, y, out, n, BLOCK=1024)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    best = elapsed if best is None else min(best, elapsed)
print(json.dumps({"us_per_launch": best / launches * 1e6, "kiln_used": "kiln._cache" in sys.modules}))
"""


def run(env, launches):
    result = subprocess.run([sys.executable, "-c", PROGRAM, str(Path(__file__).resolve().parents[1] / "tests" / "python"),
                             str(launches)], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(result.stderr[-3000:])
    report = json.loads(result.stdout.splitlines()[-1])
    if report["kiln_used"] != (env.get("KILN") == "1"):
        sys.exit("a run did not use Kiln as asked: is the client installed for this Python?")
    return report["us_per_launch"]


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--launches", type=int, default=20000)
    args = parser.parse_args()
    bundle = args.bundle.resolve()
    install_client(bundle)
    work = Path(tempfile.mkdtemp(prefix="kiln-launch-bench-"))
    base = hermetic.stock_env()
    log = open(work / "kilnd.log", "w")
    kilnd, kiln_env = start_kilnd(bundle, base, work / "data", work / "kilnd.sock", log=log)
    try:
        envs = {"stock": dict(base, TRITON_CACHE_DIR=str(work / "stock")),
                "kiln": dict(kiln_env, TRITON_CACHE_DIR=str(work / "kiln"), KILN_FILES_DIR=str(work / "files"))}
        for env in envs.values():
            run(env, 10)  # builds the kernel and its launcher: every timed run is warm
        times = {kind: [] for kind in envs}
        for round_ in range(args.rounds):
            for kind in (("stock", "kiln") if round_ % 2 == 0 else ("kiln", "stock")):
                times[kind].append(run(envs[kind], args.launches))
    finally:
        kilnd.terminate()
        kilnd.wait()
        log.close()
    compilers = [line.split("launcher builds may use ", 1)[1].strip()
                 for line in (work / "kilnd.log").read_text().splitlines() if "launcher builds may use " in line]
    stock, kiln = statistics.median(times["stock"]), statistics.median(times["kiln"])
    print(f"JIT launch of a small kernel, CPU microseconds per launch (best of 5 x {args.launches} in each of "
          f"{args.rounds} fresh processes, median):")
    print(f"  stock launcher          {stock:7.2f} us   {' '.join(f'{t:.2f}' for t in times['stock'])}")
    print(f"  kilnd's launcher        {kiln:7.2f} us   {' '.join(f'{t:.2f}' for t in times['kiln'])}  "
          f"ratio {kiln / stock:.3f}x")
    print(f"  kilnd's launcher compilers, first preferred: {'; '.join(compilers) or '(not logged)'}")


if __name__ == "__main__":
    main()
