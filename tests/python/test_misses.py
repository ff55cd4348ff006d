"""Why a lookup missed (`kiln misses`, `python -m kiln misses`): a real kilnd,
and real client processes compiling one kernel as a user changes it."""

import json
import os
import subprocess
import sys

from kiln.service import api as _api

import hermetic
from conftest import BUILD, Kilnd

KILN = BUILD / "client" / "cpp" / "kiln"

# One kernel, `scale`, whose body the test changes (the source) like a user would.
PROGRAM = """
import sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

@triton.jit
def scale(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * FACTOR, mask=mask)

triton.compile(ASTSource(scale, {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 128}),
               target=GPUTarget("cuda", 90, 32), options={"num_warps": int(sys.argv[1])})
"""


def compile_scale(kilnd, tmp_path, run, factor="2.0", num_warps=4, **env):
    program = tmp_path / f"scale_{run}.py"
    program.write_text(PROGRAM.replace("FACTOR", factor))
    base = hermetic.stock_env("DISABLE_LLVM")
    result = subprocess.run(
        [sys.executable, str(program), str(num_warps)], capture_output=True, text=True, timeout=300,
        env=dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}",
                 TRITON_CACHE_DIR=str(tmp_path / f"c{run}"), KILN_FILES_DIR=str(tmp_path / f"f{run}"), **env))
    assert result.returncode == 0, result.stderr[-3000:]


def misses(kilnd):
    listed = subprocess.run([str(KILN), "--endpoint", f"unix:{kilnd.socket}", "misses", "--json"],
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout).get("misses", [])


def test_each_changed_input_of_a_kernel_is_the_reason_its_lookup_missed(tmp_path):
    kilnd = Kilnd(tmp_path / "kilnd", f"--toolchain={sys.executable}")
    try:
        steps = [  # (what the user changed, the run, the reasons kilnd must give)
            ({}, "first", ["new kernel"]),
            ({}, "again", None),  # the same kernel again: a hit, no miss
            ({"factor": "3.0"}, "source", ["source"]),
            ({"factor": "3.0", "num_warps": 8}, "options", ["options"]),
            ({"factor": "3.0", "num_warps": 8, "DISABLE_LLVM_OPT": "1"}, "env", ["env"]),
        ]
        seen = 0
        for change, run, reasons in steps:
            compile_scale(kilnd, tmp_path, run, **change)
            found = misses(kilnd)
            if reasons is None:
                assert len(found) == seen, found
                continue
            seen += 1
            assert len(found) == seen and found[-1]["reasons"] == reasons, (run, found)
            assert found[-1]["kernel"] == "scale@cuda:90" and found[-1]["namespace"] == "triton"

        # Evicted: the first version again, after its entry went.
        assert subprocess.run([str(KILN), "--endpoint", f"unix:{kilnd.socket}", "gc", "0"]).returncode == 0
        compile_scale(kilnd, tmp_path, "evicted")
        assert misses(kilnd)[-1]["reasons"] == ["evicted"]

        by_reason = {r.reason: r.count for r in kilnd.stats().misses_by_reason}
        assert by_reason == {"new kernel": 1, "source": 1, "options": 1, "env": 1, "evicted": 1}, by_reason
        text = subprocess.run([sys.executable, "-m", "kiln", "misses", "--last", "2"], capture_output=True, text=True,
                              env=dict(os.environ, KILN_ENDPOINT=f"unix:{kilnd.socket}"), timeout=60)
        assert text.returncode == 0 and len(text.stdout.splitlines()) == 2, text
        assert "scale@cuda:90" in text.stdout and "evicted" in text.stdout.splitlines()[-1]
    finally:
        kilnd.stop()


def test_a_key_whose_claim_lapsed_with_nothing_stored_misses_as_abandoned_not_evicted(tmp_path):
    config = tmp_path / "kilnd.conf"
    config.write_text("claim_timeout_seconds = 1\n")
    kilnd = Kilnd(tmp_path / "kilnd", f"--config={config}")
    try:
        components = _api.KeyComponents(kernel="k@cuda:90", toolchain="t1", source="s1", backend="12.8-90",
                                        options="o1", env="e1")
        request = _api.LookupRequest(namespace="triton", key="key1", claimant="stuck", key_components=components)
        call = kilnd.stub.LookupOrClaim(request)
        assert next(call).claimed
        # The claimant neither renews nor stores: kilnd ends the claim (and the call).
        assert list(call) == []
        call = kilnd.stub.LookupOrClaim(request)
        assert next(call).claimed
        call.cancel()
        assert [list(miss.reasons) for miss in kilnd.stub.ListMisses(_api.ListMissesRequest(last=2)).misses] == [
            ["new kernel"], ["abandoned"]]
    finally:
        kilnd.stop()


def test_a_new_triton_or_ptxas_is_named_and_misses_stay_with_their_trust_domain(tmp_path):
    kilnd = Kilnd(tmp_path / "kilnd")
    try:
        components = dict(kernel="k@cuda:90", toolchain="t1", source="s1", backend="12.8-90", options="o1", env="e1")

        def miss(key, **changed):
            call = kilnd.stub.LookupOrClaim(_api.LookupRequest(
                namespace="triton", key=key, claimant="test",
                key_components=_api.KeyComponents(**dict(components, **changed))))
            assert next(call).claimed
            call.cancel()
            return kilnd.stub.ListMisses(_api.ListMissesRequest(last=1)).misses[-1].reasons

        assert list(miss("key1")) == ["new kernel"]
        assert list(miss("key2", toolchain="t2")) == ["toolchain"]
        assert list(miss("key3", toolchain="t2", backend="13.0-90", source="s2")) == ["backend", "source"]
        # A client that sends no components still gets its miss counted.
        call = kilnd.stub.LookupOrClaim(_api.LookupRequest(namespace="triton", key="key4", claimant="test"))
        assert next(call).claimed
        call.cancel()
        assert list(kilnd.stub.ListMisses(_api.ListMissesRequest(last=1)).misses[-1].reasons) == ["unknown"]
        long = _api.LookupRequest(namespace="triton", key="key5", key_components=_api.KeyComponents(kernel="k" * 300))
        try:
            kilnd.stub.Lookup(long)
            raise AssertionError("a 300-character component was accepted")
        except Exception as error:  # noqa: BLE001
            assert "at most 256 characters" in str(error)
    finally:
        kilnd.stop()


def test_what_kilnd_saw_of_each_kernel_survives_a_restart_and_a_damaged_history_starts_over(tmp_path):
    components = dict(kernel="k@cuda:90", toolchain="t1", source="s1", backend="12.8-90", options="o1", env="e1")

    def miss(kilnd, key, **changed):
        call = kilnd.stub.LookupOrClaim(_api.LookupRequest(
            namespace="triton", key=key, claimant="test",
            key_components=_api.KeyComponents(**dict(components, **changed))))
        assert next(call).claimed
        # Compiled and stored, as a client does with what it claimed.
        kilnd.stub.Put(_api.PutRequest(namespace="triton", key=key, blobs=[_api.blob("k.cubin", key.encode())]))
        call.cancel()
        return list(kilnd.stub.ListMisses(_api.ListMissesRequest(last=1)).misses[-1].reasons)

    kilnd = Kilnd(tmp_path / "kilnd")
    try:
        assert miss(kilnd, "key1") == ["new kernel"]
    finally:
        kilnd.stop()  # an orderly stop, as for an upgrade
    kilnd = Kilnd(tmp_path / "kilnd")
    try:
        kilnd.stub.Evict(_api.EvictRequest(target_bytes=0))
        assert miss(kilnd, "key2", options="o2") == ["options"]
        assert miss(kilnd, "key1") == ["evicted"]  # compiled before the restart, and gone since
    finally:
        kilnd.stop()

    [history] = (tmp_path / "kilnd").rglob("miss-history.pb")
    history.write_bytes(b"\xff not a history")
    kilnd = Kilnd(tmp_path / "kilnd")
    try:
        assert miss(kilnd, "key3", options="o3") == ["new kernel"]
        assert "miss history" in (kilnd.root / "kilnd.out").read_text()
    finally:
        kilnd.stop()
