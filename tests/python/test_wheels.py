"""kiln-triton's wheels (scripts/build-wheels): what each carries and how it is
tagged, and the manylinux wheel in a fresh venv with nothing but triton: a
KILN=1 process starts the wheel's own kilnd (no PATH, no KILN_KILND), which
compiles the suite as stock does, serves a second process, and stops once
idle. The win_amd64 wheel is installed into an embedded Python under Wine
(tests/wine/test_wheel.py)."""

import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path


import hermetic
from conftest import kilnd_processes_with

PROBE = Path(__file__).with_name("client_probe.py")
MAX_WHEEL_BYTES = 40 * 2**20


def wheel_tags(path):
    with zipfile.ZipFile(path) as wheel:
        text = next(wheel.read(name).decode() for name in wheel.namelist() if name.endswith(".dist-info/WHEEL"))
    return re.findall(r"^Tag: (\S+)$", text, re.MULTILINE), "Root-Is-Purelib: true" in text


def test_each_wheel_carries_what_its_platform_needs_under_its_tags(wheels):
    names = {platform: set(zipfile.ZipFile(path).namelist()) for platform, path in wheels.items()}
    for platform, path in wheels.items():
        assert path.stat().st_size < MAX_WHEEL_BYTES, (platform, path.stat().st_size)
        assert {"kiln/__init__.py", "kiln/service/connection.py", "kiln-activate.pth"} <= names[platform]

    tags, purelib = wheel_tags(wheels["any"])
    assert tags == ["py3-none-any"] and purelib
    assert not any(name.startswith("kiln/bin/") for name in names["any"])

    tags, purelib = wheel_tags(wheels["manylinux"])
    assert tags and all(re.fullmatch(r"py3-none-manylinux_2_\d+_x86_64", tag) for tag in tags) and not purelib
    assert {"kiln/bin/kilnd", "kiln/bin/kiln", "kiln/bin/kiln_worker.py", "kiln/bin/kilnd.system.service"} \
        <= names["manylinux"]
    assert any(re.match(r"kiln_triton\.libs/libgrpc\+\+-\w+\.so", name) for name in names["manylinux"])
    # The tag claims no glibc older than the binaries' symbols need, nor one
    # newer than this machine's (auditwheel's policy also weighs libstdc++'s
    # symbols, which may ask a newer one than glibc's alone).
    oldest = min(int(re.search(r"manylinux_2_(\d+)", tag).group(1)) for tag in tags)
    with zipfile.ZipFile(wheels["manylinux"]) as wheel:
        needed = max(int(minor) for name in wheel.namelist() if name.startswith(("kiln/bin/kiln", "kiln_triton.libs"))
                     for minor in re.findall(rb"GLIBC_2\.(\d+)", wheel.read(name)))
    this_machine = int(os.confstr("CS_GNU_LIBC_VERSION").split(".")[1])
    assert needed <= oldest <= this_machine, (tags, needed, this_machine)

    tags, purelib = wheel_tags(wheels["win_amd64"])
    assert tags == ["py3-none-win_amd64"] and not purelib
    assert {"kiln/bin/kilnd.exe", "kiln/bin/kiln.exe", "kiln/bin/kiln_worker.py",
            "kiln/bin/python/3.13/include/Python.h"} <= names["win_amd64"]
    print("wheel sizes: " + ", ".join(f"{platform} {path.stat().st_size / 2**20:.1f} MiB"
                                      for platform, path in sorted(wheels.items())))


def test_a_fresh_venv_with_triton_and_the_manylinux_wheel_starts_its_kilnd_which_stops_when_idle(
        wheels, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                                "triton==3.6.0", str(wheels["manylinux"])], capture_output=True, text=True,
                               timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    wheel_kilnd = Path(subprocess.run([str(python), "-c",
                                      "from kiln.service import autostart; print(autostart.WHEEL_KILND)"],
                                      capture_output=True, text=True, check=True).stdout.strip())
    assert wheel_kilnd.is_file() and wheel_kilnd.is_relative_to(venv)

    base = hermetic.stock_env()
    # No kilnd anywhere but in the wheel: a PATH of the system's own folders.
    base["PATH"] = "/usr/bin:/bin"
    base.pop("KILN_KILND", None)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)

    def suite(name, **env):
        result = subprocess.run([str(python), str(PROBE), "suite"], capture_output=True, text=True, timeout=900,
                                env=dict(base, TRITON_CACHE_DIR=str(tmp_path / name), **env))
        assert result.returncode == 0, result.stderr[-4000:]
        return json.loads(result.stdout.splitlines()[-1])

    stock = suite("stock")
    kiln_env = dict(KILN="1", KILN_STRICT="1", XDG_RUNTIME_DIR=str(runtime), XDG_CACHE_HOME=str(tmp_path / "cache"),
                    KILN_IDLE_EXIT_SECONDS="6")
    try:
        assert suite("first", **kiln_env)["kernels"] == stock["kernels"]
        started = kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime))
        assert len(started) == 1 and Path(os.readlink(f"/proc/{started[0]}/exe")) == wheel_kilnd
        status = subprocess.run([str(python), "-m", "kiln", "status"], capture_output=True, text=True, timeout=60,
                                env=dict(base, **kiln_env))
        assert f"binary:    {wheel_kilnd} (this kiln-triton wheel's)" in status.stdout, status.stdout + status.stderr
        second = suite("second", KILN_FILES_DIR=str(tmp_path / "other-files"), **kiln_env)
        assert second["kernels"] == stock["kernels"] and second["frontend_runs"] == 0
        # Idle for KILN_IDLE_EXIT_SECONDS: it stops by itself, cleanly.
        deadline = time.monotonic() + 60
        while kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime)) == []
        log = next((tmp_path / "cache").rglob("kilnd.log")).read_text()
        assert "no call for 6 s (exit_when_idle_seconds)" in log and "kilnd stopped cleanly" in log, log[-3000:]
    finally:
        for pid in kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime)):
            os.kill(pid, 15)
