"""python -m kiln status: is kilnd reachable, is this Python's Triton registered,
and what has the cache done.
python -m kiln misses [--last N] [--json]: the latest compiles and what was new
for each (the kernel, its source, options, environment, Triton, an eviction).
python -m kiln prewarm FILE --target cuda:89 [--target ...]: compile a bundle's
kernels (`kiln export`) for other GPUs, so their clients start warm.
python -m kiln service install|uninstall|status: kilnd as the machine's service,
from this platform wheel, with this Python registered (Windows, elevated)."""

import argparse
import os
import sys


def triton_support(versions):
    unsupported = versions.unsupported_reason()
    if unsupported:
        return f"NO: {unsupported}"
    tested = "%d.%d to %d.%d" % (versions.OLDEST + versions.NEWEST_TESTED)
    if versions.is_untested():
        return f"untested (Kiln is tested with triton {tested}); every part of Triton Kiln relies on is in place"
    return f"tested (Kiln is tested with triton {tested})"


def status():
    import triton

    from kiln.service import api as _api
    from kiln.service import paths as _paths
    from kiln.service import connection as _service
    from kiln.triton import versions as _triton_versions
    from kiln.triton.versions import triton_key

    endpoint = _paths.default_endpoint()
    token_note = f" (token from {endpoint.endpoint_file})" if endpoint.token else ""
    print(f"endpoint:  {endpoint.describe()}{token_note}")
    startable = _service.kilnd_to_start()
    if not endpoint.is_user_default:
        print("autostart: none (the endpoint is not this user's default)")
    elif startable:
        print(f"autostart: {startable[0]} (from {startable[1]}), when none answers")
    else:
        print("autostart: none (no KILN_KILND, no kilnd in this wheel, none on PATH)")
    try:
        stub = _service.connect(endpoint, autostart=False).stub
    except _service.KilnUnavailable as error:
        print(f"service:   NOT REACHABLE ({error})")
        return 1
    stats = stub.GetStats(_api.GetStatsRequest(), timeout=10)
    print(f"service:   kilnd {stats.server_version}, up {stats.uptime_seconds:.0f} s, data dir {stats.data_dir}")
    print(f"binary:    {stats.executable}{_service.kilnd_origin(stats.executable)}")
    key = triton_key()
    toolchains = stub.ListToolchains(_api.ListToolchainsRequest(), timeout=10).toolchains
    mine = [t for t in toolchains if t.triton_key == key]
    state = "registered" if mine else "not registered yet (it registers on this Python's first compile)"
    print(f"toolchain: triton {triton.__version__} at {sys.executable}: {state}")
    print(f"support:   {triton_support(_triton_versions)}")
    print(f"launchers: {launcher_readiness(stub)}")
    lookups = stats.hits + stats.misses
    rate = 100.0 * stats.hits / lookups if lookups else 0.0
    print(f"cache:     {stats.entries} entries, {stats.stored_bytes / 2**20:.1f} MiB; "
          f"{stats.hits} hits, {stats.misses} misses ({rate:.0f}% hits)")
    print(f"compiles:  {stats.compiles} run, {stats.compile_cache_hits} served from cache, "
          f"{stats.single_flight_joins + stats.lookups_waited} shared with another process, "
          f"{stats.compile_failures} failed")
    # A kernel hit is a compile this process did not run, like a compile served
    # from the cache or shared with another process's compile.
    kernel_hits = sum(n.hits for n in stats.lookups_by_namespace if n.namespace.endswith("/triton"))
    avoided = kernel_hits + stats.compile_cache_hits + stats.single_flight_joins
    if stats.compiles:
        mean = stats.compile_seconds / stats.compiles
        print(f"saved:     {avoided} compiles, about {mean * avoided:.1f} s (mean compile {mean * 1e3:.0f} ms)")
    else:
        print(f"saved:     {avoided} compiles")
    graphs_waited = sum(n.waited_hits for n in stats.lookups_by_namespace if n.namespace.endswith("/inductor"))
    if graphs_waited:
        print(f"inductor:  {graphs_waited} graph compiles saved by waiting for another process's")
    if stats.misses_by_reason:
        print("misses:    " + ", ".join(f"{r.count} {r.reason}" for r in stats.misses_by_reason))
    return 0


# A module of nothing: what a launcher build of this Python needs (Python.h,
# its import library, a C compiler), and no more.
_PROBE_MODULE = "kiln_launcher_probe"
_PROBE_SOURCE = """#include <Python.h>
static struct PyModuleDef probe = {PyModuleDef_HEAD_INIT, "kiln_launcher_probe", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_kiln_launcher_probe(void) { return PyModule_Create(&probe); }
"""


def launcher_readiness(stub):
    """Whether kilnd builds launcher modules that this Python loads, and why
    not: kilnd builds a module of nothing for it (once; it is cached), and this
    process imports it. An embedded Python (no Python.h) is where this fails."""
    import hashlib
    import importlib.util

    import grpc

    from kiln.triton import early_launchers as _early_launchers
    from kiln.service import paths as _paths

    request = _early_launchers.request(_PROBE_MODULE, _PROBE_SOURCE, [], [], [], None)
    try:
        response = stub.BuildLauncher(request, timeout=300)
    except grpc.RpcError as error:
        return f"WILL FAIL: kilnd answered {error.code().name}: {error.details()}"
    if response.WhichOneof("result") == "error":
        return f"WILL FAIL: {response.error.message}\n{response.error.log}".rstrip()
    # Kept in Kiln's files, by content: Windows cannot delete a loaded module,
    # and the next status loads the same bytes from the same file.
    data = response.module.data
    folder = os.path.join(_paths.files_dir(), "launcher-probe", hashlib.sha256(data).hexdigest()[:32])
    path = os.path.join(folder, _PROBE_MODULE + request.python_abi.ext_suffix)
    try:
        if not os.path.exists(path):
            os.makedirs(folder, exist_ok=True)
            part = f"{path}.{os.getpid()}.part"
            with open(part, "wb") as module:
                module.write(data)
            os.replace(part, path)
        spec = importlib.util.spec_from_file_location(_PROBE_MODULE, path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except Exception as error:  # noqa: BLE001  (any failure to load is the answer)
        return f"WILL FAIL: kilnd's module does not load here ({type(error).__name__}: {error})"
    return "kilnd builds them, and this Python loads them"


def misses(last, as_json):
    import json
    import time

    from kiln.service import api as _api
    from kiln.service import connection as _service

    try:
        stub = _service.connect(autostart=False).stub
    except _service.KilnUnavailable as error:
        print(f"kilnd is not reachable: {error}", file=sys.stderr)
        return 3
    found = stub.ListMisses(_api.ListMissesRequest(last=last), timeout=10).misses
    if as_json:
        print(json.dumps([{"unix_ms": m.unix_ms, "namespace": m.namespace, "key": m.key, "kernel": m.kernel,
                           "reasons": list(m.reasons)} for m in found], indent=1))
        return 0
    for miss in found:
        when = time.strftime("%H:%M:%S", time.localtime(miss.unix_ms / 1000))
        print(f"{when}  {miss.kernel or miss.key[:16]:40}  {', '.join(miss.reasons)}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kiln")
    parser.add_argument("command", choices=["status", "misses", "prewarm", "service"])
    parser.add_argument("file", nargs="?", help="prewarm: the bundle; service: install, uninstall or status")
    parser.add_argument("--last", type=int, default=20, help="misses: how many (at most 1000)")
    parser.add_argument("--json", action="store_true", help="misses: as JSON")
    parser.add_argument("--target", action="append", default=[], help="prewarm: a GPU to compile for, e.g. cuda:89")
    args = parser.parse_args(argv)
    if args.command == "misses":
        return misses(args.last, args.json)
    if args.command == "prewarm":
        if args.file is None:
            parser.error("prewarm needs FILE")
        from . import _prewarm

        return _prewarm.prewarm(args.file, args.target)
    if args.command == "service":
        if args.file not in ("install", "uninstall", "status"):
            parser.error("service needs install, uninstall or status")
        from kiln.commands import service

        return service.main(args.file)
    return status()


if __name__ == "__main__":
    sys.exit(main())
