"""Faults of Kiln's never reach a program that did not ask for strict mode: a
kilnd killed (SIGKILL) at each step of a compile, and a kilnd answering each
status code, end with the program exiting 0, stock Triton's artifacts and one
warning; under KILN_STRICT=1 the same faults raise KilnUnavailable naming the
cause. Real kilnd processes and the real triton package; the kilnd answering
a status code is a stand-in gRPC server, since what is tested is the client."""

import signal
import subprocess
import sys
from concurrent import futures

import grpc
import pytest
from kiln.service import api as _api

import hermetic
from conftest import PROBE, Kilnd, probe_json, tcp_kilnd
from test_launcher import libcuda_dir  # noqa: F401  (fixture)

# kilnd takes outside bytes here: the asan lane runs these against its ASan+UBSan build.
pytestmark = pytest.mark.outside_bytes

FALLBACK_WARNING = "compiling with stock Triton instead"


@pytest.fixture
def env(tmp_path):
    return dict(hermetic.stock_env(), TRITON_CACHE_DIR=str(tmp_path / "triton-cache"),
                KILN_FILES_DIR=str(tmp_path / "kiln-files"))


@pytest.fixture(scope="module")
def stock_first(tmp_path_factory):
    """Stock Triton's artifacts of the probe's first kernel (sm90)."""
    env = dict(hermetic.stock_env(), TRITON_CACHE_DIR=str(tmp_path_factory.mktemp("stock")))
    return probe_json(_probe(env, "first"))["kernels"]


def _probe(env, *args):
    return subprocess.run([sys.executable, str(PROBE), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=600)


def _assert_one_warning(result):
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stderr.count(FALLBACK_WARNING) == 1, result.stderr[-4000:]


def _assert_stock_with_one_warning(result, stock_kernels):
    _assert_one_warning(result)
    kernels = probe_json(result)["kernels"]
    assert {name: kernel["asm"] for name, kernel in kernels.items()} == \
        {name: kernel["asm"] for name, kernel in stock_kernels.items()}


def _probe_as_kilnd_dies(directory, env, at, *probe_args):
    """The probe against a kilnd of its own that dies (SIGKILL) at `at` ("Put",
    "Compile@0.3": client_probe.py --kill-kilnd-at)."""
    kilnd = Kilnd(directory, f"--toolchain={sys.executable}")
    try:
        result = _probe(dict(env, KILN="1", KILN_ENDPOINT=f"unix:{kilnd.socket}"), *probe_args,
                        "--kill-kilnd-at", at, kilnd.process.pid)
    finally:
        kilnd.stop()
    assert kilnd.process.returncode == -signal.SIGKILL, "the fault was not injected"
    return result


# Where in a compile kilnd dies: the method whose first call kills it, and when.
KILL_POINTS = {
    "before the claim": "Lookup,LookupOrClaim",
    "during the compile": "Compile@0.3",
}


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_kilnd_killed_during_a_compile_leaves_stock_triton_and_one_warning(tmp_path, env, stock_first, point):
    _assert_stock_with_one_warning(_probe_as_kilnd_dies(tmp_path / "kilnd", env, KILL_POINTS[point], "first"),
                                   stock_first)
    strict = _probe_as_kilnd_dies(tmp_path / "strict", dict(env, KILN_STRICT="1", TRITON_CACHE_DIR=str(tmp_path / "s")),
                                  KILL_POINTS[point], "first")
    assert strict.returncode != 0 and "KilnUnavailable: kilnd became unreachable" in strict.stderr, \
        strict.stderr[-3000:]


def test_a_kilnd_killed_before_a_put_leaves_the_file_stored_by_stock(tmp_path, env):
    result = _probe_as_kilnd_dies(tmp_path / "kilnd", env, "Put", "put-file")
    _assert_one_warning(result)
    stored = probe_json(result)
    assert stored["content"] == '{"timings": [1.5, 2.5]}'
    assert stored["path"].startswith(env["TRITON_CACHE_DIR"])  # stock's file cache holds it


def test_a_kilnd_killed_during_a_launcher_build_leaves_the_machines_compiler_to_build_it(
        tmp_path, env, libcuda_dir):  # noqa: F811
    result = _probe_as_kilnd_dies(tmp_path / "kilnd", dict(env, LD_LIBRARY_PATH=str(libcuda_dir)), "BuildLauncher",
                                  "launcher", libcuda_dir)
    _assert_one_warning(result)
    assert probe_json(result)["launch"] is True


def test_a_kilnd_without_the_clients_triton_leaves_stock_triton_and_one_warning(tmp_path, env, stock_first):
    """A remote caller's interpreter is never registered: a kilnd with no
    toolchain answers its Compile FAILED_PRECONDITION (a machine service whose
    config still names the Triton that ComfyUI replaced)."""
    kilnd = tcp_kilnd(tmp_path / "kilnd")
    try:
        result = _probe(dict(env, KILN="1", KILN_ENDPOINT=kilnd.tcp_address()), "first")
    finally:
        kilnd.stop()
    assert "FAILED_PRECONDITION" in result.stderr, result.stderr[-3000:]
    _assert_stock_with_one_warning(result, stock_first)


@pytest.fixture(scope="module")
def answering(tmp_path_factory):
    """A stand-in kilnd that answers every call with the status code it is set to."""
    socket = tmp_path_factory.mktemp("stand-in") / "kilnd.sock"
    answer = {"code": grpc.StatusCode.INTERNAL}

    def abort(request, context):
        context.abort(answer["code"], f"injected {answer['code'].name}")

    handlers = {method: grpc.unary_unary_rpc_method_handler(abort) for method in _api._METHODS}
    handlers.update({method: grpc.unary_stream_rpc_method_handler(abort) for method in _api._STREAMING_METHODS})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("kiln.v1.Kiln", handlers)])
    server.add_insecure_port(f"unix:{socket}")
    server.start()
    yield socket, answer
    server.stop(None)


@pytest.mark.parametrize("code", [code for code in grpc.StatusCode if code != grpc.StatusCode.OK],
                         ids=lambda code: code.name)
def test_any_status_kilnd_answers_leaves_stock_triton_and_one_warning(answering, env, stock_first, code):
    socket, answer = answering
    answer["code"] = code
    result = _probe(dict(env, KILN="1", KILN_ENDPOINT=f"unix:{socket}"), "first")
    _assert_stock_with_one_warning(result, stock_first)
    assert f"injected {code.name}" in result.stderr
    strict = _probe(dict(env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{socket}"), "first")
    assert strict.returncode != 0 and "KilnUnavailable" in strict.stderr and f"injected {code.name}" in strict.stderr
