"""A kernel compiled through the zip's kilnd.exe with a Windows Triton
toolchain, under Wine: the python.org embeddable CPython (what ComfyUI ships)
with triton-windows, from PyPI (scripts/windows-triton), registered in the
per-user kilnd.conf; kiln.exe compiles Triton's own TTIR to a cubin with the
ptxas.exe triton-windows bundles."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, local_app_data, new_wine_prefix, runner, start_persistent_wineserver, windows_path

EM_CUDA = 190  # an ELF's e_machine for NVIDIA CUDA


@pytest.fixture(scope="module")
def windows_python():
    made = subprocess.run([str(REPO / "scripts" / "windows-triton")], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-3000:]
    return Path(made.stdout.splitlines()[-1]) / "python.exe"


@pytest.fixture(scope="module")
def ttir(tmp_path_factory):
    """The suite's vector add and 32x32x32 matmul, as the Linux triton's frontend emits them for sm90."""
    out = tmp_path_factory.mktemp("ttir")
    subprocess.run([sys.executable, str(REPO / "tests" / "gpu" / "make_ttir.py"), "90", str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def wine(tmp_path_factory):
    env = new_wine_prefix(tmp_path_factory, "tritonprefix")
    start_persistent_wineserver(env)
    yield env
    subprocess.run(["wineserver", "-k"], env=env, capture_output=True)


@pytest.fixture(scope="module")
def kilnd(wine, binaries, windows_python, tmp_path_factory):
    config = local_app_data(wine) / "kiln" / "kilnd.conf"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f"toolchain = {windows_path(windows_python)}\r\n")
    log = tmp_path_factory.mktemp("kilnd") / "kilnd.out"
    with open(log, "w") as out:
        # The embedded python.exe the workers run needs a real stdin handle.
        process = subprocess.Popen(["wine", str(binaries[0])], env=wine, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT)
    yield process, log
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def kiln(wine, binaries, kilnd):
    run = runner(wine, binaries[1])
    try:
        run("health", "--wait", "120", timeout=180)
    except (AssertionError, subprocess.TimeoutExpired) as failure:
        # What a kilnd.exe that never served left behind says where it stopped.
        process, output = kilnd
        logs = sorted((local_app_data(wine) / "kiln").rglob("kilnd*.log"))
        wine_processes = subprocess.run(["ps", "-eo", "pid,etime,stat,args"], capture_output=True, text=True).stdout
        raise AssertionError(
            f"kilnd.exe did not serve: {failure}\nits process: "
            f"{'running' if process.poll() is None else f'exited {process.returncode}'}\n"
            f"its output: {output.read_text(errors='replace')[-3000:]!r}\n"
            f"its logs: {[(str(log), log.read_text(errors='replace')[-3000:]) for log in logs]}\n"
            f"Wine's processes:\n{''.join(line + chr(10) for line in wine_processes.splitlines() if '.exe' in line)}"
        ) from failure
    return run


def test_kilnd_registers_the_windows_triton(kiln):
    listed = kiln("toolchains").stdout
    assert "3.6.0" in listed and "python.exe" in listed, listed


@pytest.mark.parametrize("kernel, targets", [("add", ["cuda:90"]), ("matmul", ["cuda:80", "cuda:90"])])
def test_kiln_compiles_ttir_to_a_cubin_with_the_bundled_ptxas(kiln, ttir, tmp_path, kernel, targets):
    flags = [arg for target in targets for arg in ("--target", target)]
    kiln("compile", windows_path(ttir / f"{kernel}.ttir"), *flags, "-o", windows_path(tmp_path), timeout=300)
    for target in targets:
        out = tmp_path / target.replace(":", "_")
        cubin = next(out.glob("*.cubin"))
        header = cubin.read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == EM_CUDA, cubin
        assert f"sm_{target.split(':')[1]}" in next(out.glob("*.ptx")).read_text()
        assert "Used" in (out / "ptxas.log").read_text(), "ptxas -v reports its registers"


def test_a_ttir_that_does_not_parse_is_a_compile_error_not_a_hang(kiln, tmp_path):
    broken = tmp_path / "broken.ttir"
    broken.write_text("module { this is not TTIR }\n")
    failed = kiln("compile", windows_path(broken), "--target", "cuda:90", "-o", windows_path(tmp_path / "out"),
                  check=False, timeout=300)
    assert failed.returncode == 5, failed.stderr
    assert "parse" in failed.stderr, failed.stderr
