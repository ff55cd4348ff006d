"""A program's own compiles, once kilnd's client is loaded, run in the program
(kiln/triton/compiled_here.py): stock's stages and stock's bytes, kilnd storing
each kernel after, holding its claim until then; compiles ahead stay kilnd's
(test_autotune_ahead).
The rest of the suite runs with KILN_COMPILE_HERE=0 (tests/hermetic.py), as it
counts the kernels kilnd compiles."""

import subprocess
import sys
import time

import hermetic
from conftest import PROBE, Kilnd, probe_json, run_probe
from test_bundle import compile_calls, kiln


def _env(tmp_path, kilnd, name, **settings):
    return dict(hermetic.stock_env(), KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}",
                KILN_FILES_DIR=str(tmp_path / f"{name}-files"), TRITON_CACHE_DIR=str(tmp_path / f"{name}-cache"),
                **{"KILN_COMPILE_HERE": "1", **settings})


def test_a_programs_kernels_compile_in_it_and_reach_the_next_process_and_a_prewarm_through_kilnd(
        tmp_path, stock_suite):
    recorder = Kilnd(tmp_path / "recorder", f"--toolchain={sys.executable}")
    bundle = tmp_path / "sm80.kilnbundle"
    sm80 = {name: kernel for name, kernel in stock_suite.items() if name.endswith("-sm80")}
    try:
        first = probe_json(run_probe(_env(tmp_path, recorder, "first"), "suite-sm80"))
        assert first["kernels"] == sm80 and first["frontend_runs"] == len(sm80)
        assert compile_calls(recorder) == 0, "the program's compiles went to kilnd's workers"
        # A new process, an empty Triton cache and files dir: every kernel from kilnd.
        again = probe_json(run_probe(_env(tmp_path, recorder, "again"), "suite-sm80"))
        assert again["kernels"] == sm80 and again["frontend_runs"] == 0
        assert recorder.stats().compiles == 0
        assert kiln(recorder, "export", bundle).returncode == 0
        # For the target it was recorded for, the bundle's kernels are there already: none compiles again.
        again = kiln(recorder, "prewarm", bundle, "--target", "cuda:80")
        assert f"prewarmed {len(sm80)} kernels for 1 targets: 0 compiled, {len(sm80)} already cached" in again.stdout, \
            again.stdout + again.stderr
        assert recorder.stats().compiles == 0
        # Turned off, the program's compiles are kilnd's again.
        off = probe_json(run_probe(_env(tmp_path, recorder, "off", KILN_COMPILE_HERE="0"), "first-sm89-twice"))
        assert off["frontend_runs"] == 1 and compile_calls(recorder) == 1
    finally:
        recorder.stop()
    # What each kernel's key came from went with it: prewarm compiles them all for another target.
    farm = Kilnd(tmp_path / "farm", f"--toolchain={sys.executable}")
    try:
        prewarmed = kiln(farm, "prewarm", bundle, "--target", "cuda:90")
        assert prewarmed.returncode == 0, prewarmed.stderr
        assert f"prewarmed {len(sm80)} kernels for 1 targets: {len(sm80)} compiled, 0 already cached, " \
               "0 skipped, 0 failed" in prewarmed.stdout, prewarmed.stdout
        client = probe_json(run_probe(_env(tmp_path, farm, "client"), "suite-sm90"))
        assert client["kernels"] == {name: kernel for name, kernel in stock_suite.items() if name.endswith("-sm90")}
        assert client["frontend_runs"] == 0
    finally:
        farm.stop()


def test_a_process_asking_for_a_kernel_another_compiles_in_itself_waits_for_it_and_compiles_nothing(
        tmp_path, stock_suite):
    """The compiling process holds kilnd's claim until kilnd has stored the
    kernel: one that let go of it first would leave the other to compile it too."""
    kilnd = Kilnd(tmp_path / "k", f"--toolchain={sys.executable}")
    # ptxas through a script that holds each compile while <tmp>/stall exists
    # (`--version`, which enters the key, answers at once): a compile that
    # takes its time in the first process.
    real_ptxas = subprocess.run([sys.executable, "-c", "from triton import knobs; print(knobs.nvidia.ptxas.path)"],
                                env=hermetic.stock_env(), capture_output=True, text=True, check=True).stdout.strip()
    stall, in_ptxas, ptxas = tmp_path / "stall", tmp_path / "in-ptxas", tmp_path / "ptxas"
    ptxas.write_text(f'#!/bin/sh\n[ "$1" = --version ] || {{ touch {in_ptxas}; while [ -e {stall} ]; do sleep 0.05;'
                     f' done; }}\nexec {real_ptxas} "$@"\n')
    ptxas.chmod(0o755)
    stall.touch()
    settings = {"TRITON_PTXAS_PATH": str(ptxas)}
    compiling = subprocess.Popen([sys.executable, str(PROBE), "first"], env=_env(tmp_path, kilnd, "a", **settings),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    waiting = None
    try:
        deadline = time.monotonic() + 120
        while not in_ptxas.exists() and compiling.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert in_ptxas.exists(), "the first process never reached ptxas"
        in_ptxas.unlink()
        waiting = subprocess.Popen([sys.executable, str(PROBE), "first"], env=_env(tmp_path, kilnd, "b", **settings),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)  # the second process has looked the kernel up, and waits
        assert waiting.poll() is None and not in_ptxas.exists(), "the second process did not wait for the first"
        stall.unlink()
        outputs = [process.communicate(timeout=120) for process in (compiling, waiting)]
        assert compiling.returncode == 0 and waiting.returncode == 0, outputs
        a, b = (probe_json(subprocess.CompletedProcess([], 0, out, err)) for out, err in outputs)
        assert a["kernels"]["add_fp32-sm90"] == b["kernels"]["add_fp32-sm90"] == stock_suite["add_fp32-sm90"]
        assert a["frontend_runs"] == 1 and b["frontend_runs"] == 0, "the second process compiled the kernel too"
        assert kilnd.stats().compiles == 0
    finally:
        stall.unlink(missing_ok=True)
        for process in (compiling, waiting):
            if process is not None:
                process.kill()
        kilnd.stop()

