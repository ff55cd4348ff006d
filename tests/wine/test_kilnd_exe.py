"""The Windows release zip (scripts/package-windows) and the kilnd.exe and
kiln.exe inside it, under Wine: kilnd.exe on its per-user defaults
(%LOCALAPPDATA%\\kiln, a 127.0.0.1 endpoint file with a token), kiln.exe
reaching it through that file.

Needs scripts/windows-build first; KILN_WINDOWS_BUILD_DIR names the build."""

import os
import re
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KILN_WINDOWS_BUILD_DIR", REPO / "build-windows"))
pytestmark = pytest.mark.skipif(not (BUILD / "service" / "kilnd.exe").exists(),
                                reason=f"no kilnd.exe in {BUILD} (scripts/windows-build)")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The zip scripts/package-windows makes, and the folder it unzips to."""
    out = tmp_path_factory.mktemp("release")
    made = subprocess.run([str(REPO / "scripts" / "package-windows"), str(out / "kiln-windows-x64.zip")],
                          capture_output=True, text=True, env=dict(os.environ, KILN_WINDOWS_BUILD_DIR=str(BUILD)))
    assert made.returncode == 0, made.stderr[-3000:]
    archive = Path(made.stdout.splitlines()[-1])
    with zipfile.ZipFile(archive) as opened:
        opened.extractall(out)
    return archive, out / "kiln-windows-x64"


@pytest.fixture(scope="module")
def binaries(release):
    return release[1] / "kilnd.exe", release[1] / "kiln.exe"


def windows_path(path):
    """Wine maps the Linux file system to drive Z:."""
    return "Z:" + str(path).replace("/", "\\")


def new_wine_prefix(tmp_path_factory, name):
    prefix = tmp_path_factory.mktemp(name)
    env = dict(os.environ, WINEPREFIX=str(prefix), WINEDEBUG="-all", WINEDLLOVERRIDES="mscoree,mshtml=")
    subprocess.run(["wineboot", "--init"], env=env, capture_output=True, timeout=300)
    subprocess.run(["wineserver", "-w"], env=env, timeout=300)
    return env


@pytest.fixture(scope="module")
def wine(tmp_path_factory):
    """A Wine prefix of this module's own, so that the per-user defaults are new."""
    env = new_wine_prefix(tmp_path_factory, "wineprefix")
    yield env
    subprocess.run(["wineserver", "-k"], env=env, capture_output=True)


def local_app_data(env):
    users = Path(env["WINEPREFIX"]) / "drive_c" / "users"
    return next(user / "AppData" / "Local" for user in users.iterdir() if user.name != "Public")


@pytest.fixture(scope="module")
def kilnd(wine, binaries):
    process = subprocess.Popen(["wine", str(binaries[0])], env=wine, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    endpoint_file = local_app_data(wine) / "kiln" / "run" / "kilnd.endpoint"
    deadline = time.monotonic() + 60
    while not endpoint_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"kilnd.exe wrote no {endpoint_file}:\n{process.stdout.read().decode(errors='replace')}")
        time.sleep(0.2)
    yield endpoint_file
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def kiln(wine, binaries):
    """Runs the zip's kiln.exe, which finds kilnd through its endpoint file."""
    def run(*args, check=True):
        result = subprocess.run(["wine", str(binaries[1]), *args], env=wine, capture_output=True, text=True,
                                timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"kiln.exe {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
        return result
    return run


def test_the_zip_holds_what_the_installer_installs(release):
    archive, _ = release
    with zipfile.ZipFile(archive) as opened:
        names = sorted(name.removeprefix("kiln-windows-x64/") for name in opened.namelist() if not name.endswith("/"))
    wheel = next(name for name in names if name.startswith("kiln_triton-") and name.endswith("-py3-none-any.whl"))
    assert names == sorted(["kilnd.exe", "kiln.exe", "kiln_worker.py", "install-kiln.ps1", "README.md", wheel])


def test_kilnd_serves_on_its_per_user_defaults(wine, kilnd, kiln):
    target, token = kilnd.read_text().splitlines()[:2]
    assert target.startswith("127.0.0.1:") and len(token) >= 32
    assert "SERVING" in kiln("health", "--wait", "30").stdout
    # Its data lives in %LOCALAPPDATA%\kiln: the SQLite index is there.
    assert (local_app_data(wine) / "kiln" / "kiln.db").exists()


def test_put_get_stats_verify_and_gc_through_the_endpoint_file(kilnd, kiln, tmp_path):
    blob = tmp_path / "kernel.cubin"
    blob.write_bytes(os.urandom(200_000))
    kiln("put", "tests", "key-1", f"kernel.cubin={windows_path(blob)}")
    out = tmp_path / "out"
    kiln("get", "tests", "key-1", "-o", windows_path(out))
    assert (out / "kernel.cubin").read_bytes() == blob.read_bytes()
    assert kiln("get", "tests", "no-such-key", check=False).returncode == 1  # a miss
    stats = kiln("stats").stdout
    assert int(re.search(r"(\d+) puts", stats).group(1)) >= 1, stats
    assert kiln("verify").returncode == 0
    assert kiln("gc", "0").returncode == 0
    assert kiln("get", "tests", "key-1", check=False).returncode == 1  # evicted


def test_a_call_without_the_token_is_refused(kilnd, kiln):
    target = kilnd.read_text().splitlines()[0]
    refused = kiln("--endpoint", target, "stats", check=False)
    assert refused.returncode != 0
    assert "access token" in refused.stderr, refused.stderr

