"""Per-kernel time to a launchable kernel in a fresh process: through kilnd vs
stock Triton, cold (nothing cached) and warm (stock: its file cache populated;
kilnd: its cache populated, the process's local files empty). Run on the GPU
machine (see README):

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
        kiln_warm = run(dict(kiln_env, TRITON_CACHE_DIR=str(work / "k2"), KILN_FILES_DIR=str(work / "f2")))
    finally:
        kilnd.terminate()
        kilnd.wait()

    print(f"{'kernel':28} {'stock cold':>10} {'kiln cold':>10} {'ratio':>6} | {'stock warm':>10} "
          f"{'kiln warm':>10} {'ratio':>6}   (ms to a launchable kernel, fresh process)")
    for name in stock_cold:
        print(f"{name:28} {stock_cold[name]:10.1f} {kiln_cold[name]:10.1f} {kiln_cold[name] / stock_cold[name]:6.2f} | "
              f"{stock_warm[name]:10.1f} {kiln_warm[name]:10.1f} {kiln_warm[name] / stock_warm[name]:6.2f}")
    totals = [sum(d.values()) for d in (stock_cold, kiln_cold, stock_warm, kiln_warm)]
    print(f"{'total':28} {totals[0]:10.1f} {totals[1]:10.1f} {totals[1] / totals[0]:6.2f} | "
          f"{totals[2]:10.1f} {totals[3]:10.1f} {totals[3] / totals[2]:6.2f}")


if __name__ == "__main__":
    main()
