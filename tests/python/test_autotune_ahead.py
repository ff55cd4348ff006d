"""An autotuned kernel's configs compiled at once through kilnd
(kiln/triton/autotune_ahead.py), compile-only for sm90 (no GPU here; the probe's
driver and tensors stand in): the same kernels as stock, byte for byte, each
compiled once by kilnd, in the client's threads; a failing config fails as
stock fails it; KILN_AUTOTUNE_AHEAD=0 compiles them one by one."""

import sys

from test_client import base_env, kiln_env, probe_json, run_probe  # noqa: F401  (fixtures)


def test_configs_compile_at_once_through_kilnd_into_stocks_kernels(base_env, kiln_env, kilnd):
    stock = probe_json(run_probe(base_env, "autotune-warmup"))
    assert len(stock["kernels"]) == 4 and stock["frontend_threads"] == ["MainThread"]

    before = kilnd.stats()
    ahead = run_probe(dict(kiln_env, KILN_STRICT="1", KILN_DEBUG="1"), "autotune-warmup")
    compiled = probe_json(ahead)
    assert compiled["kernels"] == stock["kernels"]
    # Every config's frontend ran in Kiln's threads, and kilnd compiled each once.
    assert compiled["frontend_threads"] == ["kiln-compile"], compiled["frontend_threads"]
    assert "4 configs compiled ahead" in ahead.stderr, ahead.stderr[-3000:]
    after = kilnd.stats()
    assert after.compiles - before.compiles == 4
    # Reported as the process exited: its four configs, and the time they saved.
    assert after.compiled_ahead - before.compiled_ahead == 4
    assert after.ahead_seconds_saved >= before.ahead_seconds_saved



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
