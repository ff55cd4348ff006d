"""Inductor's torch_key(), remembered across processes by the client
(kiln/inductor/memos.py): real torch (.venv-torch) in real processes with and
without Kiln, and the memo rules on trees made here."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from kiln.inductor import memos as _torch_memos
from kiln.triton import memos as _triton_memos

import hermetic

TORCH_PYTHON = Path(__file__).resolve().parents[2] / ".venv-torch" / "bin" / "python"

# torch_key() as inductor asks for it, and whether it hashed torch's sources
# to answer; then what a compile worker does with the key its parent sends.
PROGRAM = r"""
import json, sys
import torch._inductor.codecache as codecache
hashed = []
build_code_hash = codecache.build_code_hash
def counting(*args):
    hashed.append(1)
    return build_code_hash(*args)
codecache.build_code_hash = counting
key = codecache.torch_key()
assert codecache.torch_key() == key
hashed_first = len(hashed)
codecache.torch_key.clear()
codecache.torch_key.set(b"from the parent")
print(json.dumps({"key": key.hex(), "hashed": hashed_first > 0, "after_set": codecache.torch_key().hex(),
                  "hashed_after_set": len(hashed) > hashed_first}))
"""


def _run(tmp_path, kiln):
    environment = hermetic.stock_env("TORCHINDUCTOR")
    if kiln:
        environment.update(KILN="1", KILN_FILES_DIR=str(tmp_path / "files"),
                           KILN_ENDPOINT=f"unix:{tmp_path / 'no-kilnd.sock'}")
    result = subprocess.run([str(TORCH_PYTHON), "-c", PROGRAM], capture_output=True, text=True, env=environment,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.skipif(not TORCH_PYTHON.exists(), reason="needs .venv-torch (scripts/setup-python)")
def test_a_second_process_takes_torch_key_from_the_memo_and_a_workers_key_still_wins(tmp_path):
    stock = _run(tmp_path, kiln=False)
    assert stock["hashed"]

    first = _run(tmp_path, kiln=True)
    assert first["key"] == stock["key"] and first["hashed"]  # nothing remembered yet
    assert list((tmp_path / "files" / "memos").rglob("*.json")), "no memo written at exit"

    second = _run(tmp_path, kiln=True)
    assert second["key"] == stock["key"]
    assert not second["hashed"], "torch_key() hashed torch's sources again"

    # A compile worker sets the key its parent computed: that is what it gets.
    for run in (stock, first, second):
        assert run["after_set"] == b"from the parent".hex() and not run["hashed_after_set"]


def _package(root):
    (root / "sub").mkdir(parents=True)
    (root / "data").mkdir()
    for path in ("__init__.py", "module.py", "sub/__init__.py", "sub/inner.py", "data/header.h"):
        (root / path).write_text(f"# {path}\n")
    return root


def test_the_package_fingerprint_follows_what_torch_key_hashes(tmp_path):
    root = _package(tmp_path / "pkg")
    extra = tmp_path / "extra.cpp"

    def fingerprint():
        taken = _torch_memos.package_fingerprint(str(root), [str(extra)])
        assert taken is not None
        return taken[0]

    (root / "__pycache__").mkdir()  # as an install has them
    before = fingerprint()
    (root / "__pycache__" / "module.cpython-311.pyc").write_bytes(b"bytecode")
    (root / "data" / "header.h").write_text("# not a module, in no package\n")
    assert fingerprint() == before, "bytecode and files outside packages are not hashed by torch_key"

    inner = root / "sub" / "inner.py"
    stat = inner.stat()
    time.sleep(0.01)
    inner.write_text("# SUB/inner.py\n")  # same size, mtime put back: the change time still moves
    os.utime(inner, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changed = fingerprint()
    assert changed != before

    (root / "sub" / "added.py").write_text("")
    added = fingerprint()
    assert added != changed

    extra.write_text("now present")
    present = fingerprint()
    assert present != added

    (root / "sub" / "loop").symlink_to(root)  # a cycle: each directory is walked once
    assert fingerprint() != present


def test_a_value_first_computed_is_fingerprinted_at_exit_and_then_used(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_FILES_DIR", str(tmp_path / "files"))
    fingerprints, computed = [], []

    def fingerprint_of(newest_ns=0):
        fingerprints.append(newest_ns)
        return "fp1", newest_ns

    def compute(value):
        computed.append(value)
        return value

    assert _triton_memos.remembered_fingerprinting_at_exit("key", fingerprint_of, lambda: compute("a")) == "a"
    assert fingerprints == [], "no memo yet: nothing to fingerprint before the value"
    _triton_memos.wait_for_writes()  # what exit does
    assert fingerprints == [0]
    assert _triton_memos.remembered_fingerprinting_at_exit("key", fingerprint_of, lambda: compute("b")) == "a"
    assert computed == ["a"] and fingerprints == [0, 0]

    # A file that changed after the value was started: no memo.
    assert _triton_memos.remembered_fingerprinting_at_exit(
        "changing", lambda: fingerprint_of(time.time_ns()), lambda: compute("c")) == "c"
    _triton_memos.wait_for_writes()
    assert not (Path(_triton_memos._memo_path("changing"))).exists()

    # A memo whose files changed since: computed again, and kept for the new fingerprint.
    assert _triton_memos.remembered_fingerprinting_at_exit(
        "key", lambda: ("fp2", 0), lambda: compute("d")) == "d"
    _triton_memos.wait_for_writes()
    assert _triton_memos.remembered_fingerprinting_at_exit(
        "key", lambda: ("fp2", 0), lambda: compute("e")) == "d"
    assert computed == ["a", "c", "d"]
