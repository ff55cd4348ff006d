"""The Python client (client/python, import name kiln) in fresh interpreters,
activated the way users do: KILN=1 through the .pth file, or kiln.enable()."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import triton
from kiln.service import api
from kiln.triton.versions import triton_key

import hermetic
from conftest import BUILD, PROBE, Kilnd, kilnd_processes_with, probe_json, run_probe, tcp_kilnd
from test_launcher import libcuda_dir  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def base_env(tmp_path):
    env = hermetic.stock_env()
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    env["KILN_FILES_DIR"] = str(tmp_path / "kiln-files")
    return env


@pytest.fixture
def kiln_env(base_env, kilnd):
    return dict(base_env, KILN="1", KILN_ENDPOINT=f"unix:{kilnd.socket}")


def test_pth_activation_reaches_a_subprocess(kiln_env):
    result = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('TRITON_CACHE_MANAGER'))"],
                            capture_output=True, text=True, env=kiln_env, check=True)
    assert result.stdout.strip() == "kiln._cache:KilnCacheManager"


def test_pth_does_nothing_without_the_variable(base_env):
    result = subprocess.run([sys.executable, "-c", "import os, sys; print(os.environ.get('TRITON_CACHE_MANAGER'),"
                             " 'kiln' in sys.modules)"], capture_output=True, text=True, env=base_env, check=True)
    assert result.stdout.strip() == "None False"


def test_pth_activation_imports_nothing_but_kilns_table_of_patches(base_env):
    """Every process under KILN=1 pays its start-up, subprocesses and inductor's
    compile workers included: what it imports beyond a stock start is Kiln's
    own few lines, never a library (logging alone was 15 ms of a 50 ms start)."""
    show_modules = "import sys; print(' '.join(sorted(sys.modules)))"

    def modules(env):
        return set(subprocess.run([sys.executable, "-c", show_modules], capture_output=True, text=True, env=env,
                                  check=True).stdout.split())

    added = modules(dict(base_env, KILN="1")) - modules(base_env)
    assert added == {"kiln", "kiln._own_modules", "kiln._autoload", "kiln.service", "kiln.service.errors",
                     "kiln.triton", "kiln._after_import", "kiln._patches"}


def test_compiles_go_through_kilnd_and_equal_stock_then_hit_in_a_new_process(kilnd, kiln_env, stock_suite):
    before = kilnd.stats()
    first = probe_json(run_probe(kiln_env, "suite"))
    after_first = kilnd.stats()
    assert first["kernels"] == stock_suite
    # Every kernel the session's earlier tests had not compiled went through a worker.
    assert after_first.compiles + after_first.compile_cache_hits > before.compiles + before.compile_cache_hits
    second = probe_json(run_probe(kiln_env, "suite"))
    after_second = kilnd.stats()
    assert second["kernels"] == stock_suite
    assert second["frontend_runs"] == 0, "a cache hit must not run Triton's frontend"
    assert after_second.compiles == after_first.compiles
    assert after_second.hits - after_first.hits >= 30


def _artifacts_in(files_dir):
    """The files a client wrote under its files dir, the memos of _triton_memos aside."""
    return [path for path in files_dir.rglob("*") if path.is_file() and path.relative_to(files_dir).parts[0] != "memos"]


def test_a_process_with_no_files_of_its_own_reads_kilnds_files(kilnd, kiln_env, tmp_path, stock_suite):
    run_probe(kiln_env, "suite")  # kilnd has every kernel now
    fresh = dict(kiln_env, KILN_FILES_DIR=str(tmp_path / "new-files"), TRITON_CACHE_DIR=str(tmp_path / "new-cache"))
    before = kilnd.stats()
    result = probe_json(run_probe(fresh, "suite"))
    assert result["kernels"] == stock_suite
    assert result["frontend_runs"] == 0
    # A new venv, container or user session: it wrote no artifact (only the
    # memos of _triton_memos), it read the files kilnd serves to its own
    # account (from kilnd's index, or named in a lookup's answer) ...
    assert not _artifacts_in(tmp_path / "new-files")
    # ... and kilnd still saw every hit, for its stats and LRU.
    assert kilnd.stats().hits - before.hits >= len(stock_suite)


def test_a_cold_process_keeps_no_file_of_its_own_where_kilnd_serves_it_and_the_next_reads_kilnds(
        fresh_kilnd, base_env, tmp_path, stock_suite):
    kilnd = fresh_kilnd(f"--toolchain={sys.executable}", "--compile-workers=2")  # an empty store: all cold
    env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}")
    cold = probe_json(run_probe(env, "suite"))
    assert cold["kernels"] == stock_suite
    assert kilnd.stats().compiles >= len(stock_suite) // 2  # compiled by kilnd, not found in it
    # Triton got kilnd's served files for every compile: the client wrote
    # files only while kilnd had none (its scratch, gone by its exit), kept no
    # copy and no index entry of its own.
    assert not _artifacts_in(tmp_path / "kiln-files")
    fresh = dict(env, KILN_FILES_DIR=str(tmp_path / "new-files"), TRITON_CACHE_DIR=str(tmp_path / "new-cache"))
    marker = tmp_path / "client-imported"
    warm = probe_json(run_probe(fresh, "suite", "--note-client-import", str(marker)))
    assert warm["kernels"] == stock_suite
    assert warm["frontend_runs"] == 0
    assert not marker.exists(), "a kernel was not in kilnd's index: the process asked kilnd"


def test_a_process_whose_every_lookup_hits_kilnds_files_never_connects_to_kilnd_yet_kilnd_counts_each_hit(
        kilnd, kiln_env, tmp_path, stock_suite):
    run_probe(kiln_env, "suite")  # kilnd has every kernel now
    fresh = dict(kiln_env, KILN_FILES_DIR=str(tmp_path / "new-files"), TRITON_CACHE_DIR=str(tmp_path / "new-cache"))
    run_probe(fresh, "suite")  # kilnd serves every kernel as files by now, if not ahead of this
    again = dict(fresh, TRITON_CACHE_DIR=str(tmp_path / "newer-cache"))
    before = kilnd.stats()
    marker = tmp_path / "client-imported"
    result = probe_json(run_probe(again, "suite", "--note-client-import", str(marker)))
    assert result["kernels"] == stock_suite
    # Not while it ran, not at its exit: its hits went to kilnd as a journal file ...
    assert not marker.exists()
    # ... which kilnd took and counted.
    assert kilnd.stats().hits - before.hits >= len(stock_suite)
    assert not list((kilnd.root / "data" / "files" / "hits").glob("*.hits"))


def test_enable_in_code_reaches_an_inductor_style_worker(kilnd, base_env, stock_suite):
    env = dict(base_env, KILN_ENDPOINT=f"unix:{kilnd.socket}")
    before = kilnd.stats().hits
    child = probe_json(run_probe(env, "spawn-child", "--enable"))
    assert child["cache_manager"] == "kiln._cache:KilnCacheManager"
    assert child["kernels"] == stock_suite
    assert kilnd.stats().hits - before >= 30


def test_ptxas_failure_raises_tritons_ptxas_error(kiln_env):
    result = probe_json(run_probe(kiln_env, "ptxas-error"))
    assert result["raised"] == "PTXASError"
    assert "ptxas" in result["message"]


def test_a_kernel_whose_frontend_fails_never_makes_anyone_wait(kilnd, kiln_env):
    # The claimant fails in the frontend: it must release its claim at once, so
    # its own second attempt and the next process get their error promptly,
    # instead of waiting out the claim's last-resort timeout.
    for _ in range(2):
        attempts = probe_json(run_probe(kiln_env, "frontend-error"))["attempts"]
        assert [attempt["raised"] for attempt in attempts] == ["CompilationError"] * 2
        assert max(attempt["seconds"] for attempt in attempts) < 1.0, attempts


def test_what_the_frontend_showed_is_shown_where_stock_would_have_compiled(kilnd, base_env, kiln_env, tmp_path):
    # Stock in a cache dir of its own: Kiln's dir must not get the kernel from it.
    stock = probe_json(run_probe(dict(base_env, TRITON_CACHE_DIR=str(tmp_path / "stock")), "where-warning"))
    assert any("UserWarning" in warning for warning in stock["warnings"]), stock
    assert "compiling where_warning_kernel" in stock["printed"]
    compiled = probe_json(run_probe(kiln_env, "where-warning"))
    # A new Triton cache dir: stock would compile, and warn and print again.
    served = probe_json(run_probe(dict(kiln_env, TRITON_CACHE_DIR=str(tmp_path / "another")), "where-warning"))
    assert served["frontend_runs"] == 0
    for result in (compiled, served):
        assert (result["warnings"], result["printed"], result["ptx"]) == (stock["warnings"], stock["printed"],
                                                                          stock["ptx"])
    # The same cache dir again: a hit there, silent as stock's.
    again = probe_json(run_probe(kiln_env, "where-warning"))
    assert again["frontend_runs"] == 0
    assert (again["warnings"], again["printed"]) == ([], "")


@pytest.mark.parametrize("stage", ["ttgir", "ptx"])
def test_ir_override_compiles_exactly_as_stock(kilnd, base_env, kiln_env, tmp_path, monkeypatch, stage):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compiler as triton_compiler

    import kernel_suite

    # Stock's own IR for the kernel, changed so that the override shows.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "stock-ir"))
    case = kernel_suite.SUITE[0]
    plain = triton.compile(triton_compiler.ASTSource(case.fn, case.signature, case.constexprs),
                           target=GPUTarget("cuda", 90, 32), options=case.options)
    text = plain.asm[stage]
    changed = text.replace("arith.addf", "arith.subf") if stage == "ttgir" else text + "\n// kiln-override\n"
    assert changed != text
    override = tmp_path / f"override.{stage}"
    override.write_text(changed)
    stock = probe_json(run_probe(base_env, "override", str(override)))
    through_kilnd = probe_json(run_probe(kiln_env, "override", str(override)))
    assert through_kilnd["asm"] == stock["asm"]
    assert stock["ptx_text"] != plain.asm["ptx"], "the override must change the kernel"


def test_a_kernel_from_kilnds_cache_reads_its_ir_texts_only_when_asked(kilnd, kiln_env, stock_suite):
    run_probe(kiln_env, "first")  # kilnd has the kernel: the probe's load is a hit
    result = probe_json(run_probe(kiln_env, "deferred-texts"))
    stock = next(kernel for name, kernel in stock_suite.items() if name.endswith("-sm90"))
    # Loading it read what a launch needs, and no IR text ...
    assert result["at_load"] == ["cubin", "json"]
    # ... a text is read when first asked for, once ...
    assert result["on_llir"] == ["llir"]
    # ... and one whose file went away since is served by kilnd again.
    assert result["ptx"] == stock["asm"]["ptx"]
    # Its asm is stock's: the same texts under the same keys in the same order,
    # and it pickles as Triton's own AsmDict (a process without Kiln reads it).
    assert result["asm"] == stock["asm"]
    assert result["asm_keys"] == stock["asm_keys"]
    assert result["pickled_type"] == "AsmDict"
    assert result["pickled"] == stock["asm"]


def test_a_kernel_kilnd_just_compiled_is_the_processs_next_hit_not_compiled_again(base_env, kiln_env, tmp_path):
    """Upstream's test_higher_order_kernel, compile-only (it failed 1 run in 2
    on the GPU machine): kilnd answers a compile before it stores it, and the
    same process's next lookup of the kernel (its JIT's cache cleared) took its
    own claim over and compiled the kernel again, printing its static_print
    twice. Six rounds: the lookup came first in about half of them."""
    stock = probe_json(run_probe(base_env, "higher-order", "6"))
    assert stock["frontend_runs"] == 12 and len(stock["printed"]) == 12
    kiln = probe_json(run_probe(dict(kiln_env, KILN_STRICT="1", TRITON_CACHE_DIR=str(tmp_path / "kiln-cache")),
                                "higher-order", "6"))
    assert kiln["printed"] == stock["printed"]
    assert kiln["frontend_runs"] == 12


def test_a_kernel_compiled_for_this_process_loads_with_its_texts_as_made_not_read_back(
        base_env, tmp_path, stock_suite):
    kilnd = Kilnd(tmp_path / "kilnd", f"--toolchain={sys.executable}")
    try:
        kilnd.wait_for_workers_started(1)  # so kilnd compiles the kernel, not the client while it starts
        env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}")
        result = probe_json(run_probe(env, "deferred-texts"))
        assert kilnd.stats().compiles == 1
    finally:
        kilnd.stop()
    stock = next(kernel for name, kernel in stock_suite.items() if name.endswith("-sm90"))
    # Triton's CompiledKernel read back what stock's reads for a launch, and no
    # text: each is what the compile handed Triton's cache, in memory.
    assert result["at_load"] == ["cubin", "json"] and result["on_llir"] == []
    assert result["asm"] == stock["asm"] and result["ptx"] == stock["asm"]["ptx"]
    assert result["asm_keys"] == stock["asm_keys"]
    assert result["pickled_type"] == "AsmDict" and result["pickled"] == stock["asm"]


def test_a_text_asked_for_once_its_file_and_kilnd_are_gone_raises_a_clear_error(base_env, tmp_path):
    kilnd = Kilnd(tmp_path / "kilnd")
    env = dict(base_env, KILN="1", KILN_ENDPOINT=f"unix:{kilnd.socket}")
    probe = None
    try:
        run_probe(env, "first")
        probe = subprocess.Popen([sys.executable, str(PROBE), "text-gone"], env=env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert probe.stdout.readline().strip() == "loaded"
    except BaseException:
        if probe is not None:
            probe.kill()
        raise
    finally:
        kilnd.stop()
    out, err = probe.communicate("kilnd is gone\n", timeout=120)
    assert probe.returncode == 0, err[-4000:]
    result = json.loads(out.splitlines()[-1])
    assert result["error"] == "FileNotFoundError"
    assert "ttgir" in result["message"] and "no longer in Kiln's cache" in result["message"]
    assert "Compile the kernel again" in result["message"]
    assert result["cubin"]  # the kernel itself is whole


@pytest.mark.parametrize("how", ["evicted", "deleted"])
def test_a_hit_whose_files_go_before_it_loads_is_looked_up_again_and_loads_stocks_kernel(
        base_env, tmp_path, stock_suite, how):
    kilnd = Kilnd(tmp_path / "kilnd", f"--toolchain={sys.executable}")
    env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}")
    try:
        run_probe(env, "first")
        result = probe_json(run_probe(env, "hit-gone", how))
    finally:
        kilnd.stop()
    stock = next(kernel for name, kernel in stock_suite.items() if name.endswith("-sm90"))
    assert result["gone"] == [False]
    assert result["cubin"] == stock["asm"]["cubin"] and result["ptx"] == stock["asm"]["ptx"]
    # Evicted: compiled again; deleted by hand: kilnd still has the kernel, and serves it anew.
    assert result["frontend_runs"] == (1 if how == "evicted" else 0)


def test_launcher_modules_are_built_by_kilnd(kilnd, kiln_env, libcuda_dir):  # noqa: F811
    before = kilnd.stats()
    env = dict(kiln_env, LD_LIBRARY_PATH=str(libcuda_dir))
    result = probe_json(run_probe(env, "launcher", str(libcuda_dir)))
    after = kilnd.stats()
    assert result["launch"] is True
    assert after.launcher_builds + after.launcher_cache_hits > before.launcher_builds + before.launcher_cache_hits


@pytest.mark.parametrize("kilnds", ["local", "fleet"])
def test_a_kernel_missed_for_this_machines_gpu_has_its_launcher_built_while_it_compiles(base_env, libcuda_dir,
                                                                                        tmp_path, kilnds):
    # kilnds of its own: a kernel another test compiled would be a hit here. A
    # fleet's kilnds take their callers for remote ones, which get launchers
    # built only from what generated the source.
    if kilnds == "local":
        servers = [Kilnd(tmp_path / "kilnd", f"--toolchain={sys.executable}")]
        endpoint = f"unix:{servers[0].socket}"
    else:
        servers = [tcp_kilnd(tmp_path / f"kilnd{i}", f"--toolchain={sys.executable}") for i in range(2)]
        endpoint = ",".join(server.tcp_address() for server in servers)
    try:
        env = dict(base_env, KILN="1", KILN_ENDPOINT=endpoint, LD_LIBRARY_PATH=str(libcuda_dir),
                   TRITON_LIBCUDA_PATH=str(libcuda_dir))
        result = probe_json(run_probe(env, "early-launcher"))
    finally:
        for server in servers:
            assert server.stop() == 0, (server.root / "kilnd.out").read_text()
    assert result["target"] == ["cuda", 90, 32]
    # kilnd built the sm90 kernel's launcher before Triton asked for it (and
    # none for the kernel of another GPU, asked for first) ...
    assert result["while_compiling"] == 1
    # ... and loading the kernel took that build instead of asking again.
    assert result["in_all"] == 1
    assert result["callable"] is True


def test_kernels_of_one_launcher_source_share_the_module_loaded_first(base_env, kiln_env, libcuda_dir):  # noqa: F811
    libcuda = {"LD_LIBRARY_PATH": str(libcuda_dir), "TRITON_LIBCUDA_PATH": str(libcuda_dir)}
    stock = probe_json(run_probe(dict(base_env, **libcuda), "launchers"))
    # Stock imports the module file again for each kernel, and gets the same
    # function each time (Python keeps a single-phase module's first state).
    assert stock["imports"] == 3 and stock["one_launch_function"] and stock["callable"]
    through_kilnd = probe_json(run_probe(dict(kiln_env, **libcuda), "launchers"))
    assert through_kilnd["imports"] == 1, "the later kernels imported their launcher again"
    assert through_kilnd["one_launch_function"] and through_kilnd["callable"]
    disabled = probe_json(run_probe(dict(kiln_env, **libcuda), "launchers", "--disable"))
    assert disabled["imports"] == 3, "kiln.disable() left launchers reused"


def test_a_new_process_finds_a_launcher_module_by_kilnds_link_without_a_call(kilnd, kiln_env, libcuda_dir,
                                                                              tmp_path):
    env = dict(kiln_env, LD_LIBRARY_PATH=str(libcuda_dir))
    run_probe(env, "launcher", str(libcuda_dir))  # kilnd has the module now
    fresh = dict(env, KILN_FILES_DIR=str(tmp_path / "new-files"), TRITON_CACHE_DIR=str(tmp_path / "new-cache"))
    run_probe(fresh, "launcher", str(libcuda_dir))  # kilnd links it by now, if not ahead of this lookup
    result = probe_json(run_probe(fresh, "launcher", str(libcuda_dir)))
    assert result["launch"] is True
    # Triton's get_file answered with one stat, as in its own file cache: kilnd's
    # link to the module, no call to kilnd (its client not even imported) ...
    module = Path(result["path"])
    assert module.parent.parent.name == "links" and module.is_symlink(), module
    assert result["kilnd_client_imported"] is False
    # ... and nothing written for this process.
    assert not _artifacts_in(tmp_path / "new-files")


def test_a_strict_process_whose_kernels_come_from_local_files_builds_launchers_through_kilnd(
        kilnd, kiln_env, libcuda_dir):  # noqa: F811
    env = dict(kiln_env, LD_LIBRARY_PATH=str(libcuda_dir))
    run_probe(env, "unloadable-launcher", "put")
    before = kilnd.stats()
    result = probe_json(run_probe(dict(env, KILN_STRICT="1"), "unloadable-launcher", "build", str(libcuda_dir)))
    # Everything came from local files until the module in the cache failed
    # to load, so nothing had activated Kiln: still kilnd built it, not the
    # machine's C compiler (which an embedded Python, lacking Python.h, fails).
    assert result["kilnd_client_imported_before_build"] is False
    assert kilnd.stats().launcher_builds > before.launcher_builds
    assert result["machine_compiles"] == 0
    assert result["launch"] is True


def test_kilns_build_hook_is_set_only_while_kiln_is_enabled_and_the_user_has_none(base_env, kiln_env):
    show = ("import json, kiln, triton.knobs as knobs\n"
            "hook = knobs.build.impl\n"
            "states = [hook is not None]\n"
            "kiln.disable()\n"
            "states.append(knobs.build.impl is None)\n"
            "kiln.enable()\n"
            "states.append(knobs.build.impl is hook)\n"
            "kiln.disable()\n"
            "knobs.build.impl = print\n"
            "kiln.enable()\n"
            "states.append(knobs.build.impl is print)\n"
            "print(json.dumps(states))\n")
    states = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, env=kiln_env, check=True)
    # Set as triton.knobs is imported, gone with disable(), back with enable(),
    # and never in place of the user's own.
    assert json.loads(states.stdout) == [True, True, True, True]
    stock = subprocess.run([sys.executable, "-c", "import triton.knobs as k; print(k.build.impl)"],
                           capture_output=True, text=True, env=base_env, check=True)
    assert stock.stdout.strip() == "None"


def test_whether_kiln_serves_is_answered_while_another_thread_is_importing_its_triton_side(base_env, tmp_path):
    # Inductor asks (its pool's gate) from one thread while a compile thread
    # imports kiln.triton.remote: sys.modules holds it half made, without
    # its functions. That is a Kiln not fallen back, never an AttributeError
    # in the user's torch.compile (as the H100 bench met).
    check = (
        "import sys, types, kiln, kiln.triton\n"
        "sys.modules['kiln.triton.remote'] = types.ModuleType('kiln.triton.remote')\n"
        "print(kiln.triton.serving(), kiln.is_enabled())\n")
    env = dict(base_env, KILN="1", KILN_ENDPOINT=f"unix:{tmp_path / 'none.sock'}")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout.split() == ["True", "True"], done.stderr[-2000:]


def test_cache_manager_keys_decode_to_the_hex_kilnd_keys_by():
    from triton.runtime.cache import _base32

    from kiln.triton.keys import hex_key

    for size in (0, 1, 3, 5, 16, 32, 33):
        key = os.urandom(size).hex()
        assert hex_key(_base32(key)) == key
    # What is not base32 (a manager made by other code) is kept as it is.
    for other in ("abc", "a" * 52, "0" * 52, "A B", "A", "AB=C"):
        assert hex_key(other) == other


def test_inductors_cache_entries_kilnd_serves_as_files_are_read_without_a_call(kilnd, kiln_env, tmp_path):
    key = f"fx-graph-{os.getpid()}-{tmp_path.name}"
    run_probe(kiln_env, "inductor-cache", "put", key)
    run_probe(kiln_env, "inductor-cache", "get", key)  # kilnd serves it as a file by now, if not ahead of this
    before = kilnd.stats().hits
    result = probe_json(run_probe(kiln_env, "inductor-cache", "get", key))
    assert result == dict(result, found=True, kilnd_client_imported=False)
    assert kilnd.stats().hits > before  # still counted, in a batch at exit
    # A key kilnd does not have goes to kilnd, and misses.
    assert probe_json(run_probe(kiln_env, "inductor-cache", "get", key + "-other"))["found"] is False


def test_without_kilnd_compiles_fall_back_to_stock_with_one_warning(base_env, tmp_path, stock_suite):
    env = dict(base_env, KILN="1", KILN_ENDPOINT=f"unix:{tmp_path / 'nobody-listens.sock'}")
    result = run_probe(env, "suite")
    assert probe_json(result)["kernels"] == stock_suite
    warnings = [line for line in result.stderr.splitlines() if "kiln:" in line and "stock Triton" in line]
    assert len(warnings) == 1, result.stderr


def test_strict_mode_refuses_to_compile_without_kilnd(base_env, tmp_path):
    env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{tmp_path / 'nobody-listens.sock'}")
    result = run_probe(env, "suite", check=False)
    assert result.returncode != 0
    assert "KilnUnavailable" in result.stderr and "not reachable" in result.stderr


def test_status_reports_service_toolchain_and_cache(kilnd, kiln_env):
    result = subprocess.run([sys.executable, "-m", "kiln", "status"], capture_output=True, text=True,
                            env=kiln_env, check=True)
    assert "kilnd 0.1.0" in result.stdout
    # The binary serving, not merely one the client could start.
    assert f"binary:    {(BUILD / 'service' / 'kilnd').resolve()}" in result.stdout.splitlines(), result.stdout
    assert "registered" in result.stdout
    assert "support:   tested (Kiln is tested with triton 3.4 to 3.9)" in result.stdout
    assert "hits" in result.stdout
    # kilnd built a module for this Python, and it loaded here.
    assert "launchers: kilnd builds them, and this Python loads them" in result.stdout, result.stdout


def test_shipped_api_descriptor_matches_the_proto(tmp_path):
    regenerated = tmp_path / "kiln_v1.desc"
    subprocess.run(["protoc", "--include_imports", f"--descriptor_set_out={regenerated}", f"-I{REPO / 'proto'}",
                    "kiln/v1/kiln.proto"], check=True)
    shipped = REPO / "client" / "python" / "kiln" / "service" / "kiln_v1.desc"
    assert regenerated.read_bytes() == shipped.read_bytes(), "run scripts/gen-python-api"


def test_cubins_are_also_where_inductors_static_launcher_looks(kiln_env, tmp_path, stock_suite):
    run_probe(kiln_env, "suite")  # compiled, or hits if another test compiled the suite already
    run_probe(kiln_env, "suite")  # hits
    cubins = lambda: list((tmp_path / "triton-cache").glob("*/*.cubin"))
    # Kiln writes no cubin in Triton's cache dir, compiling or hitting, unless
    # inductor (whose static launcher reads <cache dir>/<key>/<kernel>.cubin)
    # is loaded.
    assert not cubins()
    run_probe(dict(kiln_env, TRITON_CACHE_DIR=str(tmp_path / "other-cache")), "suite")
    assert not list((tmp_path / "other-cache").glob("*/*.cubin"))
    run_probe(kiln_env, "suite", "--as-inductor")
    assert len(cubins()) == len(stock_suite)


def test_client_starts_the_users_kilnd_once_when_none_is_running(base_env, tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_KILND=str(BUILD / "service" / "kilnd"),
               XDG_RUNTIME_DIR=str(runtime), XDG_CACHE_HOME=str(tmp_path / "cache"))
    # Three processes find no kilnd at once; the lock lets exactly one start it.
    probes = [subprocess.Popen([sys.executable, str(PROBE), "ptxas-error"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        for probe in probes:
            out, err = probe.communicate(timeout=300)
            assert probe.returncode == 0, err[-3000:]
            assert probe_json(subprocess.CompletedProcess([], 0, out, err))["raised"] == "PTXASError"
        started = kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime))
        assert len(started) == 1
        assert (runtime / "kiln" / "kilnd.sock").exists()
    finally:
        for pid in kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime)):
            os.kill(pid, 15)


def test_loading_tritons_jit_starts_the_users_kilnd_with_this_pythons_toolchain_before_any_compile(
        base_env, tmp_path):
    runtime, cache = tmp_path / "run", tmp_path / "cache"
    runtime.mkdir(mode=0o700)
    env = dict(base_env, KILN="1", KILN_KILND=str(BUILD / "service" / "kilnd"), XDG_RUNTIME_DIR=str(runtime),
               XDG_CACHE_HOME=str(cache))
    socket_path, log = runtime / "kiln" / "kilnd.sock", cache / "kiln" / "logs" / "kilnd.log"
    # The process compiles nothing, and waits for the socket (the thread dies with it).
    waits = ("import os, sys, time, triton\n"
             f"deadline = time.monotonic() + 60\n"
             f"while not os.path.exists({str(socket_path)!r}) and time.monotonic() < deadline:\n"
             "    time.sleep(0.05)\n"
             "print('kiln.service.connection' in sys.modules)\n")

    def client_imported():
        result = subprocess.run([sys.executable, "-c", waits], env=env, capture_output=True, text=True,
                                check=True, timeout=120)
        assert socket_path.exists(), result.stderr[-3000:]
        return result.stdout.strip() == "True"

    def start_and_list_toolchains():
        # While kilnd starts, the process imports what its first compile will need.
        assert client_imported()
        # kilnd serves at once; the list waits for the probe of a toolchain it never saw.
        with grpc.insecure_channel(f"unix:{socket_path}") as channel:
            return api.KilnStub(channel).ListToolchains(api.ListToolchainsRequest(), timeout=60).toolchains

    try:
        listed = start_and_list_toolchains()
        assert [t.python_executable for t in listed] == [os.path.normpath(sys.executable)]
        assert len(kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime))) == 1
        python = os.path.normpath(sys.executable)
        assert f"toolchain: triton {triton.__version__} at {python}\n" in log.read_text()
        # Where kilnd runs already, a process pays a socket connect: no client import, no second kilnd.
        assert not client_imported()
        assert len(kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime))) == 1
        # The next kilnd (this one idles out, or is stopped) takes the probe from its memo.
        for pid in kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime)):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime)) and time.monotonic() < deadline:
            time.sleep(0.05)
        listed = start_and_list_toolchains()
        assert [t.triton_key for t in listed] == [triton_key()]
        assert (f"toolchain: triton {triton.__version__} at {python} (as probed at an earlier start)"
                in log.read_text())
    finally:
        for pid in kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime)):
            os.kill(pid, signal.SIGTERM)
    # Turned off: nothing starts before a compile needs kilnd.
    env["KILN_EARLY_START"] = "0"
    subprocess.run([sys.executable, "-c", "import triton, time; time.sleep(2)"], env=env, check=True, timeout=60)
    assert not kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime))


def test_a_compile_while_kilnds_worker_still_starts_runs_here_as_stocks_and_kilnd_stores_it(
        base_env, tmp_path, stock_suite):
    # The toolchain's interpreter, through a script that stalls its workers'
    # start while <tmp>/slow exists: a worker that takes its time importing triton.
    slow, python = tmp_path / "slow", tmp_path / "python"
    python.write_text(f"#!/bin/sh\nwhile [ -e {slow} ]; do sleep 0.05; done\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    Kilnd(tmp_path / "k", f"--toolchain={python}").stop()  # probed, and remembered
    slow.touch()
    kilnd = Kilnd(tmp_path / "k", f"--toolchain={python}")  # from the memo: its worker starts, and stalls
    try:
        assert "(as probed at an earlier start)" in (tmp_path / "k" / "kilnd.out").read_text()
        env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}")
        # Bounded: a compile that waited for the worker would wait until `slow` goes.
        first = probe_json(subprocess.run([sys.executable, str(PROBE), "first"], env=env, capture_output=True,
                                          text=True, check=True, timeout=120))
        assert first["kernels"]["add_fp32-sm90"] == stock_suite["add_fp32-sm90"]
        stats = kilnd.stats()
        assert stats.compiles == 0, "the program waited for the worker's start"
        # What the program compiled, kilnd stored: another process hits it, and no worker compiles it.
        again = probe_json(run_probe(dict(env, KILN_FILES_DIR=str(tmp_path / "other-files"),
                                          TRITON_CACHE_DIR=str(tmp_path / "other-cache")), "first"))
        assert again["kernels"]["add_fp32-sm90"] == stock_suite["add_fp32-sm90"]
        assert kilnd.stats().compiles == 0
    finally:
        slow.unlink(missing_ok=True)
        assert kilnd.stop() == 0


def test_a_process_compiles_its_first_kernel_itself_while_the_client_of_kilnd_loads_and_kilnd_stores_it(
        base_env, tmp_path, fresh_kilnd, stock_suite):
    kilnd = fresh_kilnd(f"--toolchain={sys.executable}")
    env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}",
               KILN_FIRST_COMPILE_HERE="1")

    def probe(name, kind, **settings):
        return probe_json(run_probe(dict(env, KILN_FILES_DIR=str(tmp_path / f"{name}-files"),
                                         TRITON_CACHE_DIR=str(tmp_path / f"{name}-cache"), **settings), kind))

    # Turned off, a process's first miss goes to kilnd like any other.
    off = probe("off", "first-sm80", KILN_FIRST_COMPILE_HERE="0")
    assert off["kernels"]["add_fp32-sm80"] == stock_suite["add_fp32-sm80"]
    assert kilnd.stats().compiles == 1
    # A process with one kernel, which exits as soon as it has it: kilnd
    # compiles nothing, and has the kernel once the process is gone.
    first = probe("first", "first")
    assert first["kernels"]["add_fp32-sm90"] == stock_suite["add_fp32-sm90"]
    assert first["frontend_runs"] == 1 and kilnd.stats().compiles == 1
    again = probe("again", "first")
    assert again["kernels"]["add_fp32-sm90"] == stock_suite["add_fp32-sm90"]
    assert again["frontend_runs"] == 0, "kilnd lacks the kernel the first process compiled itself"
    # The suite: both add_fp32 kernels hit, the next kernel is compiled here
    # (and any other that misses before the client has loaded), every later
    # one by kilnd; all of them stock's, byte for byte, and all stored.
    suite = probe("suite", "suite")
    assert suite["kernels"] == stock_suite
    by_kilnd = kilnd.stats().compiles - 1
    assert 0 < by_kilnd <= len(stock_suite) - 3
    hit = probe("hit", "suite")
    assert hit["kernels"] == stock_suite and hit["frontend_runs"] == 0
    assert kilnd.stats().compiles == 1 + by_kilnd
    # A kernel compiled here is this process's own hit at once, as stock's files
    # are, while kilnd does not have it yet (the client's load held meanwhile).
    twice = probe_json(run_probe(dict(env, KILN_FILES_DIR=str(tmp_path / "twice-files"),
                                      TRITON_CACHE_DIR=str(tmp_path / "twice-cache")),
                                 "first-sm89-twice", "--hold-client-load"))
    assert twice["frontend_runs"] == 1 and not twice["client_loaded_meanwhile"], twice
    assert kilnd.stats().compiles == 1 + by_kilnd


def test_a_process_compiles_its_first_kernel_while_the_users_kilnd_it_started_is_still_starting(
        base_env, tmp_path, stock_suite):
    # The user's kilnd, through a script that holds its start while <tmp>/stall
    # exists: kilnd.exe under Wine may answer only after a program's first miss.
    runtime, stall, started, compiled = tmp_path / "run", tmp_path / "stall", tmp_path / "started", tmp_path / "done"
    runtime.mkdir(mode=0o700)
    kilnd = tmp_path / "kilnd"
    kilnd.write_text(f"#!/bin/sh\nwhile [ -e {stall} ]; do sleep 0.05; done\ntouch {started}\n"
                     f"exec {BUILD / 'service' / 'kilnd'} \"$@\"\n")
    kilnd.chmod(0o755)
    stall.touch()
    env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_KILND=str(kilnd), XDG_RUNTIME_DIR=str(runtime),
               XDG_CACHE_HOME=str(tmp_path / "cache"), KILN_FIRST_COMPILE_HERE="1")
    first = subprocess.Popen([sys.executable, str(PROBE), "first", "--mark-done", str(compiled)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Bounded: a compile that waited for kilnd would wait until the client's connect gives up.
        deadline = time.monotonic() + 120
        while not compiled.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert compiled.exists(), "the first compile waited for kilnd's start"
        assert not started.exists()
        # kilnd starts as the process ends, which stores what it compiled: the next process hits it.
        stall.unlink()
        out, err = first.communicate(timeout=120)
        assert first.returncode == 0, err[-3000:]
        kernels = probe_json(subprocess.CompletedProcess([], 0, out, err))["kernels"]
        assert kernels["add_fp32-sm90"] == stock_suite["add_fp32-sm90"]
        again = probe_json(run_probe(dict(env, KILN_FILES_DIR=str(tmp_path / "other-files"),
                                          TRITON_CACHE_DIR=str(tmp_path / "other-cache")), "first"))
        assert again["kernels"]["add_fp32-sm90"] == stock_suite["add_fp32-sm90"]
        assert again["frontend_runs"] == 0, "kilnd lacks the kernel compiled while it started"
    finally:
        stall.unlink(missing_ok=True)
        first.kill()
        for pid in kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime)):
            os.kill(pid, signal.SIGTERM)


def test_kilnd_serves_at_once_while_it_probes_a_toolchain_it_never_saw_and_a_compile_meanwhile_runs_here(
        base_env, tmp_path, stock_suite):
    # The toolchain's interpreter, through a script that stalls while
    # <tmp>/slow exists: a probe that takes its time importing triton, as a
    # first one does under Wine.
    slow, python = tmp_path / "slow", tmp_path / "python"
    python.write_text(f"#!/bin/sh\nwhile [ -e {slow} ]; do sleep 0.05; done\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    slow.touch()
    log = tmp_path / "k" / "kilnd.out"
    # Kilnd() waits for it to answer: one that probed before serving would not, until `slow` goes.
    kilnd = Kilnd(tmp_path / "k", f"--toolchain={python}", wait_for_toolchains=False)
    try:
        assert f"toolchain {python}: probing it in the background" in log.read_text()
        env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}")
        # Bounded: a compile that waited for a probe would wait until `slow` goes.
        first = probe_json(subprocess.run([sys.executable, str(PROBE), "first"], env=env, capture_output=True,
                                          text=True, check=True, timeout=120))
        assert first["kernels"]["add_fp32-sm90"] == stock_suite["add_fp32-sm90"]
        assert kilnd.stats().compiles == 0, "the program waited for a toolchain's probe"
        assert "toolchain: triton" not in log.read_text(), "the probe did not stall: this tests nothing"
        # What the program compiled meanwhile, kilnd stored: another process hits it.
        again = probe_json(run_probe(dict(env, KILN_FILES_DIR=str(tmp_path / "other-files"),
                                          TRITON_CACHE_DIR=str(tmp_path / "other-cache")), "first"))
        assert again["kernels"]["add_fp32-sm90"] == stock_suite["add_fp32-sm90"]
        assert kilnd.stats().compiles == 0
        # `kiln health --wait` waits for the probe too: one waiting for kilnd
        # to be ready wants to compile next.
        ready = subprocess.Popen([str(BUILD / "client" / "cpp" / "kiln"), "--endpoint", f"unix:{kilnd.socket}",
                                  "health", "--wait", "60"], stdout=subprocess.PIPE, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            ready.wait(timeout=1)
        # The probe ends: the toolchain registers (in the pool of its triton, which the
        # client's interpreter registered meanwhile), remembered for the next start.
        slow.unlink()
        assert ready.wait(timeout=60) == 0 and ready.stdout.read().startswith("SERVING")
        assert f"toolchain: triton {triton.__version__} at " in log.read_text()
    finally:
        slow.unlink(missing_ok=True)
        assert kilnd.stop() == 0
    restarted = Kilnd(tmp_path / "k", f"--toolchain={python}")
    try:
        assert f"toolchain: triton {triton.__version__} at {python} (as probed at an earlier start)" in log.read_text()
    finally:
        assert restarted.stop() == 0


def test_a_kilnd_that_cannot_be_started_is_a_clear_error_and_never_the_programs(base_env, tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    missing = tmp_path / "no-such-dir" / "kilnd"
    env = dict(base_env, KILN="1", KILN_KILND=str(missing), XDG_RUNTIME_DIR=str(runtime),
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    # Not strict: the program gets stock Triton and one warning naming the cause.
    result = run_probe(env, "first")
    assert list(probe_json(result)["kernels"]) == ["add_fp32-sm90"]
    assert result.stderr.count("could not start kilnd") == 1, result.stderr[-3000:]
    assert str(missing) in result.stderr and "KILN_KILND" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    # Strict: KilnUnavailable, naming it.
    strict = run_probe(dict(env, KILN_STRICT="1"), "first", check=False)
    assert strict.returncode != 0
    assert "KilnUnavailable" in strict.stderr and "could not start kilnd" in strict.stderr, strict.stderr[-3000:]
    assert "FileNotFoundError" not in strict.stderr.splitlines()[-1]


def test_an_unsupported_triton_is_refused_with_a_clear_message(base_env, kilnd):
    env = dict(base_env, KILN_ENDPOINT=f"unix:{kilnd.socket}")
    code = "import triton; triton.__version__ = '3.3.1'; import kiln; print(kiln.enable(), kiln.is_enabled())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == "False False"
    assert "triton 3.3.1 is not supported (Kiln supports Triton 3.4 to 3.9; upgrade triton)" in result.stderr


def test_endpoint_file_transport_serves_token_holders_only(base_env, tmp_path, stock_suite):
    """Windows' default transport, exercised on Linux: kilnd listens on 127.0.0.1 and
    writes the port and an access token to a file in a private directory; the
    client reads it and sends the token; a caller without it is refused."""
    import grpc

    from kiln.service import api as _api

    endpoint_file = tmp_path / "run" / "kilnd.endpoint"
    server = Kilnd(tmp_path / "kilnd", f"--toolchain={sys.executable}", f"--endpoint-file={endpoint_file}")
    try:
        address, token = endpoint_file.read_text().splitlines()
        assert address.startswith("127.0.0.1:") and len(token) == 64
        assert (endpoint_file.parent.stat().st_mode & 0o077) == 0, "only kilnd's user may read the token"

        env = dict(base_env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT_FILE=str(endpoint_file))
        before = server.stats().compiles
        kernels = probe_json(run_probe(env, "first"))["kernels"]
        (name, result), = kernels.items()
        assert result == stock_suite[name]
        assert server.stats().compiles == before + 1

        channel = grpc.insecure_channel(address)
        stub = _api.KilnStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.GetStats(_api.GetStatsRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert str(endpoint_file) in refused.value.details()
        with pytest.raises(grpc.RpcError) as wrong:
            stub.GetStats(_api.GetStatsRequest(), timeout=10, metadata=(("x-kiln-token", "0" * 64),))
        assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # The token makes the caller kilnd's own user: maintenance RPCs are allowed.
        verified = stub.Verify(_api.VerifyRequest(), timeout=60, metadata=(("x-kiln-token", token),))
        assert verified.corrupt_blobs == 0
        channel.close()
    finally:
        assert server.stop() == 0, (server.root / "kilnd.out").read_text()
    assert not endpoint_file.exists(), "a stopped kilnd leaves no endpoint to try"


def test_windows_clients_find_the_users_kilnd_then_the_machine_service(monkeypatch, tmp_path):
    """The client's endpoint resolution on Windows (its rules are plain path logic, so they
    run here with sys.platform set to win32): the user's own kilnd's endpoint file first,
    then the machine service's; with neither, the user's, so a kilnd can be started."""
    from kiln.service import paths as _paths

    monkeypatch.setattr(sys, "platform", "win32")
    for name in ("KILN_ENDPOINT", "KILN_ENDPOINT_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "Local"))
    monkeypatch.setenv("ProgramData", str(tmp_path / "ProgramData"))
    user_file = tmp_path / "Local" / "kiln" / "run" / "kilnd.endpoint"
    machine_file = tmp_path / "ProgramData" / "kiln" / "run" / "kilnd.endpoint"

    nothing = _paths.default_endpoint()
    assert nothing.target is None and nothing.is_user_default
    assert nothing.endpoint_file == str(user_file)
    assert str(user_file) in nothing.describe()

    # The machine service is installed but not running: its file is what to report.
    machine_file.parent.mkdir(parents=True)
    stopped = _paths.default_endpoint()
    assert stopped.target is None and not stopped.is_user_default, "never start a kilnd beside the service"
    assert str(machine_file) in stopped.describe()

    machine_file.write_text("127.0.0.1:50001\n" + "a" * 64 + "\n")
    service = _paths.default_endpoint()
    assert (service.target, service.token, service.is_user_default) == ("127.0.0.1:50001", "a" * 64, False)

    user_file.parent.mkdir(parents=True)
    user_file.write_text("127.0.0.1:50002\n" + "b" * 64 + "\n")
    mine = _paths.default_endpoint()
    assert (mine.target, mine.token, mine.is_user_default) == ("127.0.0.1:50002", "b" * 64, True)

    monkeypatch.setenv("KILN_ENDPOINT", "127.0.0.1:7733")
    assert _paths.default_endpoint().target == "127.0.0.1:7733"


def test_linux_clients_fall_back_to_the_system_units_socket(monkeypatch, tmp_path):
    """With no per-user kilnd, a client uses the system unit's socket when it can see it,
    and then never starts a kilnd of its own beside it."""
    from kiln.service import paths as _paths

    for name in ("KILN_ENDPOINT", "KILN_ENDPOINT_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "user-run"))
    machine = tmp_path / "run-kiln" / "kilnd.sock"
    monkeypatch.setattr(_paths, "machine_socket", lambda: machine)

    mine = _paths.default_endpoint()
    assert mine.target == f"unix:{tmp_path / 'user-run' / 'kiln' / 'kilnd.sock'}" and mine.is_user_default

    machine.parent.mkdir()
    machine.touch()
    service = _paths.default_endpoint()
    assert service.target == f"unix:{machine}" and not service.is_user_default

    (tmp_path / "user-run" / "kiln").mkdir(parents=True)
    (tmp_path / "user-run" / "kiln" / "kilnd.sock").touch()
    assert _paths.default_endpoint().is_user_default, "the user's own kilnd comes first"
