"""Compile-only autotuning on the CPU (CI-sized, no GPU): an autotuned GEMM's
warmup (Autotuner.warmup, as a program precompiles) of 8 configs for sm90, in
a fresh process each, stock against Kiln cold (a fresh kilnd, the configs
compiled at once: kiln/triton/autotune_ahead.py), Kiln cold one by one
(KILN_AUTOTUNE_AHEAD=0) and Kiln warm (the same kilnd, no local files).
Rounds interleave; medians and their ratio to stock are printed.

  python3 bench/autotune_cpu_bench.py [--rounds 3]

The GPU version, with benchmarking, is bench/autotune_gpu_bench.py."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "python")]
import hermetic  # noqa: E402  (tests/hermetic.py)

KINDS = ("stock", "kiln-serial", "kiln", "kiln-warm")
SIZES = ((32, 32), (32, 64), (64, 32), (64, 64), (32, 128), (128, 32), (64, 128), (128, 64))


def child():
    """One warmup, timed: prints its seconds and the kernels' hashes."""
    from triton.runtime.driver import driver

    import autotuned_kernels  # noqa: E402  (tests/python)

    driver.set_active(autotuned_kernels.CompileOnlyDriver())
    kernel = autotuned_kernels.autotuned_matmul(SIZES)
    tensor = autotuned_kernels.StandInTensor()
    started = time.perf_counter()
    compiled = kernel.warmup(tensor, tensor, tensor, 1024, grid=(1, ))
    print(json.dumps({"seconds": time.perf_counter() - started, "hashes": [k.hash for k in compiled]}))


class Kilnd:
    def __init__(self, directory):
        self.socket = directory / "kilnd.sock"
        build = Path(os.environ.get("KILN_BUILD_DIR", REPO / "build"))
        self.process = subprocess.Popen([str(build / "service" / "kilnd"), f"--data-dir={directory / 'data'}",
                                         f"--local-socket={self.socket}", f"--toolchain={sys.executable}"],
                                        stdout=open(directory / "kilnd.log", "w"), stderr=subprocess.STDOUT)
        subprocess.run([str(build / "client" / "cpp" / "kiln"), "health", "--wait", "60"], check=True,
                       capture_output=True, env=dict(os.environ, KILN_ENDPOINT=f"unix:{self.socket}"))

    def stop(self):
        self.process.terminate()
        self.process.wait()


def run(work, kilnd=None, **kiln_env):
    env = hermetic.stock_env()
    env.update(TRITON_CACHE_DIR=str(work / "triton"), KILN_FILES_DIR=str(work / "files"))
    if kilnd is not None:
        env.update(KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}", **kiln_env)
    result = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-4000:])
    return json.loads(result.stdout.splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true")
    options = parser.parse_args()
    if options.child:
        return child()
    hermetic.enter()  # none of this account's kilnd, caches or files
    root = Path(tempfile.mkdtemp(prefix="kiln-autotune-cpu-"))
    seconds = {kind: [] for kind in KINDS}
    hashes = set()
    for number in range(options.rounds):
        for kind in ("stock", "kiln-serial", "kiln"):
            work = root / f"{number}-{kind}"
            work.mkdir()
            if kind == "stock":
                result = run(work)
            else:
                kilnd = Kilnd(work)
                result = run(work, kilnd, **({"KILN_AUTOTUNE_AHEAD": "0"} if kind == "kiln-serial" else {}))
                if kind == "kiln":
                    warm = root / f"{number}-kiln-warm"
                    warm.mkdir()
                    warm_result = run(warm, kilnd)
                    seconds["kiln-warm"].append(warm_result["seconds"])
                    hashes.add(tuple(warm_result["hashes"]))
                kilnd.stop()
            seconds[kind].append(result["seconds"])
            hashes.add(tuple(result["hashes"]))
        print(f"round {number + 1}: " + ", ".join(f"{kind} {seconds[kind][-1]:.2f} s" for kind in KINDS))
    stock = statistics.median(seconds["stock"])
    print(f"\n{len(SIZES)} configs for sm90, {os.cpu_count()} cores, medians of {options.rounds} rounds")
    for kind in KINDS:
        median = statistics.median(seconds[kind])
        print(f"{kind:12s} {median:6.2f} s  {median / stock:5.2f}x stock")
    print("every run compiled the same kernels:", len(hashes) == 1)


if __name__ == "__main__":
    main()
