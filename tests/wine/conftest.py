"""What the Wine tests share: the Windows release zip (scripts/package-windows)
unpacked, the kilnd.exe and kiln.exe inside it, and Wine prefixes of their own.

Needs scripts/windows-build first; KILN_WINDOWS_BUILD_DIR names the build."""

import contextlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path, PureWindowsPath

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

import hermetic  # noqa: E402

# Before any test or fixture runs: none of them reaches this account's kilnd,
# Wine prefix, caches or files (a no-op under scripts/test, which did it already).
hermetic.enter()
hermetic.apply_test_settings()
BUILD = Path(os.environ.get("KILN_WINDOWS_BUILD_DIR", REPO / "build-windows"))


def pytest_collection_modifyitems(items):
    if (BUILD / "service" / "kilnd.exe").exists():
        return
    skip = pytest.mark.skip(reason=f"no kilnd.exe in {BUILD} (scripts/windows-build)")
    for item in items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
def binaries(release):
    return release[1] / "kilnd.exe", release[1] / "kiln.exe"


def windows_path(path):
    """Wine maps the Linux file system to drive Z:."""
    return "Z:" + str(path).replace("/", "\\")


def linux_path(env, path):
    """Where a C:\\ path of the Wine prefix `env` lies on Linux."""
    windows = PureWindowsPath(path)
    assert windows.drive.upper() == "C:", path
    return Path(env["WINEPREFIX"], "drive_c", *windows.parts[1:])


def wine_env(prefix):
    return dict(os.environ, WINEPREFIX=str(prefix), WINEDEBUG="-all", WINEDLLOVERRIDES="mscoree,mshtml=")


# A prefix that `wineboot --init` made is about 720 MB, nearly all of it
# Wine's DLLs under drive_c/windows, which no test writes: each test's prefix
# is a copy of one made once, sharing those files through hard links. Twenty
# fresh prefixes filled a CI runner's disk (14 GB) and took a wineboot of
# 20-30 s each. Nothing else is shared: wineserver rewrites the registry files
# (system.reg is 1.7 MB) in place, so a service one test registered would
# appear in every prefix.
SHARED_FILE_BYTES = 64 * 1024
_booted_prefix = None


def _copy_prefix(source, target):
    """Copies a Wine prefix: symbolic links as links (dosdevices, the user's
    folders), Wine's large files under drive_c/windows as hard links, every
    other file as a copy."""
    shared = source / "drive_c" / "windows"
    for folder, subfolders, files in os.walk(source):
        into = target / Path(folder).relative_to(source)
        into.mkdir(exist_ok=True)
        for name in subfolders + files:
            origin, copy = Path(folder, name), into / name
            if origin.is_symlink():
                copy.symlink_to(os.readlink(origin))
                if name in subfolders:
                    subfolders.remove(name)
            elif name in files:
                if origin.is_relative_to(shared) and origin.stat().st_size >= SHARED_FILE_BYTES:
                    os.link(origin, copy)
                else:
                    shutil.copy2(origin, copy)


def new_wine_prefix(tmp_path_factory, name):
    """A Wine prefix of the test's own, as `wineboot --init` makes it."""
    global _booted_prefix
    if _booted_prefix is None:
        booted = tmp_path_factory.mktemp("booted-prefix")
        env = wine_env(booted)
        subprocess.run(["wineboot", "--init"], env=env, capture_output=True, timeout=300)
        subprocess.run(["wineserver", "-w"], env=env, timeout=300)
        _booted_prefix = booted
    prefix = tmp_path_factory.mktemp(name)
    _copy_prefix(_booted_prefix, prefix)
    return wine_env(prefix)


def start_persistent_wineserver(env):
    """Keeps the prefix's wineserver, and so Wine's services, running until
    `wineserver -k`: Wine ends services.exe and the services it started when
    the last ordinary process exits, which a real machine never does. Wine's
    own processes start here too, so that they hold no test's pipe open (they
    inherit the output of the program that starts them)."""
    subprocess.run(["wineserver", "-p"], env=env, check=True)
    subprocess.run(["wine", "cmd", "/c", "exit"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=120)


@contextlib.contextmanager
def prefix_with_services(tmp_path_factory, name):
    """A Wine prefix of its own whose services keep running between commands;
    afterwards the kilnd service is deleted and the prefix's wineserver ended."""
    env = new_wine_prefix(tmp_path_factory, name)
    start_persistent_wineserver(env)
    try:
        yield env
    finally:
        subprocess.run(["wine", "sc", "delete", "kilnd"], env=env, capture_output=True, timeout=60)
        subprocess.run(["wineserver", "-k"], env=env, capture_output=True)


def local_app_data(env):
    users = Path(env["WINEPREFIX"]) / "drive_c" / "users"
    return next(user / "AppData" / "Local" for user in users.iterdir() if user.name != "Public")


def runner(env, executable):
    """Runs `executable` under Wine in prefix `env`; fails the test on a non-zero exit unless check=False."""
    def run(*args, check=True, timeout=120):
        result = subprocess.run(["wine", str(executable), *args], env=env, capture_output=True, text=True,
                                timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{executable.name} {' '.join(args)} exited {result.returncode}:\n"
                                 f"{result.stdout}{result.stderr}")
        return result
    return run


@pytest.fixture(scope="session")
def hold_open(tmp_path_factory):
    """hold(env, *paths): tests/wine/hold_open.c (built with mingw-w64) holding
    `paths` open in Wine prefix `env`, as a virus scanner does; its process,
    which lets go when its stdin closes."""
    executable = tmp_path_factory.mktemp("hold_open") / "hold_open.exe"
    subprocess.run(["x86_64-w64-mingw32-gcc", "-municode", "-O2", "-o", str(executable),
                    str(Path(__file__).with_name("hold_open.c"))], check=True)
    lists = tmp_path_factory.mktemp("held")

    def hold(env, *paths):
        listed = lists / f"{len(list(lists.iterdir()))}.txt"
        listed.write_text("".join(windows_path(path) + "\n" for path in paths), encoding="utf-8")
        process = subprocess.Popen(["wine", str(executable), "@" + windows_path(listed)], env=env,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert process.stdout.readline().strip() == "held", f"hold_open could not open all of {listed}"
        return process
    return hold
