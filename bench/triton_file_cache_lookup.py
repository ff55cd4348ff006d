"""Stock Triton's warm cache hit, for comparison with a kilnd lookup.

Times what triton.compile does on a hit in its file cache: FileCacheManager for
the key, get_group() of the kernel's metadata JSON, then reading every file of
the group (CompiledKernel reads the cubin and the other artifacts).

usage: triton_file_cache_lookup.py SIZE CLIENTS SECONDS
Prints: "<p50 ms> <p99 ms> <hits/s>".
"""

import multiprocessing
import os
import statistics
import sys
import tempfile
import time


def _populate(size: int) -> str:
    from triton.runtime.cache import FileCacheManager

    key = "bench-%d" % size
    manager = FileCacheManager(key)
    paths = {
        "kernel.cubin": manager.put(os.urandom(size), "kernel.cubin", binary=True),
        "kernel.json": manager.put('{"name": "kernel"}', "kernel.json"),
    }
    manager.put_group("kernel.json", paths)
    return key


def _client(key: str, seconds: float, results) -> None:
    from triton.runtime.cache import FileCacheManager

    latencies = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        start = time.perf_counter()
        group = FileCacheManager(key).get_group("kernel.json")
        for path in group.values():
            with open(path, "rb") as artifact:
                artifact.read()
        latencies.append(time.perf_counter() - start)
    results.put(latencies)


def main() -> None:
    size, clients, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    with tempfile.TemporaryDirectory() as cache_dir:
        os.environ["TRITON_CACHE_DIR"] = cache_dir
        key = _populate(size)
        results = multiprocessing.Queue()
        workers = [
            multiprocessing.Process(target=_client, args=(key, seconds, results))
            for _ in range(clients)
        ]
        for worker in workers:
            worker.start()
        latencies = [value for _ in workers for value in results.get()]
        for worker in workers:
            worker.join()
    latencies.sort()
    p50 = statistics.median(latencies) * 1e3
    p99 = latencies[int(len(latencies) * 0.99)] * 1e3
    print("%.3f %.3f %.0f" % (p50, p99, len(latencies) / seconds))


if __name__ == "__main__":
    main()
