"""What a process imports to reach kilnd, its first miss's cost under Wine
(a few ms a module there): for this machine's kilnd, neither google.protobuf
nor grpc, nor the socket module (_socket is enough); for a farm's (grpcio's
transport), not grpc.aio until something uses it (and then the whole of it);
and nothing of starting kilnd or of a fleet where kilnd answers."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import hermetic
import pytest
from conftest import Kilnd


def _run(code, env=None):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_client_of_kilnd_loads_without_google_protobuf_or_grpc():
    loaded = _run("import json, sys\n"
                  "import kiln.triton.remote\n"
                  "print(json.dumps(sorted(name for name in sys.modules\n"
                  "                        if name.startswith(('google', 'grpc')))))")
    assert loaded == []


def test_grpcios_transport_loads_without_grpc_aio():
    loaded = _run("import json, sys\n"
                  "import kiln.service.grpc_channel\n"
                  "print(json.dumps(['grpc' in sys.modules, sorted(name for name in sys.modules\n"
                  "                                               if name.startswith('grpc.aio.'))]))")
    assert loaded == [True, []]


def test_a_program_that_uses_grpc_aio_after_the_client_gets_all_of_it():
    names = _run("import json\n"
                 "import kiln.service.grpc_channel\n"
                 "import grpc.aio\n"
                 "from grpc.aio import Metadata, insecure_channel\n"
                 "import grpc.experimental.aio as old_name\n"
                 "print(json.dumps([callable(insecure_channel), Metadata.__module__, old_name.Channel.__name__,\n"
                 "                  type(grpc.aio).__name__, grpc.aio.AioRpcError.__name__]))")
    assert names == [True, "grpc.aio._metadata", "Channel", "module", "AioRpcError"]


def test_a_program_that_imports_a_module_of_grpc_aio_first_gets_it():
    names = _run("import json\n"
                 "import kiln.service.grpc_channel\n"
                 "import grpc.aio._channel as channel_module\n"
                 "import grpc.aio\n"
                 "print(json.dumps([channel_module.Channel.__name__, grpc.aio.secure_channel.__name__]))")
    assert names == ["Channel", "secure_channel"]


def test_a_program_that_imported_grpc_before_the_client_keeps_its_grpc_aio():
    kind = _run("import json, sys\n"
                "import grpc\n"
                "aio = sys.modules['grpc.aio']\n"
                "import kiln.service.grpc_channel\n"
                "print(json.dumps([sys.modules['grpc.aio'] is aio, type(aio).__name__]))")
    assert kind == [True, "module"]


def test_reaching_a_kilnd_by_address_imports_no_idna_codec():
    # A str host would be encoded by the idna codec (with stringprep and unicodedata).
    loaded = _run("import json, sys\n"
                  "from kiln.service import grpc_channel\n"
                  "addresses = grpc_channel.fleet_addresses('127.0.0.1:7733')\n"
                  "print(json.dumps([addresses[0], 'encodings.idna' in sys.modules]))")
    assert loaded == [["127.0.0.1:7733"], False]


@pytest.mark.parametrize("transport", ["unix-socket", "endpoint-file"])
def test_connecting_to_a_running_kilnd_imports_neither_grpc_nor_socket_nor_autostart_nor_a_fleets_stub(
        transport, kilnd, tmp_path):
    if transport == "unix-socket":
        reach, server = {"KILN_ENDPOINT": f"unix:{kilnd.socket}"}, None
    else:  # Windows' way
        endpoint_file = tmp_path / "run" / "kilnd.endpoint"
        server = Kilnd(tmp_path / "kilnd", f"--endpoint-file={endpoint_file}")
        reach = {"KILN_ENDPOINT_FILE": str(endpoint_file)}
    try:
        loaded = _run("import json, sys\n"
                      "from kiln.service import api, connection\n"
                      "connection.connect().stub.GetStats(api.GetStatsRequest(), timeout=30)\n"
                      "print(json.dumps([name for name in ('grpc', 'kiln.service.grpc_channel', 'socket',\n"
                      "                                    'kiln.service.autostart', 'kiln.service.fleet')\n"
                      "                  if name in sys.modules]))",
                      env=dict(hermetic.stock_env(), **reach))
    finally:
        if server is not None:
            assert server.stop() == 0
    assert loaded == []


# --- Kiln's own modules from their .pyc files (kiln/_own_modules.py) ----------

CLIENT_PACKAGE = Path(__file__).resolve().parents[2] / "client" / "python" / "kiln"

# Which loader loaded each of Kiln's modules, and what a module now holds.
_LOADERS = ("import json, sys\n"
            "sys.path.insert(0, sys.argv[1])\n"
            "import importlib, kiln, kiln.triton.remote, kiln.service.hpack\n"
            "exec(sys.argv[2] if len(sys.argv) > 2 else '')\n"
            "print(json.dumps({'loaders': {name: type(module.__spec__.loader).__name__\n"
            "                              for name, module in sys.modules.items() if name.startswith('kiln')},\n"
            "                  'edited': getattr(kiln.service.hpack, 'EDITED', None),\n"
            "                  'source_of_code': kiln.service.hpack.encode.__code__.co_filename}))\n")


def _copied_client(parent, *compileall_options):
    """Kiln's client package under `parent`, compiled as pip compiles it at install."""
    package = parent / "kiln"
    shutil.copytree(CLIENT_PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "compileall", "-q", *compileall_options, str(package)],
                   check=True, env=hermetic.stock_env("SOURCE_DATE_EPOCH"))
    return package


def _loaders(folder, then=""):
    done = subprocess.run([sys.executable, "-c", _LOADERS, str(folder), then], capture_output=True, text=True,
                          env=hermetic.stock_env("SOURCE_DATE_EPOCH", "PYTHON"))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_kilns_modules_load_from_their_pyc_files_with_their_codes_naming_the_sources_where_they_are_now(tmp_path):
    _copied_client(tmp_path / "installed")
    (tmp_path / "installed").rename(tmp_path / "moved")  # the .pyc files name the sources where they were made
    seen = _loaders(tmp_path / "moved")
    by_python = {name for name, loader in seen["loaders"].items() if loader != "_PycLoader"}
    assert by_python == {"kiln", "kiln._own_modules"}  # the two that put the finder in place
    assert len(seen["loaders"]) > 25
    assert seen["source_of_code"] == str(tmp_path / "moved" / "kiln" / "service" / "hpack.py")


def test_a_changed_source_loads_as_changed_and_from_its_new_pyc_in_the_next_process(tmp_path):
    package = _copied_client(tmp_path)
    hpack = package / "service" / "hpack.py"
    with hpack.open("a") as source:
        source.write("\nEDITED = 1\n")
    changed = _loaders(tmp_path)
    assert changed["edited"] == 1 and changed["loaders"]["kiln.service.hpack"] == "SourceFileLoader"
    again = _loaders(tmp_path)
    assert again["edited"] == 1 and again["loaders"]["kiln.service.hpack"] == "_PycLoader"

    # The same size, another second: Python's rule (the mtime in the .pyc's header) as well.
    text = hpack.read_text()
    hpack.write_text(text.replace("EDITED = 1", "EDITED = 2"))
    os.utime(hpack, (hpack.stat().st_atime, hpack.stat().st_mtime + 2))
    changed = _loaders(tmp_path)
    assert changed["edited"] == 2 and changed["loaders"]["kiln.service.hpack"] == "SourceFileLoader"


def test_pyc_files_python_checks_by_hash_a_damaged_one_and_a_reload_go_to_pythons_own_loader(tmp_path):
    _copied_client(tmp_path / "hashed", "--invalidation-mode", "checked-hash")
    hashed = _loaders(tmp_path / "hashed")
    assert set(hashed["loaders"].values()) == {"SourceFileLoader"}

    package = _copied_client(tmp_path / "damaged")
    pyc = next((package / "service" / "__pycache__").glob("hpack.*.pyc"))
    pyc.write_bytes(pyc.read_bytes()[:40])  # the header intact, the code cut short
    damaged = _loaders(tmp_path / "damaged")
    assert damaged["loaders"]["kiln.service.hpack"] == "_PycLoader"  # which compiled the source (Python's fails)
    assert damaged["source_of_code"].endswith("hpack.py")

    _copied_client(tmp_path / "plain")
    reloaded = _loaders(tmp_path / "plain", "importlib.reload(kiln.service.hpack)")
    assert reloaded["loaders"]["kiln.service.hpack"] == "SourceFileLoader"
