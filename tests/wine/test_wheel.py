"""The win_amd64 wheel of kiln-triton (scripts/build-wheels) as a ComfyUI user
installs it: `python_embeded\\python.exe -m pip install` it, and nothing else.
A KILN=1 process starts the kilnd.exe of the wheel (no PATH, no KILN_KILND,
no config), which compiles the suite as stock triton-windows does, serves a
new process, and stops by itself once idle."""

import subprocess
import time

import pytest

from conftest import REPO, local_app_data, windows_path
from test_comfyui_path import NEWEST, kilnd_processes, make_python_embeded, suite  # noqa: F401


@pytest.fixture(scope="module")
def windows_wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheels")
    made = subprocess.run([str(REPO / "scripts" / "build-wheels"), str(out)], capture_output=True, text=True,
                          timeout=1800)
    assert made.returncode == 0, made.stderr[-4000:]
    return next(line for line in made.stdout.splitlines() if line.endswith("-win_amd64.whl"))


def test_the_wheels_kilnd_exe_is_started_by_the_client_serves_a_new_process_and_stops_when_idle(
        windows_wheel, tmp_path_factory, tmp_path):
    from conftest import new_wine_prefix, start_persistent_wineserver

    wine = new_wine_prefix(tmp_path_factory, "wheelprefix")
    start_persistent_wineserver(wine)
    try:
        python = make_python_embeded(wine, NEWEST, tmp_path / "comfyui", client_wheel=windows_wheel)
        stock, _ = suite(wine, python, tmp_path / "stock-cache")
        kiln_env = dict(KILN="1", KILN_STRICT="1", KILN_IDLE_EXIT_SECONDS="10")
        cold, _ = suite(wine, python, tmp_path / "kiln-cache", **kiln_env)
        assert cold["kernels"] == stock["kernels"]
        started = kilnd_processes(wine)
        assert len(started) == 1
        command_line = open(f"/proc/{started[0]}/cmdline", "rb").read().decode(errors="replace")
        assert "python_embeded\\Lib\\site-packages\\kiln\\bin\\kilnd.exe" in command_line, command_line

        warm, _ = suite(wine, python, tmp_path / "empty-cache", **kiln_env)
        assert warm["kernels"] == stock["kernels"] and warm["frontend_runs"] == 0

        deadline = time.monotonic() + 120
        while kilnd_processes(wine) and time.monotonic() < deadline:
            time.sleep(1)
        assert kilnd_processes(wine) == []
        log = (local_app_data(wine) / "kiln" / "logs" / "kilnd.log").read_text()
        assert "no call for 10 s (exit_when_idle_seconds)" in log and "kilnd stopped cleanly" in log, log[-3000:]
    finally:
        subprocess.run(["wineserver", "-k"], env=wine, capture_output=True)
