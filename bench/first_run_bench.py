"""A program's first run on Linux, stock Triton against Kiln with the user's
own kilnd (started by the client), measured in one run, in two shapes:

  user   a user's program for its one GPU: 24 kernels of mixed kinds
         (elementwise, reductions, softmax, layernorm, matmuls, attention),
         compiled one after another for sm90 (tests/python/client_probe.py
         user-program)
  farm   a build farm's: the 15-kernel suite for sm80 and sm90 (30 compiles;
         client_probe.py suite)

Each run is a new process with an empty Triton cache. Kinds, taking turns in
each round:
  stock     stock Triton
  kiln-new  Kiln, no kilnd running and nothing of Kiln's on disk (a user's
            first day): the client starts kilnd, which probes this Python
  kiln-up   Kiln with the user's kilnd running (started just before, on an
            empty data dir) and its worker up, none of the program stored
  kiln-warm a second process, with an empty Triton cache, through kiln-up's
            kilnd: it must compile nothing (the bench stops if kilnd compiled
            anything for it)

Printed: each kind's median seconds and its ratio to stock's, and where
Kiln's time goes (bench/first_run_phases.py). The Windows counterpart is
bench/windows_first_run_bench.py. No GPU is needed.

usage: python bench/first_run_bench.py [--rounds 5] [--shape user|farm|both] [--build-dir build]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]
import hermetic  # noqa: E402  (tests/hermetic.py)
from first_run_phases import (CLIENT_START, KILND_START, SHAPES, Phases, print_results,  # noqa: E402
                              probe_seconds)

PROBE = ROOT / "tests" / "python" / "client_probe.py"
KINDS = ("stock", "kiln-new", "kiln-up", "kiln-warm")


class Run:
    """One kind's environment: its own runtime and data dirs (a user's XDG dirs)."""

    def __init__(self, work, name, build_dir, kiln):
        self.dir = work / name
        self.runtime, self.cache = self.dir / "run", self.dir / "cache"
        self.runtime.mkdir(mode=0o700, parents=True)
        self.env = dict(hermetic.stock_env(), TRITON_CACHE_DIR=str(self.dir / "triton-cache"))
        self.kiln_cli = build_dir / "client" / "cpp" / "kiln"
        if kiln:
            self.env.update(KILN="1", KILN_STRICT="1", KILN_KILND=str(build_dir / "service" / "kilnd"),
                            XDG_RUNTIME_DIR=str(self.runtime), XDG_CACHE_HOME=str(self.cache))

    def python(self, *args):
        done = subprocess.run([sys.executable, *args], env=self.env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            sys.exit(f"{' '.join(map(str, args))[:200]} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.splitlines()[-1])

    def stats(self):
        done = subprocess.run([str(self.kiln_cli), "--no-autostart", "stats", "--json"], env=self.env,
                              capture_output=True, text=True, timeout=60, check=True)
        return json.loads(done.stdout)

    def kilnd_log(self):
        log = self.cache / "kiln" / "logs" / "kilnd.log"
        return log.read_text() if log.exists() else ""

    def stop_kilnd(self):
        pids = hermetic.processes_with("XDG_RUNTIME_DIR", str(self.runtime))
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while hermetic.processes_with("XDG_RUNTIME_DIR", str(self.runtime)) and time.monotonic() < deadline:
            time.sleep(0.05)


def program(run, mode):
    """(seconds, the probe's report) of one run of the program."""
    started = time.monotonic()
    report = run.python(str(PROBE), mode)
    return time.monotonic() - started, report


def round_of(shape, index, work, build_dir, phases):
    mode, kernels = SHAPES[shape]
    seconds = {}
    for kind in KINDS:
        if kind == "kiln-warm":  # kiln-up's kilnd, a new Triton cache
            run.env["TRITON_CACHE_DIR"] = str(run.dir / "second-triton-cache")
            compiled_before = int(run.stats()["compiles"])
            seconds[kind], report = program(run, mode)
            compiled = int(run.stats()["compiles"]) - compiled_before
            if compiled or report["frontend_runs"]:
                sys.exit(f"{shape}: a second process ran Triton's frontend {report['frontend_runs']} times and had "
                         f"kilnd compile {compiled} kernels; it must compile nothing")
            run.stop_kilnd()
            continue
        run = Run(work, f"{shape}-{kind}-{index}", build_dir, kiln=kind != "stock")
        if kind == "kiln-up":
            started = run.python("-c", KILND_START)
            phases.kilnd_answers.append(started["answers"])
            phases.worker.append(started["worker"])
            phases.client.append(run.python("-c", CLIENT_START, "")["seconds"])
        seconds[kind], _ = program(run, mode)
        if kind == "kiln-up":
            phases.add_run(run.stats(), seconds[kind], seconds["stock"], kernels)
        if kind != "stock":
            probed = probe_seconds(run.kilnd_log())
            if probed is not None:
                phases.probe.append(probed)
        if kind == "kiln-new":
            run.stop_kilnd()
    return seconds


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shape", choices=("user", "farm", "both"), default="both")
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build")
    args = parser.parse_args()
    shapes = ("user", "farm") if args.shape == "both" else (args.shape,)
    build_dir = args.build_dir.resolve()
    with tempfile.TemporaryDirectory(prefix="kiln-first-run-") as work_dir:
        work = Path(work_dir)
        # Triton's, Kiln's and Python's files warm in the page cache for every kind.
        round_of("user", -1, work, build_dir, Phases())
        measured = {shape: {kind: [] for kind in KINDS} for shape in shapes}
        phases = {shape: Phases() for shape in shapes}
        for index in range(args.rounds):
            for shape in shapes:
                for kind, seconds in round_of(shape, index, work, build_dir, phases[shape]).items():
                    measured[shape][kind].append(seconds)
    print(f"Linux, triton {_triton_version()}; median of {args.rounds} rounds, kinds taking turns; "
          f"{os.cpu_count()} CPUs")
    print_results(shapes, KINDS, measured, phases)


def _triton_version():
    import importlib.metadata

    return importlib.metadata.version("triton")


if __name__ == "__main__":
    main()
