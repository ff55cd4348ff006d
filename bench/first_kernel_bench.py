"""The first kernel of a fresh process, stock Triton against Kiln where no
kilnd runs yet (the client starts the user's kilnd), measured in one run.

Each run is a new process with an empty Triton cache that imports triton
and compiles one new kernel (its source differs run to run) for sm90, as a
program's first @triton.jit call does. No GPU is needed. Kinds, taking turns:
  stock       stock Triton
  kiln-new    Kiln, no kilnd running, a new data dir: kilnd probes this
              Python's Triton in the background as it starts, and the
              kernel compiles in the process meanwhile (a user's first day)
  kiln-known  Kiln, no kilnd running (it idled out); what Kiln keeps on
              disk is an earlier day's (kilnd's data dir, which remembers
              the probe, and the client's memos), with another kernel
  kiln-up     Kiln with the user's kilnd running and its worker up
              (the kernel is still new to it)
Printed: the median ms from the process's launch to its kernel compiled
(`launch`), and from the end of `import triton` (`compile`), and their
ratios to stock.

usage: python bench/first_kernel_bench.py [--runs 7] [--build-dir build]
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import hermetic  # noqa: E402  (tests/hermetic.py)

KERNEL = '''
import triton
import triton.language as tl

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * {salt} + y, mask=mask)
'''

PROGRAM = '''
import json, sys, time
import triton
imported = time.monotonic()
sys.path.insert(0, sys.argv[1])
from new_kernel import add_kernel
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
compiled = triton.compile(ASTSource(add_kernel, signature, {"BLOCK": 1024}), target=GPUTarget("cuda", 90, 32))
assert compiled.asm["cubin"]
print(json.dumps({"imported": imported, "compiled": time.monotonic()}))
'''

KINDS = ("stock", "kiln-new", "kiln-known", "kiln-up")


def kilnds_of(runtime):
    return hermetic.processes_with("XDG_RUNTIME_DIR", str(runtime))


def stop_kilnds(runtime):
    for pid in kilnds_of(runtime):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while kilnds_of(runtime) and time.monotonic() < deadline:
        time.sleep(0.05)


def run_once(kind, index, work, build_dir, remembered):
    run_dir = work / f"{kind}-{index}"
    (run_dir / "kernel").mkdir(parents=True)
    (run_dir / "kernel" / "new_kernel.py").write_text(KERNEL.format(salt=f"{index + 2}.0"))
    env = dict(hermetic.stock_env(), TRITON_CACHE_DIR=str(run_dir / "triton-cache"))
    runtime = work / "run-up" if kind == "kiln-up" else run_dir / "run"
    if kind != "stock":
        runtime.mkdir(mode=0o700, exist_ok=True)
        cache = work / "cache-up" if kind == "kiln-up" else run_dir / "cache"
        env.update(KILN="1", KILN_STRICT="1", KILN_KILND=str(build_dir / "service" / "kilnd"),
                   XDG_RUNTIME_DIR=str(runtime), XDG_CACHE_HOME=str(cache))
        if kind == "kiln-known":
            shutil.copytree(remembered, cache)
    launched = time.monotonic()
    result = subprocess.run([sys.executable, "-c", PROGRAM, str(run_dir / "kernel")], env=env,
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        sys.exit(f"{kind} run {index} failed:\n{result.stderr[-3000:]}")
    times = json.loads(result.stdout.splitlines()[-1])
    if kind in ("kiln-new", "kiln-known"):
        stop_kilnds(runtime)
    return (times["compiled"] - launched) * 1e3, (times["compiled"] - times["imported"]) * 1e3, run_dir


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build")
    args = parser.parse_args()
    build_dir = args.build_dir.resolve()
    with tempfile.TemporaryDirectory(prefix="kiln-first-kernel-") as work_dir:
        work = Path(work_dir)
        # A first run of each makes the probe memo kiln-known copies and
        # starts kiln-up's kilnd; Triton's own files are warm in the page cache.
        *_, primed = run_once("kiln-new", -1, work, build_dir, None)
        remembered = primed / "cache"
        run_once("kiln-up", -1, work, build_dir, None)
        run_once("stock", -1, work, build_dir, None)
        measured = {kind: ([], []) for kind in KINDS}
        try:
            for index in range(args.runs):
                for kind in KINDS:
                    launch_ms, compile_ms, _ = run_once(kind, index, work, build_dir, remembered)
                    measured[kind][0].append(launch_ms)
                    measured[kind][1].append(compile_ms)
        finally:
            stop_kilnds(work / "run-up")
    print(f"median of {args.runs} fresh processes each, kinds taking turns; {os.cpu_count()} CPUs")
    stock_launch, stock_compile = (statistics.median(times) for times in measured["stock"])
    for kind in KINDS:
        launch_ms, compile_ms = (statistics.median(times) for times in measured[kind])
        print(f"  {kind:10}  launch to kernel {launch_ms:7.1f} ms ({launch_ms / stock_launch:.2f}x)   "
              f"import to kernel {compile_ms:7.1f} ms ({compile_ms / stock_compile:.2f}x)")


if __name__ == "__main__":
    main()
