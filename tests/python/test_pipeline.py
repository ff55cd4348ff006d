"""The compile pipeline through a real kilnd with the real triton package, on a
machine without a GPU: results must equal stock triton.compile byte for byte."""

import fcntl
import json
import os
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import grpc
import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

import kernel_suite
import triton_frontend
from conftest import REPO, Kilnd
from kiln.service import api as kiln_pb2
from pipeline_client import blobs_by_name, compile_request, only_worker_held

TARGETS = [GPUTarget("cuda", 80, 32), GPUTarget("cuda", 90, 32)]
# This is the path of a TTIR file given to kilnd (the CLI's): like Triton's own
# IRSource, it starts from text, which does not keep the names of loop-carried
# values, so its TTIR differs from a compile from Python in those names only.
# The Python client makes TTIR to LLIR in-process and equals stock in all of
# them (test_client.py).
IDENTICAL_STAGES = ("ttgir", "llir", "ptx", "cubin")


@pytest.fixture(scope="module")
def kilnd(tmp_path_factory):
    """A kilnd of this module's own: its compiles store the suite's kernels,
    TTIR without loop names, under their Triton keys, which the session's
    kilnd would then serve to the modules that compare with stock."""
    server = Kilnd(tmp_path_factory.mktemp("pipeline-kilnd"), f"--toolchain={sys.executable}", "--compile-workers=2")
    yield server
    assert server.stop() == 0, (server.root / "kilnd.out").read_text()


def stock_compile(case, target, cache_dir, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache_dir))
    kernel = triton.compile(ASTSource(case.fn, case.signature, case.constexprs), target=target,
                            options=case.options)
    metadata_path = next(path for name, path in kernel.metadata_group.items()
                         if name.endswith(".json") and not name.startswith("__grp__"))
    return kernel, json.loads(Path(metadata_path).read_text())


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t.arch}")
@pytest.mark.parametrize("case", kernel_suite.SUITE, ids=lambda c: c.name)
def test_artifacts_equal_stock_triton(kilnd, case, target, tmp_path, monkeypatch):
    frontend = triton_frontend.run_frontend(case, target)
    response = kilnd.stub.Compile(compile_request(frontend))
    assert response.WhichOneof("result") == "entry", response.error
    blobs = blobs_by_name(response.entry)
    stock, stock_metadata = stock_compile(case, target, tmp_path, monkeypatch)
    for stage in IDENTICAL_STAGES:
        expected = stock.asm[stage]
        expected = expected if isinstance(expected, bytes) else expected.encode()
        assert blobs[f"{frontend.name}.{stage}"] == expected, stage
    assert json.loads(blobs[f"{frontend.name}.json"]) == stock_metadata
    assert "Used" in response.ptxas_log or response.cache_hit  # ptxas -v: registers used


def test_second_request_is_a_cache_hit_and_lookup_by_triton_key_works(kilnd):
    frontend = triton_frontend.run_frontend(kernel_suite.SUITE[0], TARGETS[1])
    first = kilnd.stub.Compile(compile_request(frontend))
    again = kilnd.stub.Compile(compile_request(frontend))
    assert again.cache_hit
    assert blobs_by_name(again.entry) == blobs_by_name(first.entry)
    # The client's own Triton key finds the same artifacts without compiling.
    found = kilnd.stub.Lookup(kiln_pb2.LookupRequest(namespace="triton", key=frontend.hash))
    assert found.found
    assert blobs_by_name(found.entry) == blobs_by_name(first.entry)


def test_eight_concurrent_identical_requests_compile_once(kilnd):
    case = kernel_suite.Case("concurrent", kernel_suite.matmul_kernel, kernel_suite.SUITE[9].signature,
                             {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 64}, {"num_stages": 3})
    frontend = triton_frontend.run_frontend(case, TARGETS[1])
    request = compile_request(frontend)
    before = kilnd.stats()
    responses = [None] * 8
    barrier = threading.Barrier(8)

    def ask(index):
        barrier.wait()
        responses[index] = kilnd.stub.Compile(request)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = kilnd.stats()
    assert after.compiles - before.compiles == 1
    shared = (after.single_flight_joins - before.single_flight_joins) + \
             (after.compile_cache_hits - before.compile_cache_hits)
    assert shared == 7
    cubins = {blobs_by_name(r.entry)[f"{frontend.name}.cubin"] for r in responses}
    assert len(cubins) == 1 and cubins != {b""}


def _pending_stdin_bytes(pid):
    try:
        with open(f"/proc/{pid}/fd/0", "rb") as pipe:
            return struct.unpack("i", fcntl.ioctl(pipe, termios.FIONREAD, b"\0" * 4))[0]
    except OSError:
        return 0


def test_worker_killed_mid_job_fails_that_request_and_the_next_succeeds(kilnd):
    workers = kilnd.worker_pids()
    assert workers, "kilnd should keep idle workers from earlier compiles"
    # Stopped workers take the job into their input pipe but cannot finish it:
    # the job is deterministically in flight when they are killed.
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    case = kernel_suite.Case("killed", kernel_suite.add_kernel, kernel_suite.SUITE[0].signature,
                             {"BLOCK": 128})
    frontend = triton_frontend.run_frontend(case, TARGETS[1])
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=kilnd.stub.Compile(compile_request(frontend))))
    thread.start()
    deadline = time.time() + 30
    holding = []
    while not holding and time.time() < deadline:
        holding = [pid for pid in workers if _pending_stdin_bytes(pid)]
        time.sleep(0.01)
    # Only the worker holding the job dies; the others resume.
    for pid in workers:
        os.kill(pid, signal.SIGKILL if pid in holding else signal.SIGCONT)
    thread.join(60)
    assert holding, f"the job never reached a stopped worker {workers}; result: {result}"
    response = result["r"]
    assert response.WhichOneof("result") == "error", response
    assert response.error.kind == kiln_pb2.CompileError.KIND_WORKER_CRASHED
    assert "SIGKILL" in response.error.message
    retry = kilnd.stub.Compile(compile_request(frontend))
    assert retry.WhichOneof("result") == "entry", retry.error
    assert kilnd.stats().workers_lost >= 1


def test_ttir_that_does_not_parse_is_a_compilation_error(kilnd):
    frontend = triton_frontend.run_frontend(kernel_suite.SUITE[0], TARGETS[1])
    response = kilnd.stub.Compile(compile_request(frontend, ir="module { this is not mlir }"))
    assert response.error.kind == kiln_pb2.CompileError.KIND_COMPILATION_ERROR
    assert "parse" in response.error.message
    assert kilnd.stub.Compile(compile_request(frontend)).WhichOneof("result") == "entry"


def test_ptxas_failure_is_a_ptxas_error(kilnd):
    case = kernel_suite.Case("ptxas_fails", kernel_suite.add_kernel, kernel_suite.SUITE[0].signature,
                             {"BLOCK": 256}, {"ptx_options": "--no-such-ptxas-flag"})
    frontend = triton_frontend.run_frontend(case, TARGETS[1])
    response = kilnd.stub.Compile(compile_request(frontend))
    assert response.error.kind == kiln_pb2.CompileError.KIND_PTXAS_ERROR
    assert "ptxas" in response.error.message
    assert kilnd.stub.Compile(compile_request(triton_frontend.run_frontend(kernel_suite.SUITE[1], TARGETS[0]))).entry.blobs


@pytest.mark.parametrize("backend,arch", [("tpu", "90"), ("cuda", "hopper"), ("cuda", "")])
def test_unknown_target_is_invalid_argument(kilnd, backend, arch):
    frontend = triton_frontend.run_frontend(kernel_suite.SUITE[0], TARGETS[1])
    request = compile_request(frontend)
    request.target.backend, request.target.arch = backend, arch
    with pytest.raises(grpc.RpcError) as error:
        kilnd.stub.Compile(request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "target" in error.value.details()


@pytest.mark.parametrize("method,request_type,streaming", [
    ("Put", "PutRequest", False), ("PutMany", "PutManyRequest", False), ("GetStats", "GetStatsRequest", False),
    ("LookupOrClaim", "LookupRequest", True)])
def test_request_that_does_not_parse_is_invalid_argument_naming_the_method(
        kilnd, method, request_type, streaming):
    # Bytes no protobuf parser accepts (a tag whose varint never ends), as a
    # client of another API could send; gRPC 1.51 alone answers UNIMPLEMENTED.
    path, garbage = f"/kiln.v1.Kiln/{method}", b"\xff\xff\xff"
    with pytest.raises(grpc.RpcError) as error:
        if streaming:
            list(kilnd.channel.unary_stream(path)(garbage, timeout=30))
        else:
            kilnd.channel.unary_unary(path)(garbage, timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
    assert f"kiln.v1.Kiln/{method} does not parse as a kiln.v1.{request_type}" in error.value.details()
    assert kilnd.stats().data_dir, "kilnd stopped answering after the garbage"


def test_unknown_method_is_still_unimplemented(kilnd):
    with pytest.raises(grpc.RpcError) as error:
        kilnd.channel.unary_unary("/kiln.v1.Kiln/NoSuchMethod")(b"")
    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_unknown_toolchain_lists_the_registered_ones(kilnd):
    frontend = triton_frontend.run_frontend(kernel_suite.SUITE[0], TARGETS[1])
    with pytest.raises(grpc.RpcError) as error:
        kilnd.stub.Compile(compile_request(frontend, triton_key="0.0.0-unknown"))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"triton {triton.__version__} at {os.path.normpath(sys.executable)}" in error.value.details()
    toolchains = kilnd.stub.ListToolchains(kiln_pb2.ListToolchainsRequest()).toolchains
    assert triton.__version__ in [t.triton_version for t in toolchains]


def test_local_client_registers_its_own_interpreter(fresh_kilnd):
    server = fresh_kilnd()
    frontend = triton_frontend.run_frontend(kernel_suite.SUITE[0], TARGETS[0])
    response = server.stub.Compile(compile_request(frontend, local_python_executable=sys.executable))
    assert response.WhichOneof("result") == "entry", response.error


def test_remote_client_interpreter_path_is_never_run(fresh_kilnd, tmp_path):
    marker = tmp_path / "ran"
    fake_python = tmp_path / "python"
    fake_python.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake_python.chmod(0o755)
    server = fresh_kilnd("--tcp-listen=127.0.0.1:0")
    remote = kiln_pb2.KilnStub(grpc.insecure_channel(server.tcp_address()))
    frontend = triton_frontend.run_frontend(kernel_suite.SUITE[0], TARGETS[0])
    with pytest.raises(grpc.RpcError) as error:
        remote.Compile(compile_request(frontend, local_python_executable=str(fake_python)))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert not marker.exists()


_PTXAS_START_PROGRAM = """
import errno, json, sys
sys.path.insert(0, sys.argv[1])
import kiln_worker

failures = [OSError(errno.EAGAIN, "fork failed")] * int(sys.argv[2]) + [OSError(errno.ENOENT, "no ptxas")] * int(sys.argv[3])
starts = []

def make_cubin(module, metadata):  # Triton's make_cubin, as far as starting ptxas goes
    starts.append(module)
    if failures:
        raise failures.pop(0)
    return b"cubin"

warnings = []
try:
    result = repr(kiln_worker._run_ptxas_stage(make_cubin, "ptx", {}, warnings)[0])
except OSError as error:
    result = "raised %s" % error
with open(sys.argv[4], "w") as out:
    json.dump({"result": result, "starts": len(starts), "warnings": warnings}, out)
"""


@pytest.mark.parametrize("passing_failures, lasting_failures, result, starts, warned", [
    (1, 0, "b'cubin'", 2, True),   # started again once, and said
    (2, 0, "raised [Errno 11] fork failed", 2, True),  # only once
    (0, 1, "raised [Errno 2] no ptxas", 1, False),  # a failure that would only fail again
])
def test_a_ptxas_that_never_started_is_started_again_once_and_said(
        tmp_path, passing_failures, lasting_failures, result, starts, warned):
    # Wine's CreateProcess fails now and then with ERROR_INTERNAL_ERROR (1359)
    # on a busy machine (failing CI runs' compiles of ptxas.exe); fork's EAGAIN
    # is POSIX's like of it, and what this machine can raise.
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, "-c", _PTXAS_START_PROGRAM, str(REPO / "compiler" / "worker"),
                    str(passing_failures), str(lasting_failures), str(out)], check=True)
    ran = json.loads(out.read_text())
    assert (ran["result"], ran["starts"]) == (result, starts)
    assert bool(ran["warnings"]) == warned
    if warned:
        assert ran["warnings"] == ["ptxas did not start ([Errno 11] fork failed); started it again"]


def _ptxas_wrapper(path, marker):
    """A ptxas that notes each run in `marker` and runs Triton's own."""
    from triton import knobs

    path.write_text(f'#!/bin/sh\necho "$@" >> {marker}\nexec {knobs.nvidia.ptxas.path} "$@"\n')
    path.chmod(0o755)
    return path


def test_a_clients_ptxas_runs_for_its_own_user_only(fresh_kilnd, tmp_path):
    # Its version is in the client's key: the worker runs the ptxas the client's
    # Triton runs (TRITON_PTXAS_PATH, as inductor sets it to torch's).
    marker = tmp_path / "ran"
    ptxas = _ptxas_wrapper(tmp_path / "ptxas", marker)
    server = fresh_kilnd(f"--toolchain={sys.executable}", "--tcp-listen=127.0.0.1:0")
    frontend = triton_frontend.run_frontend(kernel_suite.SUITE[0], TARGETS[0])
    request = compile_request(frontend)
    request.tool_paths["TRITON_PTXAS_PATH"] = str(ptxas)
    response = server.stub.Compile(request)
    assert response.WhichOneof("result") == "entry", response.error
    assert marker.exists() and "sm_80" in marker.read_text()

    # A caller on TCP is not the service's user: a ptxas outside the
    # toolchain's environment is never run for it.
    marker.unlink()
    remote = kiln_pb2.KilnStub(grpc.insecure_channel(server.tcp_address()))
    request = compile_request(triton_frontend.run_frontend(kernel_suite.SUITE[1], TARGETS[0]))
    request.tool_paths["TRITON_PTXAS_PATH"] = str(ptxas)
    with pytest.raises(grpc.RpcError) as error:
        remote.Compile(request)
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "TRITON_PTXAS_PATH" in error.value.details() and "unset" in error.value.details()
    assert not marker.exists()

    # No other variable travels this way.
    request = compile_request(frontend)
    request.tool_paths["LD_PRELOAD"] = str(ptxas)
    with pytest.raises(grpc.RpcError) as error:
        server.stub.Compile(request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    # Nor among the cache-invalidating variables, which the worker sets for
    # the job: only this Triton's are taken there.
    for name in ("TRITON_PTXAS_PATH", "LD_PRELOAD"):
        request = compile_request(triton_frontend.run_frontend(kernel_suite.SUITE[2], TARGETS[0]))
        request.env[name] = str(ptxas)
        with pytest.raises(grpc.RpcError) as error:
            remote.Compile(request)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"env names {name}, which is not one of this Triton's cache-invalidating variables" \
            in error.value.details()
        assert not marker.exists()


def test_job_over_the_timeout_is_killed_and_reported(fresh_kilnd):
    server = fresh_kilnd(f"--toolchain={sys.executable}", "--compile-workers=1", "--compile-timeout-seconds=2")
    (worker,) = server.worker_pids()  # the one registration started
    os.kill(worker, signal.SIGSTOP)  # it takes the job and never answers
    frontend = triton_frontend.run_frontend(kernel_suite.SUITE[2], TARGETS[0])
    response = server.stub.Compile(compile_request(frontend))
    assert response.error.kind == kiln_pb2.CompileError.KIND_TIMEOUT
    assert "timeout" in response.error.message
    retry = server.stub.Compile(compile_request(frontend))
    assert retry.WhichOneof("result") == "entry", retry.error
    assert server.stats().workers_lost == 1


def test_a_compile_that_will_not_wait_for_busy_workers_is_answered_at_once_and_starts_none(fresh_kilnd):
    server = fresh_kilnd(f"--toolchain={sys.executable}", "--compile-workers=2")
    frontends = [triton_frontend.run_frontend(case, TARGETS[0]) for case in kernel_suite.SUITE[:2]]
    with only_worker_held(server, frontends[0]):  # the one the registration started
        response = server.stub.Compile(compile_request(frontends[1], no_wait_for_busy_workers=True), timeout=30)
        assert response.no_worker_ready and response.WhichOneof("result") is None, response
        assert server.stats().workers_started == 1  # none was started for it
    # The worker idle again, the same request compiles there.
    response = server.stub.Compile(compile_request(frontends[1], no_wait_for_busy_workers=True), timeout=60)
    assert response.WhichOneof("result") == "entry" and not response.no_worker_ready, response.error
    assert server.stats().workers_started == 1


def test_a_burst_of_one_process_does_not_hold_back_anothers_compile(fresh_kilnd):
    # One worker; process A asks for six compiles at once, then process B for
    # one: the worker's next job after the one it is on is B's, where B would
    # otherwise have waited behind most of A's burst.
    server = fresh_kilnd(f"--toolchain={sys.executable}", "--compile-workers=1")
    frontends = [triton_frontend.run_frontend(case, TARGETS[0]) for case in kernel_suite.SUITE[:7]]
    finished, lock = [], threading.Lock()

    def compile_for(requester, frontend):
        response = server.stub.Compile(compile_request(frontend, requester=requester))
        assert response.WhichOneof("result") == "entry", response.error
        with lock:
            finished.append(requester)

    burst = [threading.Thread(target=compile_for, args=("host:1", f)) for f in frontends[:6]]
    for thread in burst:
        thread.start()
    deadline = time.time() + 30
    while server.stats().compiles < 6 and time.time() < deadline:  # all six asked
        time.sleep(0.05)
    single = threading.Thread(target=compile_for, args=("host:2", frontends[6]))
    single.start()
    for thread in [*burst, single]:
        thread.join()
    assert len(finished) == 7
    assert finished.index("host:2") <= 2, finished


def test_clients_reports_of_compiles_ahead_add_up_in_the_stats(fresh_kilnd):
    server = fresh_kilnd()
    for count, saved in ((4, 1.25), (6, 2.5)):
        server.stub.RecordHits(kiln_pb2.RecordHitsRequest(namespace="triton", compiled_ahead=count,
                                                         ahead_seconds_saved=saved))
    stats = server.stats()
    assert (stats.compiled_ahead, stats.ahead_seconds_saved) == (10, 3.75)
    for nonsense in (-1.0, float("nan"), 1e12):
        with pytest.raises(grpc.RpcError) as error:
            server.stub.RecordHits(kiln_pb2.RecordHitsRequest(namespace="triton", ahead_seconds_saved=nonsense))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert server.stats().ahead_seconds_saved == 3.75


def test_idle_workers_retire_but_the_last_one_stays_ready(fresh_kilnd):
    server = fresh_kilnd(f"--toolchain={sys.executable}", "--compile-workers=2", "--worker-idle-seconds=1")
    # Two compiles at once: registration's worker takes one, a second worker
    # starts for the other (which takes whichever worker is ready first).
    frontends = [triton_frontend.run_frontend(case, TARGETS[0]) for case in kernel_suite.SUITE[:2]]
    threads = [threading.Thread(target=server.stub.Compile, args=(compile_request(f),)) for f in frontends]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    server.wait_for_workers_started(2)
    assert server.stats().workers_started == 2
    deadline = time.time() + 30
    while server.stats().live_workers > 1 and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # three more turns of the retirer, each past the idle time
    stats = server.stats()
    assert stats.live_workers == 1 and len(server.worker_pids()) == 1, stats
    # A compile after the quiet spell finds that worker ready: no worker starts for it.
    response = server.stub.Compile(compile_request(triton_frontend.run_frontend(kernel_suite.SUITE[2], TARGETS[0])))
    assert response.WhichOneof("result") == "entry", response.error
    assert server.stats().workers_started == 2


def test_kilnd_stops_once_idle_for_exit_when_idle_seconds_but_never_while_a_call_is_in_progress(tmp_path):
    from conftest import Kilnd

    server = Kilnd(tmp_path / "kilnd", "--exit-when-idle-seconds=2")
    try:
        request = kiln_pb2.LookupRequest(namespace="triton", key="held-key", claimant="test")
        claim = server.stub.LookupOrClaim(request)
        assert next(claim).claimed  # the claim stays open, a call in progress, until cancelled
        time.sleep(5)
        assert server.process.poll() is None, "kilnd stopped while a claim was held"
        claim.cancel()
        server.process.wait(timeout=30)
        assert server.process.returncode == 0
        log = (server.root / "kilnd.out").read_text()
        assert "no call for 2 s (exit_when_idle_seconds)" in log and "kilnd stopped cleanly" in log, log
    finally:
        server.stop()
