"""An autotuned kernel's configs compiled at once through kilnd
(kiln/triton/autotune_ahead.py), compile-only for sm90 (no GPU here; the probe's
driver and tensors stand in): the same kernels as stock, byte for byte, each
compiled once by kilnd, in the client's threads; a failing config fails as
stock fails it; the benchmarks begin with whichever config is ready and
choose as stock chooses; a fleet's kilnds share the configs by their keys;
configs that find kilnd's workers busy compile here where the threads fill
the cores (KILN_COMPILE_HERE_WHEN_BUSY); KILN_AUTOTUNE_AHEAD=0 compiles them
one by one."""

import hashlib
import sys

from triton.backends.compiler import GPUTarget

import kernel_suite
import triton_frontend
from conftest import probe_json, run_probe, tcp_kilnd
from pipeline_client import only_worker_held
from test_client import base_env, kiln_env  # noqa: F401  (fixtures)


def test_configs_compile_at_once_through_kilnd_into_stocks_kernels(base_env, kiln_env, kilnd, tmp_path):
    stock = probe_json(run_probe(base_env, "autotune-warmup"))
    assert len(stock["kernels"]) == 4 and stock["frontend_threads"] == ["MainThread"]
    assert stock["ttgir_made_here"] == 4

    before = kilnd.stats()
    # Compiles ahead are kilnd's even where the program's own compile in it.
    ahead = run_probe(dict(kiln_env, KILN_STRICT="1", KILN_DEBUG="1", KILN_COMPILE_HERE="1"), "autotune-warmup")
    compiled = probe_json(ahead)
    assert compiled["kernels"] == stock["kernels"]
    # Every config's frontend ran in Kiln's threads, and kilnd compiled each
    # once, from the frontend's TTIR: no TTGIR was made in the process.
    assert compiled["frontend_threads"] == ["kiln-compile"], compiled["frontend_threads"]
    assert compiled["ttgir_made_here"] == 0
    assert "4 configs compiled ahead" in ahead.stderr, ahead.stderr[-3000:]
    after = kilnd.stats()
    assert after.compiles - before.compiles == 4
    # Reported as the process exited: its four configs, and the time they saved.
    assert after.compiled_ahead - before.compiled_ahead == 4
    assert after.ahead_seconds_saved >= before.ahead_seconds_saved

    # A process with no files of its own gets the same kernels from kilnd,
    # stock's .ttir (the compiling process's, not the one kilnd's worker
    # made from text) among them, and compiles nothing.
    elsewhere = dict(kiln_env, KILN_STRICT="1", TRITON_CACHE_DIR=str(tmp_path / "other-triton"),
                     KILN_FILES_DIR=str(tmp_path / "other-files"))
    served = probe_json(run_probe(elsewhere, "autotune-warmup"))
    assert served["kernels"] == stock["kernels"] and served["frontend_threads"] == []
    assert kilnd.stats().compiles == after.compiles


def test_configs_missed_while_the_client_of_kilnd_loads_compile_here_at_once_and_kilnd_stores_them(
        base_env, fresh_kilnd, tmp_path):
    """A process's first compiles run in the process while kilnd's client
    loads (kiln/triton/compiled_here), a compile ahead's too: here the load
    is held until the probe's work is done, so that every compile is one."""
    stock = probe_json(run_probe(base_env, "autotune-warmup"))
    kilnd = fresh_kilnd(f"--toolchain={sys.executable}")
    env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}",
               KILN_FIRST_COMPILE_HERE="1")
    here = probe_json(run_probe(env, "autotune-warmup", "--hold-client-load"))
    assert here["kernels"] == stock["kernels"] and not here["client_loaded_meanwhile"]
    # Compiled ahead, in the threads, each stage here: stock's kernels.
    assert here["frontend_threads"] == ["kiln-compile"] and here["ttgir_made_here"] == 4
    assert kilnd.stats().compiles == 0
    # Stored once the client loaded: a process with no files of its own gets them all.
    elsewhere = dict(env, TRITON_CACHE_DIR=str(tmp_path / "other-triton"), KILN_FILES_DIR=str(tmp_path / "other-files"))
    served = probe_json(run_probe(elsewhere, "autotune-warmup"))
    assert served["kernels"] == stock["kernels"] and served["frontend_threads"] == []
    assert kilnd.stats().compiles == 0
    # Benchmarks still wait for the Python of a compile here (its frontend, its
    # stages). Of its 8 configs, the 4 the warmup had not compiled are compiled here.
    timed = probe_json(run_probe(dict(env, KILN_COMPILE_THREADS="4"), "autotune-timed", "--hold-client-load"))
    assert timed["benchmarks"] == 8 and timed["frontends_in_threads"] == 4, timed
    assert timed["overlapping"] == 0 and not timed["client_loaded_meanwhile"], timed
    assert kilnd.stats().compiles == 0


def test_configs_that_find_kilnds_workers_busy_compile_here_at_once_where_told_and_kilnd_stores_them(
        base_env, fresh_kilnd, tmp_path):
    """KILN_COMPILE_HERE_WHEN_BUSY (on by default where the compile threads
    fill the cores): kilnd's one worker is held by another client's job, so
    every config compiles in the client's own threads, and kilnd starts no
    worker for them."""
    stock = probe_json(run_probe(base_env, "autotune-warmup"))
    kilnd = fresh_kilnd(f"--toolchain={sys.executable}", "--compile-workers=2")
    with only_worker_held(kilnd, triton_frontend.run_frontend(kernel_suite.SUITE[0], GPUTarget("cuda", 80, 32))):
        env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}",
                   KILN_COMPILE_HERE_WHEN_BUSY="1")
        here = probe_json(run_probe(env, "autotune-warmup"))
        assert here["kernels"] == stock["kernels"]
        assert here["frontend_threads"] == ["kiln-compile"] and here["ttgir_made_here"] == 4
        stats = kilnd.stats()
        assert stats.compiles == 1 and stats.workers_started == 1, stats
    # Stored with their Puts: a process with no files of its own gets them all.
    elsewhere = dict(env, TRITON_CACHE_DIR=str(tmp_path / "other-triton"), KILN_FILES_DIR=str(tmp_path / "other-files"))
    served = probe_json(run_probe(elsewhere, "autotune-warmup"))
    assert served["kernels"] == stock["kernels"] and served["frontend_threads"] == []
    assert kilnd.stats().compiles == 1


def test_a_compile_ahead_under_a_compiler_debugging_variable_makes_its_ttgir_here(base_env, kiln_env):
    """Variables such as MLIR_ENABLE_TIMING show their output as the stages
    run: the user's process runs them, as stock."""
    env = dict(base_env, MLIR_ENABLE_TIMING="1")
    stock = probe_json(run_probe(env, "autotune-warmup"))
    compiled = probe_json(run_probe(dict(kiln_env, MLIR_ENABLE_TIMING="1", KILN_STRICT="1"), "autotune-warmup"))
    assert compiled["kernels"] == stock["kernels"]
    assert compiled["frontend_threads"] == ["kiln-compile"] and compiled["ttgir_made_here"] == 4


def test_benchmarks_of_configs_compiled_ahead_choose_as_stock(base_env, fresh_kilnd):
    stock = probe_json(run_probe(base_env, "autotune-benchmarks"))
    assert stock["benchmarked"] == [config for config, _ in stock["timings"]]  # stock's loop: in order
    cold = fresh_kilnd(f"--toolchain={sys.executable}")
    env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_DEBUG="1", KILN_ENDPOINT=f"unix:{cold.socket}")
    through_kiln = run_probe(env, "autotune-benchmarks")
    compiled = probe_json(through_kiln)
    assert compiled["frontend_threads"] == ["kiln-compile"], through_kiln.stderr[-3000:]
    assert cold.stats().compiles == 4
    # Each config benchmarked once, in the order they were ready (the first,
    # slow to compile, not first), the timings kept in stock's order, and of
    # the two that tie, stock's first chosen.
    assert sorted(compiled["benchmarked"]) == sorted(stock["benchmarked"])
    assert compiled["benchmarked"][0] != stock["benchmarked"][0], compiled["benchmarked"]
    assert compiled["timings"] == stock["timings"]
    assert compiled["best"] == stock["best"] and "BLOCK_M: 32, BLOCK_N: 64" in stock["best"]
    assert compiled["ended"] == stock["ended"]


def test_no_compile_ahead_runs_its_frontend_while_a_config_is_benchmarked(base_env, fresh_kilnd):
    kilnd = fresh_kilnd(f"--toolchain={sys.executable}")
    env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}", KILN_COMPILE_THREADS="4")
    timed = probe_json(run_probe(env, "autotune-timed"))
    assert timed["benchmarks"] == 8
    assert timed["frontends_in_threads"] == 8, "the configs were not compiled ahead"
    assert timed["overlapping"] == 0, timed


def test_autotune_results_triton_cached_compile_only_the_chosen_config(base_env, tmp_path, fresh_kilnd):
    """TRITON_CACHE_AUTOTUNING=1: a later process finds the timings in the
    cache and benchmarks nothing, compiling only the config chosen, as stock;
    through Kiln it finds them in kilnd, from files of its own."""
    def process(env, name):
        files = dict(env, TRITON_CACHE_DIR=str(tmp_path / name / "triton"),
                     KILN_FILES_DIR=str(tmp_path / name / "kiln-files"), TRITON_CACHE_AUTOTUNING="1")
        return probe_json(run_probe(files, "autotune-benchmarks"))

    stock_first = process(base_env, "stock")
    stock_later = process(base_env, "stock")
    assert stock_later["benchmarked"] == [] and stock_later["compiled"] == [[32, 64]], stock_later
    kilnd = fresh_kilnd(f"--toolchain={sys.executable}")
    env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}")
    first = process(env, "first")
    assert first["timings"] == stock_first["timings"] and first["best"] == stock_first["best"]
    later = process(env, "later")
    assert later["benchmarked"] == [] and later["compiled"] == stock_later["compiled"], later
    assert later["best"] == stock_later["best"]


def test_a_fleet_compiles_each_config_on_the_kilnd_its_key_ranks_first(base_env, tmp_path):
    fleet = [tcp_kilnd(tmp_path / f"kilnd{i}", f"--toolchain={sys.executable}") for i in range(3)]
    try:
        env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=",".join(k.tcp_address() for k in fleet))
        compiled = probe_json(run_probe(env, "autotune-warmup"))
        compiles = [kilnd.stats().compiles for kilnd in fleet]
    finally:
        for kilnd in fleet:
            assert kilnd.stop() == 0, (kilnd.root / "kilnd.out").read_text()

    def ranked_first(key):  # rendezvous hashing over the kilnds' addresses (kiln's fleet docs)
        return max(fleet, key=lambda kilnd: hashlib.sha256(f"{kilnd.tcp_address()}\0{key}".encode()).digest())

    chosen = [ranked_first(kernel["hash"]) for kernel in compiled["kernels"].values()]
    assert len(compiled["kernels"]) == 4
    # Each config compiled once, on its key's kilnd: configs spread by key,
    # whichever process asks.
    assert compiles == [chosen.count(kilnd) for kilnd in fleet], (compiles, [k.tcp_address() for k in fleet])


def test_kiln_autotune_ahead_0_compiles_them_one_by_one(base_env, fresh_kilnd):
    cold = fresh_kilnd(f"--toolchain={sys.executable}")  # nothing of the test above in its cache
    env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{cold.socket}", KILN_AUTOTUNE_AHEAD="0")
    serial = probe_json(run_probe(env, "autotune-warmup"))
    assert len(serial["kernels"]) == 4 and serial["frontend_threads"] == ["MainThread"]
    assert cold.stats().compiles == 4


def test_a_config_that_fails_to_compile_fails_warmup_as_stock(base_env, kiln_env):
    stock = probe_json(run_probe(base_env, "autotune-warmup-failing"))
    assert stock["error"] == "CompileTimeAssertionFailure", stock
    through_kiln = probe_json(run_probe(dict(kiln_env, KILN_STRICT="1"), "autotune-warmup-failing"))
    assert (through_kiln["error"], through_kiln["message"]) == (stock["error"], stock["message"])
