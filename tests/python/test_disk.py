"""What kilnd's cache takes on disk: max_cache_size bounds all of it (blob
files, served copies, the index and its WAL), a full disk is visible and
mended with kiln gc, and a data directory kilnd cannot write is refused at
start. The full disk (and the read-only one) is a real one: a small tmpfs
mounted on kilnd's data directory in a mount namespace of its own (unshare)."""

import contextlib
import errno
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kiln.service import api as _api
from triton.backends.compiler import GPUTarget

import kernel_suite
import triton_frontend
from conftest import BUILD, Kilnd, kilnd_refusing, probe_json, run_probe
from pipeline_client import compile_request
from test_client import base_env, kiln_env  # noqa: F401  (fixtures)

# kilnd takes outside bytes here: the asan lane runs these against its ASan+UBSan build.
pytestmark = pytest.mark.outside_bytes

KILN = BUILD / "client" / "cpp" / "kiln"


def on_a_tmpfs(data_dir, mib, read_only=False):
    """A wrapper that runs kilnd with a tmpfs of `mib` MiB on `data_dir`."""
    if subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"]).returncode != 0:
        pytest.skip("this machine allows no user and mount namespaces (unshare -rm)")
    script = 'mkdir -p "$0" && mount -t tmpfs -o "$1" tmpfs "$0" && shift && exec "$@"'
    options = f"size={mib}m" + (",ro" if read_only else "")
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, str(data_dir), options]


def seen_from_here(kilnd, path):
    """`path` in kilnd's mount namespace, from this process's."""
    return Path(f"/proc/{kilnd.process.pid}/root") / Path(path).relative_to("/")


def compile_case(kilnd, case_index, arch=90):
    frontend = triton_frontend.run_frontend(kernel_suite.SUITE[case_index], GPUTarget("cuda", arch, 32))
    response = kilnd.stub.Compile(compile_request(frontend), timeout=300)
    assert response.WhichOneof("result") == "entry", response.error
    return response


def kiln(kilnd, *args):
    return subprocess.run([str(KILN), "--no-autostart", "--endpoint", f"unix:{kilnd.socket}", *args],
                          capture_output=True, text=True)


def fill(directory):
    """Writes a file in `directory` until its file system is full; returns it."""
    filler = directory / "filler"
    chunk = b"\xff" * (64 << 10)
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(chunk)
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
    return filler


def test_a_full_disk_serves_compiles_says_they_are_not_stored_and_kiln_gc_frees_it(tmp_path):
    root = tmp_path / "kilnd"
    kilnd = Kilnd(root, f"--toolchain={sys.executable}", wrapper=on_a_tmpfs(root / "data", 24))
    try:
        data = seen_from_here(kilnd, root / "data")
        for case in range(4):
            compile_case(kilnd, case)
        filler = fill(data)
        before = kilnd.stats()
        assert not before.disk_full_since

        # Compiles are served, not stored, and said to be.
        for case in (5, 6):
            compile_case(kilnd, case)
        compile_case(kilnd, 0)  # stored before: still served from the cache
        stats = kilnd.stats()
        assert stats.compiles == before.compiles + 2 and stats.compile_cache_hits == before.compile_cache_hits + 1
        assert stats.puts_refused_disk_full >= 2 and stats.disk_full_since, stats
        health = kiln(kilnd, "health")
        assert health.returncode == 0 and "cache: disk full since" in health.stdout, health
        assert f"{stats.puts_refused_disk_full} results served but not stored" in kiln(kilnd, "stats").stdout
        log = (root / "kilnd.out").read_text()
        assert log.count("] cache: the disk of") == 1, log  # one line per episode, not per refusal

        # kiln gc works on the full disk, and frees space on it.
        free_before = os.statvfs(data).f_bavail
        gc = kiln(kilnd, "gc", "0")
        assert gc.returncode == 0 and f"evicted {stats.entries} entries" in gc.stdout, gc
        assert os.statvfs(data).f_bavail > free_before

        # Room again: stored again, and the episode is over.
        filler.unlink()
        compile_case(kilnd, 7)  # answered before it is stored
        deadline = time.monotonic() + 30
        while kilnd.stats().disk_full_since and time.monotonic() < deadline:
            time.sleep(0.1)
        stats = kilnd.stats()
        assert not stats.disk_full_since and stats.entries >= 1
        assert "results are stored again" in (root / "kilnd.out").read_text()
        assert "disk full" not in kiln(kilnd, "health").stdout
    finally:
        assert kilnd.stop() == 0, (root / "kilnd.out").read_text()


@contextlib.contextmanager
def immutable(directory):
    """`directory` made immutable (chattr +i), so that not even root may create
    anything in it; skips where its file system has no such flag."""
    made = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"no immutable flag on the file system of {directory}: {made.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


@pytest.mark.parametrize("case", ["a file", "under a file", "a read-only file system",
                                  "an immutable directory"])
def test_a_data_dir_kilnd_cannot_write_is_refused_at_start_naming_data_dir_and_the_fix(tmp_path, case):
    data, wrapper = tmp_path / "data", ()
    with contextlib.ExitStack() as stack:
        if case == "a file":
            data.write_text("x")
            problem = "is a file, not a directory"
        elif case == "under a file":
            (tmp_path / "file").write_text("x")
            data = tmp_path / "file" / "data"
            problem = f"cannot be created: {tmp_path / 'file'} is a file, not a directory"
        elif case == "a read-only file system":
            wrapper = on_a_tmpfs(data, 1, read_only=True)
            problem = "is not writable by kilnd (Read-only file system)"
        else:
            data.mkdir()
            stack.enter_context(immutable(data))
            problem = "is not writable by kilnd (Operation not permitted)"
        printed = kilnd_refusing(tmp_path, "", f"--data-dir={data}", wrapper=wrapper)
    fix = "point data_dir (or --data-dir) at a directory kilnd may write"
    assert f"data_dir {data} {problem}; {fix}" in printed, printed
    assert "log file" not in printed and "lock file" not in printed, printed


def test_a_log_dir_that_is_a_file_is_refused_at_start_naming_log_dir(tmp_path):
    logs = tmp_path / "logs"
    logs.write_text("x")
    printed = kilnd_refusing(tmp_path, f"log_dir = {logs}\n")
    assert f"log_dir {logs} is a file, not a directory; point log_dir (or --log-dir) at a" in printed, printed


def disk_usage(directory):
    """What `directory` takes on disk, in bytes (du: allocated blocks)."""
    return int(subprocess.run(["du", "-s", "--block-size=1", str(directory)], capture_output=True, text=True,
                              check=True).stdout.split()[0])


def test_max_cache_size_bounds_the_data_directory_on_disk_after_the_suite_and_a_burst_of_puts(
        tmp_path, base_env):  # noqa: F811
    cap = 6 << 20
    config = tmp_path / "kilnd.conf"
    config.write_text(f"max_cache_size = {cap}\n")
    kilnd = Kilnd(tmp_path / "kilnd", f"--config={config}", f"--toolchain={sys.executable}")
    data = tmp_path / "kilnd" / "data"
    try:
        env = dict(base_env, KILN="1", KILN_ENDPOINT=f"unix:{kilnd.socket}")
        # The suite through the real client, twice: compiled, then served as files.
        for _ in range(2):
            assert probe_json(run_probe(env, "suite"))["kernels"]
        served = disk_usage(data / "files")
        rng = random.Random(34)
        for i in range(120):  # 12 MiB that does not compress: twice the cap
            kilnd.stub.Put(_api.PutRequest(namespace="triton", key=f"burst{i}",
                                           blobs=[_api.blob("k.cubin", rng.randbytes(100 << 10))]))
        deadline = time.monotonic() + 30
        while kilnd.stats().disk_bytes > cap and time.monotonic() < deadline:
            time.sleep(0.2)
        stats = kilnd.stats()
        on_disk = disk_usage(data)
        print(f"cap {cap}, served copies after the suite {served}, on disk {on_disk} "
              f"({on_disk / cap:.2f}x the cap), counted {stats.disk_bytes}, stored {stats.stored_bytes}")
        assert stats.evictions > 0 and stats.disk_bytes <= cap
        assert on_disk <= 1.1 * cap
    finally:
        assert kilnd.stop() == 0
