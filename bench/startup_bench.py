"""What every process pays for the client before its first kernel, against
stock Triton in the same run: an interpreter's start under KILN=1 (the .pth
runs in every subprocess and inductor compile worker, compiling or not) and
`import triton` (Kiln's patches install as Triton's modules load). No kilnd
is needed: nothing here reaches it.

usage: python bench/startup_bench.py [--runs 30]
Prints the median of --runs fresh processes for each, stock and Kiln taking
turns, and their ratio.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import hermetic  # noqa: E402  (tests/hermetic.py)

IMPORT_TRITON = "import time; start = time.perf_counter(); import triton; print(time.perf_counter() - start)"


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    stock = hermetic.stock_env()
    with tempfile.TemporaryDirectory(prefix="kiln-startup-") as work:
        # An endpoint where none listens: activation must not need kilnd.
        kiln = dict(stock, KILN="1", KILN_FILES_DIR=os.path.join(work, "files"),
                    KILN_ENDPOINT=f"unix:{os.path.join(work, 'no-kilnd.sock')}")
        starts, imports = {"stock": [], "kiln": []}, {"stock": [], "kiln": []}
        for _ in range(args.runs):
            for kind, env in (("stock", stock), ("kiln", kiln)):
                began = time.perf_counter()
                subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
                starts[kind].append(time.perf_counter() - began)
                imported = subprocess.run([sys.executable, "-c", IMPORT_TRITON], env=env, check=True,
                                          capture_output=True, text=True)
                imports[kind].append(float(imported.stdout.split()[-1]))
    print(f"median of {args.runs} processes each, stock and Kiln taking turns")
    for label, times in (("interpreter start (python -c pass)", starts), ("import triton, in-process", imports)):
        stock_ms, kiln_ms = (statistics.median(times[kind]) * 1e3 for kind in ("stock", "kiln"))
        print(f"  {label:36} stock {stock_ms:7.1f} ms  kiln {kiln_ms:7.1f} ms  ratio {kiln_ms / stock_ms:.2f}x")


if __name__ == "__main__":
    main()
