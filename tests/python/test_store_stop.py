"""A stop takes seconds, whatever the store is doing (issue 53): SIGTERM in the
middle of an eviction of thousands of entries ends kilnd cleanly at once
instead of after the eviction, and the store it leaves serves every entry it
kept, whole. (How long a stop takes is measured by bench/store_bench.py.)"""

import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor

from kiln.service import api as _api

from conftest import Kilnd

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

    kilnd = Kilnd(root)  # no cap: nothing more goes
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
