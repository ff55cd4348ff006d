"""`kiln prewarm` against what it saves: the 15-kernel suite recorded at sm80
through one kilnd and exported; then, on a fresh kilnd, `kiln prewarm` of the
bundle for sm90, against stock Triton compiling the suite for sm90 in a fresh
process (what each sm90 machine would do without the bundle), and the sm90
client's first run afterwards. Same machine, one run.

usage: python bench/prewarm_bench.py [--build-dir build]
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import hermetic  # noqa: E402  (tests/hermetic.py)

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests" / "python"


def timed(command, env):
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{command[:4]} failed:\n{result.stdout[-2000:]}{result.stderr[-3000:]}")
    return time.perf_counter() - start, result.stdout


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build")
    args = parser.parse_args()
    kilnd_binary, kiln = args.build_dir / "service" / "kilnd", str(args.build_dir / "client" / "cpp" / "kiln")
    work = Path(tempfile.mkdtemp(prefix="kiln-prewarm-bench-"))
    base = hermetic.stock_env()
    probe = [sys.executable, str(TESTS / "client_probe.py")]

    def start_kilnd(name):
        socket = work / f"{name}.sock"
        process = subprocess.Popen([str(kilnd_binary), f"--data-dir={work / name}", f"--local-socket={socket}",
                                    f"--toolchain={sys.executable}", "--log-level=warn"])
        subprocess.run([kiln, "--endpoint", f"unix:{socket}", "health", "--wait", "60"], check=True,
                       stdout=subprocess.DEVNULL)
        return process, f"unix:{socket}"

    def client_env(endpoint, name):
        return dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=endpoint,
                    TRITON_CACHE_DIR=str(work / f"cache-{name}"), KILN_FILES_DIR=str(work / f"files-{name}"))

    stock, _ = timed([*probe, "suite-sm90"], dict(base, TRITON_CACHE_DIR=str(work / "stock")))
    recorder, endpoint = start_kilnd("recorder")
    try:
        timed([*probe, "suite-sm80"], client_env(endpoint, "recorder"))
        timed([kiln, "--endpoint", endpoint, "export", str(work / "sm80.kilnbundle")], base)
    finally:
        recorder.terminate()
        recorder.wait()
    farm, endpoint = start_kilnd("farm")
    try:
        prewarm, printed = timed([kiln, "--endpoint", endpoint, "prewarm", str(work / "sm80.kilnbundle"),
                                  "--target", "cuda:90"], base)
        first_run, _ = timed([*probe, "suite-sm90"], client_env(endpoint, "client"))
    finally:
        farm.terminate()
        farm.wait()
    print(printed.strip().splitlines()[-1])
    print(f"stock, the suite compiled for sm90 in a fresh process:   {stock:6.2f} s")
    print(f"kiln prewarm of the sm80 bundle for cuda:90 (fresh kilnd): {prewarm:6.2f} s  ({prewarm / stock:.2f}x)")
    print(f"an sm90 client's first run after it (every kernel a hit):  {first_run:6.2f} s  "
          f"({first_run / stock:.2f}x stock's compile, interpreter start included)")


if __name__ == "__main__":
    main()
