#!/usr/bin/env python3
"""Runs the Python client's codec fuzzers (fuzz_*.py beside this file).

Usage: run_fuzzers.py [--seconds N] [--jobs J] [NAME...]

Each fuzzer named (all of them by default; NAME is e.g. fuzz_wire or wire)
first reads every file of regressions/<fuzzer>/ once, then fuzzes for N
seconds (default 20) with J jobs (default 1), from a scratch corpus in a temp
dir seeded from corpus/<fuzzer>/ and regressions/<fuzzer>/: nothing is
written into the checkout (a crash's input is kept in
$TMPDIR/kiln-fuzz-crashes/<fuzzer>/). Inputs that took more than 10 s, or more
than 2 GiB, count as crashes. Prints one line per fuzzer (executions, exec/s, coverage,
corpus size, crashed or not, with the command that reproduces a crash) and
exits 1 if any crashed. Runs with the interpreter that runs it (the project's
.venv, which has atheris, protobuf and hpack).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FUZZERS = sorted(path.stem for path in HERE.glob("fuzz_*.py"))
# libFuzzer's flags for every run: a per-input time budget (a hang is a
# crash), a memory budget, and the largest input (a few frames, blocks or
# messages: bigger ones only slow each run).
LIMITS = ["-timeout=10", "-rss_limit_mb=2048", "-max_len=4096"]


def _last_status(text):
    """The figures of libFuzzer's last status line in `text` ("#RUNS ... cov: N ft: N corp: N/SIZE
    exec/s: N", or "#RUNS: cov: N ft: N corp: N exec/s N ..." in fork mode)."""
    found = {}
    for line in text.splitlines():
        if re.match(r"#\d+[:\s]", line) and "cov:" in line:
            found = dict(re.findall(r"(cov|ft|corp|exec/s):? (\S+)", line))
            found["runs"] = re.match(r"#(\d+)", line)[1]
    return found


def _final_stats(text):
    return dict(re.findall(r"stat::(\w+):\s+(\d+)", text))


def run(name, seconds, jobs, scratch):
    script = HERE / f"{name}.py"
    regressions = HERE / "regressions" / name
    corpus = scratch / name
    corpus.mkdir()
    for seeds in (HERE / "corpus" / name, regressions):
        for path in sorted(seeds.glob("*")) if seeds.is_dir() else ():
            shutil.copy(path, corpus / f"{seeds.name}-{path.name}")
    artifacts = scratch / f"{name}-crashes"
    artifacts.mkdir()
    crashed, reproduce = False, ""
    regression_files = sorted(regressions.glob("*")) if regressions.is_dir() else []
    if regression_files:
        replay = subprocess.run([sys.executable, str(script), *LIMITS, *map(str, regression_files)],
                                capture_output=True, text=True, cwd=scratch)
        if replay.returncode:
            crashed = True
            failing = re.findall(r"Running: (\S+)", replay.stdout + replay.stderr)
            reproduce = f"{sys.executable} {script} {failing[-1] if failing else regressions}"
            print(replay.stderr[-4000:], file=sys.stderr)
    command = [sys.executable, str(script), *LIMITS, f"-max_total_time={seconds}", "-print_final_stats=1",
               f"-artifact_prefix={artifacts}/", str(corpus)]
    env = None
    if jobs > 1:
        command[2:2] = [f"-fork={jobs}"]
        # Fork mode's workers run the script itself, by its #! line: its
        # python3 must be this interpreter (the one with atheris), not PATH's.
        env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    fuzzing = subprocess.run(command, capture_output=True, text=True, cwd=scratch, env=env)  # fork mode's files go there
    output = fuzzing.stdout + fuzzing.stderr
    if fuzzing.returncode:
        crashed = True
        kept = Path(tempfile.gettempdir()) / "kiln-fuzz-crashes" / name  # outlives the scratch dir
        kept.mkdir(parents=True, exist_ok=True)
        # This run's inputs only: the kept directory also holds earlier runs'.
        found = sorted(artifacts.iterdir())
        for artifact in found:
            shutil.copy(artifact, kept / artifact.name)
        reproduce = f"{sys.executable} {script} {kept / found[-1].name if found else ''}"
        print(output[-4000:], file=sys.stderr)
    last, stats = _last_status(output), _final_stats(output)
    runs = stats.get("number_of_executed_units", last.get("runs", "?"))
    per_second = stats.get("average_exec_per_sec", last.get("exec/s", "?"))
    outcome = f"CRASHED, reproduce: {reproduce}" if crashed else "no crash"
    print(f"{name}: {runs} runs, {per_second} exec/s, cov {last.get('cov', '?')} ft {last.get('ft', '?')}, "
          f"corpus {len(list(corpus.iterdir()))} inputs ({last.get('corp', '?')}), {outcome}", flush=True)
    return not crashed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("names", nargs="*", metavar="NAME")
    arguments = parser.parse_args()
    names = [name if name.startswith("fuzz_") else f"fuzz_{name}" for name in arguments.names] or FUZZERS
    unknown = sorted(set(names) - set(FUZZERS))
    if unknown:
        parser.error(f"no fuzzer {', '.join(unknown)}; there are {', '.join(FUZZERS)}")
    with tempfile.TemporaryDirectory(prefix="kiln-fuzz-") as scratch:
        passed = [run(name, arguments.seconds, arguments.jobs, Path(scratch)) for name in names]
    sys.exit(0 if all(passed) else 1)


if __name__ == "__main__":
    main()
