"""python -m kiln status: is kilnd reachable, is this Python's Triton registered,
and what has the cache done."""

import argparse
import sys


def status():
    from triton.runtime.cache import triton_key
    import triton

    from . import _api, _paths, _service

    endpoint = _paths.default_endpoint()
    token_note = f" (token from {endpoint.endpoint_file})" if endpoint.token else ""
    print(f"endpoint:  {endpoint.describe()}{token_note}")
    try:
        stub = _service.connect(endpoint, autostart=False).stub
    except _service.KilnUnavailable as error:
        print(f"service:   NOT REACHABLE ({error})")
        return 1
    stats = stub.GetStats(_api.GetStatsRequest(), timeout=10)
    print(f"service:   kilnd {stats.server_version}, up {stats.uptime_seconds:.0f} s, data dir {stats.data_dir}")
    key = triton_key()
    toolchains = stub.ListToolchains(_api.ListToolchainsRequest(), timeout=10).toolchains
    mine = [t for t in toolchains if t.triton_key == key]
    state = "registered" if mine else "not registered yet (it registers on this Python's first compile)"
    print(f"toolchain: triton {triton.__version__} at {sys.executable}: {state}")
    lookups = stats.hits + stats.misses
    rate = 100.0 * stats.hits / lookups if lookups else 0.0
    print(f"cache:     {stats.entries} entries, {stats.stored_bytes / 2**20:.1f} MiB; "
          f"{stats.hits} hits, {stats.misses} misses ({rate:.0f}% hits)")
    print(f"compiles:  {stats.compiles} run, {stats.compile_cache_hits} served from cache, "
          f"{stats.single_flight_joins + stats.lookups_waited} shared with another process, "
          f"{stats.compile_failures} failed")
    if stats.compiles:
        mean = stats.compile_seconds / stats.compiles
        saved = mean * (stats.compile_cache_hits + stats.single_flight_joins + stats.lookups_waited)
        print(f"saved:     about {saved:.1f} s of compiling (mean compile {mean * 1e3:.0f} ms)")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kiln")
    parser.add_argument("command", choices=["status"])
    parser.parse_args(argv)
    return status()


if __name__ == "__main__":
    sys.exit(main())
