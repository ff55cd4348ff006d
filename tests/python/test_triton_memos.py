"""What stock Triton works out in every process (triton_key(), `ptxas --version`,
the launchers' platform key),
remembered across processes by the client (kiln/triton/memos.py): the real
triton package, in real processes with and without Kiln."""

import importlib.metadata
import json
import os
import stat
import struct
import subprocess
import sys
import time

import pytest

import hermetic
from conftest import BUILD, REPO, Kilnd
from kiln.service import api as _api
from kiln.triton import memos as _triton_memos
from test_triton_versions import VERSIONS, python_of

# Computes what the memos stand in for, and says what it read and ran to get it
# (Python's audit events: every open() and every subprocess).
PROGRAM = r"""
import json, os, sys
opened, records, spawned = [], [], []
def audit(event, args):
    if event == "open" and isinstance(args[0], str) and os.path.basename(args[0]).startswith("libtriton."):
        opened.append(args[0])
    elif event == "open" and isinstance(args[0], str) and os.path.basename(args[0]) == "RECORD":
        records.append(args[0])
    elif event == "subprocess.Popen":
        argv = args[1]
        spawned.append(os.path.basename(str(argv[0] if isinstance(argv, (list, tuple)) else argv).split()[0]))
sys.addaudithook(audit)
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend, get_ptxas_version
from triton.runtime.build import platform_key
try:
    from triton.runtime.cache import triton_key
except ImportError:  # Triton 3.4
    from triton.compiler.compiler import triton_key
key = triton_key()
print(json.dumps({"triton_key": key, "ptxas_version": get_ptxas_version(), "platform_key": platform_key(),
                  "ptxas_release": knobs.nvidia.ptxas.version,
                  "backend_hash": CUDABackend(GPUTarget("cuda", 90, 32)).hash(),
                  "read_libtriton": bool(opened), "read_record": bool(records), "spawned": spawned, "kilnd_client_imported": "kiln.service.connection" in sys.modules}))
"""


# This interpreter's Triton, and each other version of the matrix (3.4 keeps
# triton_key() elsewhere; before 3.6 the ptxas functions take no arch).
PYTHONS = [sys.executable] + [str(python_of(version)) for version in VERSIONS
                              if version != importlib.metadata.version("triton")]


def _run(tmp_path, kiln, python=sys.executable, kilnd=None, files="files", **env):
    environment = hermetic.stock_env()
    environment.update(env, TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    if kiln:
        # Unless a kilnd is given, nothing here needs one: an endpoint where none listens.
        environment.update(KILN="1", KILN_FILES_DIR=str(tmp_path / files),
                           KILN_ENDPOINT=f"unix:{kilnd.socket if kilnd else tmp_path / 'no-kilnd.sock'}")
    result = subprocess.run([python, "-c", PROGRAM], capture_output=True, text=True, env=environment, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def _values(run):
    return {name: run[name] for name in ("triton_key", "ptxas_version", "ptxas_release", "backend_hash",
                                         "platform_key")}


@pytest.mark.parametrize("python", PYTHONS)
def test_a_second_process_takes_triton_key_the_ptxas_version_and_the_platform_key_from_the_memos(tmp_path, python):
    stock = _run(tmp_path, kiln=False, python=python)
    assert stock["read_libtriton"] and {"ptxas", "file"} <= set(stock["spawned"])

    # Nothing remembered yet: the key is stock's, its library's digest taken
    # from the wheel's RECORD (kiln/triton/recorded_key.py), not hashed.
    first = _run(tmp_path, kiln=True, python=python)
    assert _values(first) == _values(stock)
    assert first["read_record"] and not first["read_libtriton"], "triton_key() hashed libtriton"
    assert "ptxas" in first["spawned"]

    second = _run(tmp_path, kiln=True, python=python)
    assert _values(second) == _values(stock)
    assert not second["read_libtriton"] and not second["read_record"], "triton_key() was worked out again"
    assert second["spawned"] == [], "ptxas --version or file ran again"

    # Stock Triton's test knob still wins over a memo.
    mocked = _run(tmp_path, kiln=True, python=python, TRITON_MOCK_PTX_VERSION="12.3.0")
    assert mocked["ptxas_version"] == "12.3.0"


# kiln_worker.py as kilnd runs it (python -I), saying on stderr each time it opens libtriton.
WORKER_UNDER_AUDIT = """
import os, runpy, sys
def audit(event, args):
    if event == "open" and isinstance(args[0], str) and os.path.basename(args[0]).startswith("libtriton."):
        os.write(2, b"opened libtriton\\n")
sys.addaudithook(audit)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _worker_hello(python):
    """The worker's answer to kilnd's probe (the hello job), and its stderr."""
    header = json.dumps({"op": "hello"}).encode()
    result = subprocess.run([python, "-I", "-c", WORKER_UNDER_AUDIT, str(REPO / "compiler" / "worker" / "kiln_worker.py")],
                            input=struct.pack("<I", len(header)) + header, capture_output=True,
                            env=hermetic.stock_env(), timeout=300)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    (length,) = struct.unpack("<I", result.stdout[:4])
    return json.loads(result.stdout[4:4 + length]), result.stderr.decode(errors="replace")


@pytest.mark.parametrize("python", PYTHONS)
def test_kilnds_probe_of_a_toolchain_takes_triton_key_from_the_record_not_by_hashing_libtriton(tmp_path, python):
    """A kilnd's first start probes its toolchain on a core that the user's
    first program compiles on: its worker reads libtriton's digest from the
    wheel's RECORD, as the client does, and gets stock's key."""
    stock = _run(tmp_path, kiln=False, python=python)
    hello, stderr = _worker_hello(python)
    assert hello["ok"] and hello["triton_key"] == stock["triton_key"]
    assert "opened libtriton" not in stderr, "the worker hashed libtriton"


def _serve_kilnds_memos_now(kilnd):
    """kilnd serves a stored entry as files moments after the Put that stored
    it; a Lookup asking for files serves it at once, so that the next process
    started at once finds it."""
    listed = kilnd.stub.ListEntries(_api.ListEntriesRequest(namespace=_triton_memos.KILND_NAMESPACE)).entries
    for entry in listed:
        assert kilnd.stub.Lookup(_api.LookupRequest(namespace=entry.namespace, key=entry.key, as_files=True)).found
    return len(listed)


def test_a_process_whose_files_dir_is_fresh_takes_the_memos_from_the_local_kilnd(tmp_path):
    kilnd = Kilnd(tmp_path / "kilnd")
    try:
        first = _run(tmp_path, kiln=True, kilnd=kilnd, files="first")
        assert first["read_record"] and "ptxas" in first["spawned"]
        assert _serve_kilnds_memos_now(kilnd) >= 3  # triton_key, ptxas --version, platform_key (tool releases)

        fresh = _run(tmp_path, kiln=True, kilnd=kilnd, files="fresh")
        assert _values(fresh) == _values(first)
        assert not fresh["read_libtriton"] and not fresh["read_record"], \
            "triton_key() was worked out though kilnd had its memo"
        assert fresh["spawned"] == [], "ptxas --version or file ran though kilnd had their memos"
        assert not fresh["kilnd_client_imported"], "kilnd's memos were not read as its files"

        # A memo kilnd keeps is used only for its own fingerprint too.
        ptxas = tmp_path / "bin" / "ptxas"
        ptxas.parent.mkdir()
        _fake_ptxas(ptxas, "12.8")
        _run(tmp_path, kiln=True, kilnd=kilnd, files="fake-12.8", TRITON_PTXAS_PATH=str(ptxas))
        _serve_kilnds_memos_now(kilnd)
        _fake_ptxas(ptxas, "13.1")
        changed = _run(tmp_path, kiln=True, kilnd=kilnd, files="fake-13.1", TRITON_PTXAS_PATH=str(ptxas))
        assert changed["ptxas_release"] == "13.1" and "ptxas" in changed["spawned"]

        # They hold for this machine's files only: a bundle never carries them.
        exported = subprocess.run([str(BUILD / "client" / "cpp" / "kiln"), "--endpoint", f"unix:{kilnd.socket}",
                                   "export", str(tmp_path / "cache.kilnbundle")], capture_output=True, text=True)
        assert exported.returncode == 1 and "only the client's memos matched" in exported.stderr, exported
        assert not (tmp_path / "cache.kilnbundle").exists()
    finally:
        kilnd.stop()


def _fake_ptxas(path, release):
    """A ptxas that only answers --version: what is tested is that a changed binary is asked again."""
    path.write_text(f"#!/bin/sh\necho 'ptxas: NVIDIA (R) Ptx optimizing assembler'\n"
                    f"echo 'Cuda compilation tools, release {release}, V{release}.1'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_a_changed_ptxas_is_asked_its_version_again(tmp_path):
    ptxas = tmp_path / "bin" / "ptxas"
    ptxas.parent.mkdir()
    _fake_ptxas(ptxas, "12.8")
    first = _run(tmp_path, kiln=True, TRITON_PTXAS_PATH=str(ptxas))
    assert first["ptxas_release"] == "12.8" and "release 12.8," in first["ptxas_version"]
    assert "ptxas" in first["spawned"]
    again = _run(tmp_path, kiln=True, TRITON_PTXAS_PATH=str(ptxas))
    assert _values(again) == _values(first) and again["spawned"] == []

    _fake_ptxas(ptxas, "13.1")  # same size, rewritten in place
    changed = _run(tmp_path, kiln=True, TRITON_PTXAS_PATH=str(ptxas))
    assert changed["ptxas_release"] == "13.1" and "release 13.1," in changed["ptxas_version"]
    assert changed["backend_hash"] != first["backend_hash"]


# Imports triton, then works 2 s before its first compile asks for the ptxas
# version and the Triton key, as a program sets up before its first kernel.
LATE_ASKER = r"""
import json, time
import triton
from triton.backends.nvidia.compiler import get_ptxas_version
from triton.runtime.cache import triton_key
time.sleep(2)
asked = time.time()
version = get_ptxas_version()
key = triton_key()
print(json.dumps({"asked": asked, "version": version, "key": key}))
"""


def test_the_ptxas_version_and_the_key_are_worked_out_as_triton_imports_not_when_first_asked(tmp_path):
    """On a thread (the prefetch), the first day too: `ptxas --version` (the
    tool's release, then the backend's key) runs before the program asks, and
    once each, as stock runs it; KILN_PREFETCH=0 leaves both to the first ask."""
    ptxas, runs = tmp_path / "ptxas", tmp_path / "ptxas-runs"
    _fake_ptxas(ptxas, "12.8")
    ptxas.write_text(ptxas.read_text().replace("#!/bin/sh\n", f"#!/bin/sh\ndate +%s.%N >>{runs}\n", 1))

    def run(name, **settings):
        runs.unlink(missing_ok=True)
        environment = dict(hermetic.stock_env(), KILN="1", KILN_FILES_DIR=str(tmp_path / name),
                           KILN_ENDPOINT=f"unix:{tmp_path / 'no-kilnd.sock'}", TRITON_PTXAS_PATH=str(ptxas),
                           TRITON_CACHE_DIR=str(tmp_path / "triton-cache"), **settings)
        done = subprocess.run([sys.executable, "-c", LATE_ASKER], capture_output=True, text=True, env=environment,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1]), [float(line) for line in runs.read_text().split()]

    prefetched, ran = run("prefetched")
    assert len(ran) == 2 and max(ran) < prefetched["asked"], (ran, prefetched["asked"])
    asked, ran_when_asked = run("asked", KILN_PREFETCH="0")
    assert len(ran_when_asked) == 2 and min(ran_when_asked) >= asked["asked"]
    assert (prefetched["version"], prefetched["key"]) == (asked["version"], asked["key"])
    assert "release 12.8," in prefetched["version"]


def _tree(root):
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "module.py").write_text("x = 1\n")
    (root / "lib.so").write_bytes(b"\0" * 64)


def test_the_install_fingerprint_follows_every_file_and_directory_but_bytecode(tmp_path):
    _tree(tmp_path)
    fingerprint = _triton_memos.tree_fingerprint(str(tmp_path))
    assert _triton_memos.tree_fingerprint(str(tmp_path)) == fingerprint

    (tmp_path / "pkg" / "__pycache__" / "module.cpython-311.pyc").write_bytes(b"bytecode")
    assert _triton_memos.tree_fingerprint(str(tmp_path)) == fingerprint, "bytecode written on import counted"

    module = tmp_path / "pkg" / "module.py"
    before = module.stat()
    time.sleep(0.05)  # file times tick with the kernel's clock (up to 10 ms): a later edit, not the same instant
    module.write_text("x = 2\n")  # same size
    os.utime(module, ns=(before.st_atime_ns, before.st_mtime_ns))  # even with its old time back
    changed = _triton_memos.tree_fingerprint(str(tmp_path))
    assert changed != fingerprint

    (tmp_path / "pkg" / "new.py").write_text("")
    assert _triton_memos.tree_fingerprint(str(tmp_path)) != changed
    assert _triton_memos.tree_fingerprint(str(tmp_path / "missing")) is None


def test_a_memo_is_used_only_for_its_own_fingerprint(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_FILES_DIR", str(tmp_path / "files"))
    computed = []

    def compute(value):
        computed.append(value)
        return value

    assert _triton_memos.remembered("name", "fp1", lambda: compute("a")) == "a"
    assert _triton_memos.remembered("name", "fp1", lambda: compute("b")) == "a"
    assert _triton_memos.remembered("name", "fp2", lambda: compute("c")) == "c"
    assert _triton_memos.remembered("other", "fp2", lambda: compute("d")) == "d"
    assert _triton_memos.remembered("failing", "fp", lambda: compute(None)) is None
    assert _triton_memos.remembered("failing", "fp", lambda: compute("e")) == "e"  # a failure is not kept
    assert computed == ["a", "c", "d", None, "e"]

    # A memo file cut short (a crash mid-write, a full disk) is a miss, not an error.
    _triton_memos.wait_for_writes()
    memos = list((tmp_path / "files" / "memos").rglob("*.json"))
    assert len(memos) == 3  # name, other, failing: the last value of each
    for memo in memos:
        memo.write_bytes(memo.read_bytes()[:7])
    assert _triton_memos.remembered("name", "fp2", lambda: compute("f")) == "f"
