"""python -m kiln status: is kilnd reachable, is this Python's Triton registered,
and what has the cache done."""

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
    from kiln.service import autostart as _autostart
    from kiln.service import connection as _service
    from kiln.service import paths as _paths
    from kiln.triton import versions as _triton_versions
    from kiln.triton.versions import triton_key

    endpoint = _paths.default_endpoint()
    token_note = f" (token from {endpoint.endpoint_file})" if endpoint.token else ""
    print(f"endpoint:  {endpoint.describe()}{token_note}")
    startable = _autostart.kilnd_to_start()
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

    from kiln.service import paths as _paths
    from kiln.service.errors import RpcError
    from kiln.triton import early_launchers as _early_launchers

    request = _early_launchers.request(_PROBE_MODULE, _PROBE_SOURCE, [], [], [], None)
    try:
        response = stub.BuildLauncher(request, timeout=300)
    except RpcError as error:
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
