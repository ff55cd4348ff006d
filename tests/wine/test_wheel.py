"""The win_amd64 wheel of kiln-triton (scripts/build-wheels) as a ComfyUI user
installs it: `python_embeded\\python.exe -m pip install` it, and nothing else.
A KILN=1 process starts the kilnd.exe of the wheel (no PATH, no KILN_KILND,
no config), which compiles the suite as stock triton-windows does, serves a
new process, and stops by itself once idle; `python -m kiln service install`
from the same Python gives a running service that the next process uses."""

import time

import pytest

from built_wheels import build_wheels
from conftest import linux_path, local_app_data, prefix_with_services, windows_path
from test_comfyui_path import NEWEST, kilnd_processes, make_python_embeded, run_python, suite


@pytest.fixture(scope="module")
def windows_wheel(tmp_path_factory):
    return build_wheels(tmp_path_factory.mktemp("wheels"))["win_amd64"]


@pytest.fixture(scope="module")
def wine(tmp_path_factory):
    with prefix_with_services(tmp_path_factory, "wheelprefix") as env:
        yield env


@pytest.fixture(scope="module")
def python(wine, windows_wheel, tmp_path_factory):
    return make_python_embeded(wine, NEWEST, tmp_path_factory.mktemp("comfyui"), client_wheel=windows_wheel)


@pytest.fixture(scope="module")
def stock(wine, python, tmp_path_factory):
    return suite(wine, python, tmp_path_factory.mktemp("stock-cache"))[0]


def test_the_wheels_kilnd_exe_is_started_by_the_client_serves_a_new_process_and_stops_when_idle(
        wine, python, stock, tmp_path):
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


def test_kiln_service_install_from_the_same_python_gives_a_service_the_next_process_uses(
        wine, python, stock, tmp_path):
    assert kilnd_processes(wine) == []  # the per-user kilnd.exe of the test above has stopped
    status, said = run_python(wine, python, "-m", "kiln", "service", "install")
    assert status == 0, said
    # Wine keeps no file's owner or access list (it maps them to mode bits),
    # so only that the calls succeeded shows here; Windows applies them.
    assert r"only Administrators may change C:\Program Files\Kiln and C:\ProgramData\kiln\kilnd.conf" in said, said
    assert linux_path(wine, r"C:\Program Files\Kiln\kilnd.exe").exists()
    config = linux_path(wine, r"C:\ProgramData\kiln\kilnd.conf").read_text()
    assert f"toolchain = {windows_path(python)}" in config, config
    status, said = run_python(wine, python, "-m", "kiln", "service", "status")
    assert status == 0 and "kilnd: running" in said, said

    # The next process finds the service through the machine's endpoint file, and starts no kilnd of its own.
    through_service, _ = suite(wine, python, tmp_path / "service-cache", KILN="1", KILN_STRICT="1")
    assert through_service["kernels"] == stock["kernels"]
    status, said = run_python(dict(wine, KILN="1"), python, "-m", "kiln", "status")
    assert "binary:    C:\\Program Files\\Kiln\\kilnd.exe" in said.splitlines(), said
    running = kilnd_processes(wine)
    assert len(running) == 1
    command_line = open(f"/proc/{running[0]}/cmdline", "rb").read().decode(errors="replace")
    assert "--windows-service" in command_line and "Program Files\\Kiln\\kilnd.exe" in command_line, command_line
    assert linux_path(wine, r"C:\ProgramData\kiln\kiln.db").exists()

    # Installing again (an upgrade) keeps the config as it was, and the service running.
    status, said = run_python(wine, python, "-m", "kiln", "service", "install")
    assert status == 0 and "nothing to add" in said, said
    assert linux_path(wine, r"C:\ProgramData\kiln\kilnd.conf").read_text() == config

    status, said = run_python(wine, python, "-m", "kiln", "service", "uninstall")
    assert status == 0, said
    assert not linux_path(wine, r"C:\Program Files\Kiln").exists()
    assert linux_path(wine, r"C:\ProgramData\kiln\kiln.db").exists()  # the cache stays
