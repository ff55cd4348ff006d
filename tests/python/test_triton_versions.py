"""Every Triton that current torch pins (requirements-triton-matrix.txt), each in
a venv of its own (.venv-triton/VERSION, made by scripts/setup-python) with the
client installed, each with a real kilnd whose toolchain it is: the kernel
suite equal to that Triton's stock from two processes at once that compile
each kernel once, a new process that hits every kernel with no compile and no
frontend, a recording for sm80 prewarmed for sm90, an autotuned kernel's
configs compiled at once into stock's kernels, launcher modules built by
kilnd and served to a new process, failing kernels raised as stock raises
them, and `kiln misses` naming what changed.
The full suite of the other test files runs on the main version only."""

import json
import re
import subprocess
from pathlib import Path

import pytest

import hermetic
from conftest import BUILD, REPO, Kilnd
from test_launcher import libcuda_dir  # noqa: F401  (fixture)
from test_misses import PROGRAM as MISSES_PROGRAM

PROBE = Path(__file__).with_name("client_probe.py")
KILN = BUILD / "client" / "cpp" / "kiln"
MATRIX = REPO / "requirements-triton-matrix.txt"
VERSIONS = re.findall(r"^triton==(\S+)$", MATRIX.read_text(), re.MULTILINE)


def python_of(version):
    return REPO / ".venv-triton" / version / "bin" / "python"


@pytest.fixture(params=VERSIONS)
def version(request):
    if not python_of(request.param).exists():
        pytest.fail(f"no venv for triton {request.param}: scripts/setup-python makes .venv-triton/{request.param}")
    return request.param


def start_probe(version, env, *args):
    return subprocess.Popen([str(python_of(version)), str(PROBE), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def probe(version, env, *args):
    return finish(start_probe(version, env, *args))


def finish(process):
    out, err = process.communicate(timeout=900)
    assert process.returncode == 0, err[-4000:]
    return json.loads(out.splitlines()[-1])


def kiln(kilnd, *args):
    result = subprocess.run([str(KILN), "--endpoint", f"unix:{kilnd.socket}", *map(str, args)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_every_part_kiln_relies_on_is_where_kiln_expects_it(version):
    """Names the part when a new Triton moves one (see kiln/triton/versions.py)."""
    result = subprocess.run([str(python_of(version)), "-c", """if True:
        import json, triton
        from kiln.triton import versions
        print(json.dumps({"missing": versions.missing_parts(), "unsupported": versions.unsupported_reason(),
                          "key": versions.triton_key()[:40], "version": triton.__version__}))"""],
        capture_output=True, text=True, env=hermetic.stock_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout)
    assert found["version"] == version
    assert found["missing"] == [] and found["unsupported"] is None
    assert found["key"].startswith(version)  # triton_key() begins with the version it keys


def test_the_suite_equals_stock_and_a_new_process_and_a_prewarmed_target_hit_every_kernel(version, tmp_path):
    base = hermetic.stock_env()
    stock = probe(version, dict(base, TRITON_CACHE_DIR=str(tmp_path / "stock")), "suite")["kernels"]
    kilnd = Kilnd(tmp_path / "kilnd", f"--toolchain={python_of(version)}", "--compile-workers=2")
    try:
        def through_kiln(run, mode):
            return start_probe(version, dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}",
                                             TRITON_CACHE_DIR=str(tmp_path / f"c-{run}"),
                                             KILN_FILES_DIR=str(tmp_path / f"f-{run}")), mode)

        # Two processes at once: each kernel compiled once, both get stock's.
        recorders = [through_kiln(f"sm80-{i}", "suite-sm80") for i in range(2)]
        sm80 = {name: kernel for name, kernel in stock.items() if name.endswith("-sm80")}
        for recorder in recorders:
            assert finish(recorder)["kernels"] == sm80
        assert kilnd.stats().compiles == len(sm80)

        bundle = tmp_path / "sm80.kilnbundle"
        kiln(kilnd, "export", bundle)
        prewarmed = kiln(kilnd, "prewarm", bundle, "--target", "cuda:90")
        assert f"prewarmed {len(sm80)} kernels for 1 targets: {len(sm80)} compiled, 0 already cached, 0 skipped, " \
               "0 failed" in prewarmed, prewarmed

        # A new process, with no local files: every kernel of both targets from kilnd, stock's byte for byte.
        fresh = finish(through_kiln("fresh", "suite"))
        assert fresh["kernels"] == stock
        assert fresh["frontend_runs"] == 0 and kilnd.stats().compiles == 2 * len(sm80)
    finally:
        assert kilnd.stop() == 0


def test_an_autotuned_kernels_configs_compile_ahead_through_kilnd_into_stocks_kernels(version, tmp_path):
    base = hermetic.stock_env()
    stock = probe(version, dict(base, TRITON_CACHE_DIR=str(tmp_path / "stock")), "autotune-warmup")
    kilnd = Kilnd(tmp_path / "kilnd", f"--toolchain={python_of(version)}", "--compile-workers=2")
    try:
        ahead = probe(version, dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}",
                                    TRITON_CACHE_DIR=str(tmp_path / "kiln"), KILN_FILES_DIR=str(tmp_path / "files")),
                      "autotune-warmup")
        assert ahead["kernels"] == stock["kernels"] and len(stock["kernels"]) == 4
        # In Kiln's threads, each config's TTGIR onwards made by kilnd.
        assert ahead["frontend_threads"] == ["kiln-compile"] and ahead["ttgir_made_here"] == 0
        assert kilnd.stats().compiles == 4
    finally:
        assert kilnd.stop() == 0


def test_kilnd_builds_the_launcher_module_and_a_new_process_is_served_it(version, tmp_path, libcuda_dir):  # noqa: F811
    """Up to 3.6 a launcher per kernel signature, from 3.7 cuda_utils (client_probe's launcher mode)."""
    kilnd = Kilnd(tmp_path / "kilnd", f"--toolchain={python_of(version)}")
    try:
        for run in ("first", "fresh"):
            env = dict(hermetic.stock_env(), KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}",
                       LD_LIBRARY_PATH=str(libcuda_dir), TRITON_CACHE_DIR=str(tmp_path / f"c-{run}"),
                       KILN_FILES_DIR=str(tmp_path / f"f-{run}"))
            assert probe(version, env, "launcher", str(libcuda_dir))["launch"] is True
            assert kilnd.stats().launcher_builds == 1  # the new process was served the first one's
    finally:
        assert kilnd.stop() == 0


def test_failing_kernels_fail_as_in_stock_and_misses_name_what_changed(version, tmp_path):
    base = hermetic.stock_env()
    kilnd = Kilnd(tmp_path / "kilnd", f"--toolchain={python_of(version)}")
    try:
        def both(mode, run):
            stock = probe(version, dict(base, TRITON_CACHE_DIR=str(tmp_path / f"stock-{run}")), mode)
            through_kiln = probe(version, dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}",
                                               TRITON_CACHE_DIR=str(tmp_path / f"c-{run}"),
                                               KILN_FILES_DIR=str(tmp_path / f"f-{run}")), mode)
            return stock, through_kiln

        stock, through_kiln = both("ptxas-error", "ptxas")
        assert through_kiln["raised"] == stock["raised"] == "PTXASError"
        assert "--no-such-ptxas-flag" in through_kiln["message"]
        stock, through_kiln = both("frontend-error", "frontend")
        assert [a["raised"] for a in through_kiln["attempts"]] == [a["raised"] for a in stock["attempts"]] \
            == ["CompilationError"] * 2

        def compile_scale(run, factor, num_warps):
            program = tmp_path / f"scale_{run}.py"
            program.write_text(MISSES_PROGRAM.replace("FACTOR", factor))
            result = subprocess.run(
                [str(python_of(version)), str(program), str(num_warps)], capture_output=True, text=True, timeout=300,
                env=dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}",
                         TRITON_CACHE_DIR=str(tmp_path / f"s-{run}"), KILN_FILES_DIR=str(tmp_path / f"sf-{run}")))
            assert result.returncode == 0, result.stderr[-3000:]

        for run, factor, num_warps in (("first", "2.0", 4), ("again", "2.0", 4), ("source", "3.0", 4),
                                       ("options", "3.0", 8)):
            compile_scale(run, factor, num_warps)
        listed = json.loads(kiln(kilnd, "misses", "--json")).get("misses", [])
        scale = [miss for miss in listed if miss.get("kernel") == "scale@cuda:90"]
        assert [miss["reasons"] for miss in scale][-3:] == [["new kernel"], ["source"], ["options"]], listed
    finally:
        assert kilnd.stop() == 0


def test_a_newer_triton_is_used_while_every_part_is_in_place_and_runs_stock_once_one_moved(tmp_path):
    """The newest listed Triton, made to look like 3.99: Kiln compiles its
    kernel (stock's byte for byte) with no warning; with one part moved away,
    stock's kernel and one warning that names the part and the fix."""
    newest = VERSIONS[-1]

    def program(moved):
        path = tmp_path / f"newer-{bool(moved)}.py"
        path.write_text(f"""if True:
            import sys, warnings
            import triton
            triton.__version__ = "3.99.0"
            from triton.runtime import build
            {moved or "pass"}
            sys.argv = ["client_probe.py", "first"]
            sys.path.insert(0, {str(PROBE.parent)!r})
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                import client_probe
                client_probe.main()
            print("WARNINGS", [str(w.message) for w in caught], file=sys.stderr)
            """)
        return path

    base = hermetic.stock_env()
    stock = probe(newest, dict(base, TRITON_CACHE_DIR=str(tmp_path / "stock")), "first")
    kilnd = Kilnd(tmp_path / "kilnd", f"--toolchain={python_of(newest)}")
    try:
        def run(moved, name):
            result = subprocess.run([str(python_of(newest)), str(program(moved))], capture_output=True, text=True,
                                    timeout=600, env=dict(base, KILN="1", KILN_ENDPOINT=f"unix:{kilnd.socket}",
                                                          TRITON_CACHE_DIR=str(tmp_path / f"c-{name}"),
                                                          KILN_FILES_DIR=str(tmp_path / f"f-{name}")))
            assert result.returncode == 0, result.stderr[-3000:]
            assert json.loads(result.stdout.splitlines()[-1])["kernels"] == stock["kernels"]
            return re.findall(r"kiln: [^']*", result.stderr.split("WARNINGS")[-1]), result.stderr[-2000:]

        assert run(None, "in-place")[0] == [] and kilnd.stats().compiles == 1
        # As if a new Triton had moved it (the kernel compiled here builds no
        # module): not even the files kilnd serves this account are used.
        warned, said = run("del build._build", "moved")
        assert len(warned) == 1 and "triton 3.99.0 is newer than Kiln knows" in warned[0], said
        assert "triton.runtime.build._build" in warned[0] and "upgrade kiln-triton" in warned[0]
        assert kilnd.stats().compiles == 1 and not list((tmp_path / "f-moved").rglob("*.cubin"))
    finally:
        kilnd.stop()
