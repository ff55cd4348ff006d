"""Per-kernel time to a launchable kernel in a fresh process: through kilnd vs
stock Triton, cold (nothing cached) and warm (stock: its file cache populated;
kilnd: its cache populated, the client's local files absent, then present).
Run on the GPU machine (see README):

  python3 bench/gpu_bench.py gpu_bundle
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CLIENT = Path(__file__).resolve().parent / "gpu_bench_client.py"


def run(env):
    result = subprocess.run([sys.executable, str(CLIENT)], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(result.stderr[-3000:])
    return json.loads(result.stdout.splitlines()[-1])


def main():
    bundle = Path(sys.argv[1]).resolve()
    work = Path(tempfile.mkdtemp(prefix="kiln-gpu-bench-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KILN", "TRITON_"))}
    stock_env = dict(base, TRITON_CACHE_DIR=str(work / "stock"))
    stock_cold, stock_warm = run(stock_env), run(stock_env)

    lib_env = dict(base, LD_LIBRARY_PATH=str(bundle / "lib"))
    kilnd = subprocess.Popen([str(bundle / "kilnd"), f"--data-dir={work / 'data'}", f"--local-socket={work / 's'}",
                              f"--toolchain={sys.executable}", "--log-level=warn"], env=lib_env)
    subprocess.run([str(bundle / "kiln"), "--endpoint", f"unix:{work / 's'}", "health", "--wait", "60"],
                   env=lib_env, check=True, stdout=subprocess.DEVNULL)
    kiln_env = dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{work / 's'}")
    try:
        kiln_cold = run(dict(kiln_env, TRITON_CACHE_DIR=str(work / "k1"), KILN_FILES_DIR=str(work / "f1")))
        fresh = dict(kiln_env, TRITON_CACHE_DIR=str(work / "k2"), KILN_FILES_DIR=str(work / "f2"))
        kiln_warm = run(fresh)  # a new process, venv or container: the client's files absent
        kiln_local = run(fresh)  # the same program again: its files present
    finally:
        kilnd.terminate()
        kilnd.wait()

    print(f"{'kernel':28} {'stock cold':>10} {'kiln cold':>10} {'ratio':>6} | {'stock warm':>10} "
          f"{'kiln absent':>11} {'ratio':>6} {'kiln present':>12} {'ratio':>6}   (ms to a launchable kernel)")
    for name in stock_cold:
        print(f"{name:28} {stock_cold[name]:10.1f} {kiln_cold[name]:10.1f} {kiln_cold[name] / stock_cold[name]:6.2f} | "
              f"{stock_warm[name]:10.1f} {kiln_warm[name]:11.1f} {kiln_warm[name] / stock_warm[name]:6.2f} "
              f"{kiln_local[name]:12.1f} {kiln_local[name] / stock_warm[name]:6.2f}")
    for label, skip in (("total", None), ("after the first", next(iter(stock_cold)))):
        totals = [sum(ms for k, ms in d.items() if k != skip)
                  for d in (stock_cold, kiln_cold, stock_warm, kiln_warm, kiln_local)]
        print(f"{label:28} {totals[0]:10.1f} {totals[1]:10.1f} {totals[1] / totals[0]:6.2f} | "
              f"{totals[2]:10.1f} {totals[3]:11.1f} {totals[3] / totals[2]:6.2f} {totals[4]:12.1f} "
              f"{totals[4] / totals[2]:6.2f}")


if __name__ == "__main__":
    main()
