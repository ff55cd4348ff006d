"""What a process imports to reach kilnd, its first miss's cost under Wine
(a few ms a module there): for this machine's kilnd, neither google.protobuf
nor grpc, nor the socket module (_socket is enough); for a farm's (grpcio's
transport), not grpc.aio until something uses it (and then the whole of it);
and nothing of starting kilnd or of a fleet where kilnd answers."""

import json
import subprocess
import sys

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
