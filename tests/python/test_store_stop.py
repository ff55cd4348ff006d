"""A stop takes seconds, whatever kilnd is doing (issue 53): SIGTERM in the
middle of an eviction of thousands of entries, or of an import, ends kilnd
cleanly at once, and the store it leaves serves every entry it kept, whole;
SIGTERM while a worker compiles abandons the compile, whose
client compiles it itself, and stores nothing of it. (How long a stop takes is
measured by bench/store_bench.py.)"""

import json
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kiln.service import api as _api

import hermetic
import process_table
from conftest import BUILD, Kilnd
from bundle_files import publisher_key
from test_bundle import trusting

# kilnd takes outside bytes here: the asan lane runs these against its ASan+UBSan build.
pytestmark = pytest.mark.outside_bytes

LONG_COMPILE = Path(__file__).parent / "long_compile_program.py"
KILN = BUILD / "client" / "cpp" / "kiln"

ENTRIES = 4000


def put_entries(kilnd):
    """ENTRIES entries of 1-4 KB from 8 clients at once; returns key -> bytes."""
    rng = random.Random(53)
    contents = {f"entry{i}": rng.randbytes(rng.randint(1024, 4096)) for i in range(ENTRIES)}

    def put(key):
        kilnd.stub.Put(_api.PutRequest(namespace="scale", key=key, blobs=[_api.blob("k.bin", contents[key])]),
                       timeout=60)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, contents))
    return contents


def assert_some_but_not_all_kept_and_each_whole(root, contents):
    """A kilnd started again on `root` holds some of `contents` (key -> bytes),
    not all, and serves each entry it holds whole."""
    kilnd = Kilnd(root)
    try:
        kept = kilnd.stats().entries
        assert 0 < kept < ENTRIES
        found = 0
        for key, data in contents.items():
            response = kilnd.stub.Lookup(_api.LookupRequest(namespace="scale", key=key), timeout=60)
            if response.found:
                found += 1
                assert response.entry.blobs[0].data == data, key
        assert found == kept
    finally:
        assert kilnd.stop() == 0


def test_sigterm_in_the_middle_of_an_eviction_ends_kilnd_and_what_it_kept_is_whole(tmp_path):
    root = tmp_path / "kilnd"
    kilnd = Kilnd(root)
    try:
        contents = put_entries(kilnd)
        disk_bytes = kilnd.stats().disk_bytes
    finally:
        assert kilnd.stop() == 0
    # A tenth of it as the cap: thousands of entries to evict.
    config = tmp_path / "capped.conf"
    config.write_text(f"max_cache_size = {disk_bytes // 10}\n")
    kilnd = Kilnd(root, f"--config={config}")
    deadline = time.monotonic() + 60
    while kilnd.stats().evictions == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    stats = kilnd.stats()
    assert stats.evictions > 0, "no eviction started"
    kilnd.process.send_signal(signal.SIGTERM)
    assert kilnd.process.wait(timeout=60) == 0
    kilnd.stop()
    log = (root / "kilnd.out").read_text()
    assert "kilnd stopped cleanly" in log, log

    assert_some_but_not_all_kept_and_each_whole(root, contents)  # no cap there: nothing more goes


def test_sigterm_while_a_worker_compiles_abandons_the_compile_and_its_client_compiles_itself(tmp_path):
    # A kernel of some seconds (STEPS 300: about 6 s on the 2-core machine).
    stock_env = dict(hermetic.stock_env(), TRITON_CACHE_DIR=str(tmp_path / "stock-cache"))
    stock = subprocess.run([sys.executable, str(LONG_COMPILE), "300"], capture_output=True, text=True,
                           env=stock_env, timeout=600)
    assert stock.returncode == 0, stock.stderr[-3000:]

    root = tmp_path / "kilnd"
    kilnd = Kilnd(root, f"--toolchain={sys.executable}", "--compile-workers=1")
    idle_cpu = process_table.tree_cpu_seconds(kilnd.process.pid)
    env = dict(hermetic.stock_env(), TRITON_CACHE_DIR=str(tmp_path / "client-cache"),
               KILN_FILES_DIR=str(tmp_path / "kiln-files"), KILN="1", KILN_ENDPOINT=f"unix:{kilnd.socket}")
    client = subprocess.Popen([sys.executable, str(LONG_COMPILE), "300"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    try:
        # The worker is compiling once kilnd's processes have used half a second of CPU.
        def compiling():
            return process_table.tree_cpu_seconds(kilnd.process.pid) >= idle_cpu + 0.5

        deadline = time.monotonic() + 120
        while not compiling() and client.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.poll() is None and compiling(), "the worker never compiled"
        kilnd.process.send_signal(signal.SIGTERM)
        assert kilnd.process.wait(timeout=60) == 0
        kilnd.stop()
        out, err = client.communicate(timeout=600)
    finally:
        if client.poll() is None:
            client.kill()
    assert "kilnd stopped cleanly" in (root / "kilnd.out").read_text()
    # The client was told at once, and compiled with stock Triton: stock's cubin, one warning.
    assert client.returncode == 0, err[-3000:]
    assert err.count("compiling with stock Triton instead") == 1, err[-3000:]
    assert "the compile was abandoned" in err, err[-3000:]
    assert json.loads(out.splitlines()[-1]) == json.loads(stock.stdout.splitlines()[-1])
    # Nothing of the abandoned compile was stored, not even as a failure.
    kilnd = Kilnd(root)
    try:
        stats = kilnd.stats()
        assert (stats.entries, stats.compile_failures) == (0, 0)
    finally:
        assert kilnd.stop() == 0


def test_sigterm_in_the_middle_of_an_import_ends_kilnd_and_the_next_start_takes_the_import_back(tmp_path):
    private, public, _ = publisher_key(tmp_path)
    source = Kilnd(tmp_path / "source")
    try:
        put_entries(source)
        bundle = tmp_path / "scale.kilnbundle"
        exported = subprocess.run([str(KILN), "--endpoint", f"unix:{source.socket}", "export", str(bundle),
                                   "--sign", str(private)], capture_output=True, text=True, timeout=600)
        assert exported.returncode == 0, exported.stderr
    finally:
        assert source.stop() == 0

    root = tmp_path / "target"
    target = Kilnd(root, trusting(public))
    importing = subprocess.Popen([str(KILN), "--endpoint", f"unix:{target.socket}", "import", str(bundle)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while target.stats().entries == 0 and importing.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert importing.poll() is None and target.stats().entries > 0, "the import never started, or ended first"
        target.process.send_signal(signal.SIGTERM)
        assert target.process.wait(timeout=60) == 0
        target.stop()
        out, err = importing.communicate(timeout=60)
    finally:
        if importing.poll() is None:
            importing.kill()
    assert "kilnd stopped cleanly" in (root / "kilnd.out").read_text()
    # The import says it did not finish (kilnd went away: exit 3).
    assert importing.returncode == 3, (out, err)

    # All or nothing: the next start takes back what the import stored.
    again = Kilnd(root)
    try:
        deadline = time.monotonic() + 60
        while again.stats().entries > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert again.stats().entries == 0
        assert "an import that did not finish stored" in (root / "kilnd.out").read_text()
    finally:
        assert again.stop() == 0
