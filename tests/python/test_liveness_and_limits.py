"""A kilnd that stops answering, or a peer in its place that breaks a rule or
a limit of HTTP/2 or gRPC, costs a program seconds and bounded memory: the
program gets stock Triton's kernels, exits 0 and sees one warning. A healthy
kilnd's compile that takes minutes still completes through it.

Real kilnd processes (stopped with SIGSTOP, or with their worker stopped) and
the real triton package; the peers that break rules are scripted
(hostile_peer.py), on the client's own transport (a Unix socket) and on
grpcio's (TLS over TCP, a farm's path)."""

import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

import hermetic
from conftest import PROBE, Kilnd, probe_json
from hostile_peer import BEHAVIOURS, NAMED, HostilePeer
from kiln.service import api, http2, local_grpc
from kiln.service.errors import RpcError, StatusCode
from test_remote_tls import new_ca, new_key_and_request, sign, tls_kilnd

# kilnd takes outside bytes here: the asan lane runs these against its ASan+UBSan build.
pytestmark = pytest.mark.outside_bytes

FALLBACK_WARNING = "compiling with stock Triton instead"
# What a program may cost beyond stock's against any of them (the bound).
SECONDS_ALLOWED = 15.0
RSS_ALLOWED_MIB = 300


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA the farm path's client trusts, and a certificate for 127.0.0.1 it signed."""
    directory = tmp_path_factory.mktemp("pki")
    new_ca(directory, "ca")
    new_key_and_request(directory, "peer", "/CN=localhost")
    sign(directory, "ca", "peer", "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    # A farm kilnd's (tls_kilnd: server.pem, client certificates of farm-ca) and its client's.
    new_ca(directory, "farm-ca")
    new_key_and_request(directory, "server", "/CN=localhost")
    sign(directory, "farm-ca", "server", "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    new_key_and_request(directory, "alpha", "/CN=alpha")
    sign(directory, "farm-ca", "alpha")
    return directory


def _farm_client_settings(pki, address):
    return {"KILN_ENDPOINT": f"grpcs://{address}", "KILN_CA_FILE": str(pki / "farm-ca.pem"),
            "KILN_CLIENT_CERT": str(pki / "alpha.pem"), "KILN_CLIENT_KEY": str(pki / "alpha.key")}


def _measured(argv, env, directory, timeout=600):
    """Runs `argv`: (exit status, stdout, stderr, seconds, peak RSS in MiB)."""
    out, err = directory / "out", directory / "err"
    started = time.monotonic()
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        process = subprocess.Popen(argv, stdout=stdout, stderr=stderr, env=env)
    killer = threading.Timer(timeout, process.kill)
    killer.start()
    try:
        _, status, usage = os.wait4(process.pid, 0)
    finally:
        killer.cancel()
    process.returncode = os.waitstatus_to_exitcode(status)
    return (process.returncode, out.read_text(), err.read_text(), time.monotonic() - started,
            usage.ru_maxrss / 1024)


def _probe_env(tmp_path, **settings):
    return dict(hermetic.stock_env(), TRITON_CACHE_DIR=str(tmp_path / "triton-cache"),
                KILN_FILES_DIR=str(tmp_path / "kiln-files"), **settings)


@pytest.fixture(scope="module")
def stock_first(tmp_path_factory):
    """Stock Triton's artifacts of the probe's first kernel (sm90), its time and peak RSS."""
    directory = tmp_path_factory.mktemp("stock")
    status, out, err, seconds, rss = _measured([sys.executable, str(PROBE), "first"], _probe_env(directory),
                                               directory)
    assert status == 0, err[-3000:]
    return {"kernels": probe_json(subprocess.CompletedProcess([], 0, out))["kernels"], "seconds": seconds,
            "rss": rss}


def _asm(kernels):
    return {name: kernel["asm"] for name, kernel in kernels.items()}


# --- the client's transport alone: what each broken rule costs a call ------------

# What the call's error names, on the client's own transport.
_LOCAL_ERRORS = {
    "silent-after-settings": "answered no PING",
    "ping-every-second": "answered no PING",
    "ping-flood": "a PING as its first frame, not its SETTINGS",
    "ping-flood-after-settings": "frames in a row that were no answer",
    "zero-window": "its flow-control window stayed shut",
    "bad-settings": "SETTINGS_MAX_FRAME_SIZE of 0",
    "bad-settings-window": "SETTINGS_INITIAL_WINDOW_SIZE of 2147483648",
    "bad-settings-push": "SETTINGS_ENABLE_PUSH of 2",
    "short-frame": "a WINDOW_UPDATE as its first frame, not its SETTINGS",
    "truncated-frame": "answered no PING",
    "endless-continuation": "a header block past the 65536 bytes",
    "huge-header-list": "a header list past 65536 bytes",
    "huge-message": "announced an answer of 2147483647 bytes",
}


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_a_peer_breaking_a_rule_ends_a_call_in_seconds_with_an_error_naming_it(tmp_path, behaviour):
    assert set(_LOCAL_ERRORS) == set(BEHAVIOURS)
    with HostilePeer(behaviour, unix_path=tmp_path / "peer.sock") as peer:
        channel = local_grpc.Channel(peer.target)
        handshake_started = time.monotonic()
        if behaviour in ("ping-flood", "bad-settings", "bad-settings-window", "bad-settings-push", "short-frame"):
            # A peer whose first frames break a rule: no kilnd to wait for, nor to start another beside.
            with pytest.raises(http2.Misbehaved, match=_LOCAL_ERRORS[behaviour]):
                channel.ready(2.0)
        else:
            assert channel.ready(2.0)
        assert time.monotonic() - handshake_started < 3
        tracemalloc.start()
        started = time.monotonic()
        try:
            with pytest.raises(RpcError) as failed:
                # No deadline of the caller's: the method's own (10 s) must not be what ends it.
                api.KilnStub(channel).Lookup(api.LookupRequest(namespace="triton", key="ab" * 32), timeout=60)
            seconds = time.monotonic() - started
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            channel.close()
    assert seconds < 9, f"{behaviour}: {seconds:.1f} s"
    assert peak < 16 << 20, f"{behaviour}: {peak >> 20} MiB"
    assert failed.value.code() in (StatusCode.UNAVAILABLE, StatusCode.RESOURCE_EXHAUSTED), failed.value
    assert _LOCAL_ERRORS[behaviour] in failed.value.details(), failed.value.details()


def test_a_large_request_that_a_healthy_kilnd_reads_slowly_goes_out_whole_and_is_answered(tmp_path):
    """16 MiB, read at about 3 MiB/s: the send takes seconds, but makes progress
    every moment, which is what holds it (a send is not bounded as a whole)."""
    with HostilePeer("slow-reader", unix_path=tmp_path / "peer.sock") as peer:
        channel = local_grpc.Channel(peer.target)
        assert channel.ready(2.0)
        started = time.monotonic()
        api.KilnStub(channel).Put(api.PutRequest(namespace="triton", key="cd" * 32,
                                                 blobs=[api.blob("large", b"x" * (16 << 20))]), timeout=60)
        seconds = time.monotonic() - started
        channel.close()
    assert seconds > 2.5, f"{seconds:.1f} s: the peer read the request faster than a send's tick"


def test_a_peer_that_answers_pings_but_not_the_call_is_ended_by_the_calls_deadline(tmp_path):
    with HostilePeer("zero-window", unix_path=tmp_path / "peer.sock") as peer:
        channel = local_grpc.Channel(peer.target)
        started = time.monotonic()
        with pytest.raises(RpcError) as late:
            # Sent before the peer's SETTINGS shut its window: it answers PINGs, never the call.
            api.KilnStub(channel).GetStats(api.GetStatsRequest(), timeout=3)
        channel.close()
    assert late.value.code() is StatusCode.DEADLINE_EXCEEDED, late.value
    assert 2.9 < time.monotonic() - started < 5


# --- programs: stock Triton's kernels, one warning, seconds and bounded memory ------

@pytest.mark.parametrize("path", ["local", "farm"])
@pytest.mark.parametrize("behaviour", NAMED)
def test_a_program_whose_kilnd_breaks_a_rule_gets_stock_kernels_in_seconds(tmp_path, pki, stock_first, path,
                                                                            behaviour):
    if path == "local":
        peer, settings = HostilePeer(behaviour, unix_path=tmp_path / "peer.sock"), {}
    else:
        peer = HostilePeer(behaviour, tls=(pki / "peer.pem", pki / "peer.key"))
        settings = {"KILN_CA_FILE": str(pki / "ca.pem")}
    with peer:
        status, out, err, seconds, rss = _measured(
            [sys.executable, str(PROBE), "first"],
            _probe_env(tmp_path, KILN="1", KILN_ENDPOINT=peer.target, **settings), tmp_path, timeout=120)
    assert status == 0, err[-3000:]
    assert err.count(FALLBACK_WARNING) == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert _asm(probe_json(subprocess.CompletedProcess([], 0, out))["kernels"]) == _asm(stock_first["kernels"])
    assert seconds < SECONDS_ALLOWED, f"{seconds:.1f} s (stock: {stock_first['seconds']:.1f} s)\n{err[-2000:]}"
    assert rss < RSS_ALLOWED_MIB, f"{rss:.0f} MiB (stock: {stock_first['rss']:.0f} MiB)"


# --- a real kilnd -------------------------------------------------------------------

def test_a_kilnd_stopped_in_the_middle_of_the_suite_leaves_the_rest_to_stock_within_seconds(tmp_path,
                                                                                             stock_suite):
    stock_started = time.monotonic()
    stock = subprocess.run([sys.executable, str(PROBE), "suite"], capture_output=True, text=True,
                           env=_probe_env(tmp_path / "stock"), timeout=600)
    stock_seconds = time.monotonic() - stock_started
    assert stock.returncode == 0, stock.stderr[-3000:]
    kilnd = Kilnd(tmp_path / "kilnd", f"--toolchain={sys.executable}", "--compile-workers=1")
    try:
        kilnd.wait_for_workers_started(1)
        started = time.monotonic()
        program = subprocess.Popen([sys.executable, str(PROBE), "suite"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True,
                                   env=_probe_env(tmp_path, KILN="1", KILN_ENDPOINT=f"unix:{kilnd.socket}"))
        while kilnd.stats().compiles < 3 and program.poll() is None:
            time.sleep(0.05)
        os.kill(kilnd.process.pid, signal.SIGSTOP)
        stopped_after = time.monotonic() - started
        try:
            out, err = program.communicate(timeout=stock_seconds + 120)
        finally:
            os.kill(kilnd.process.pid, signal.SIGCONT)
        seconds = time.monotonic() - started
    finally:
        kilnd.stop()
    assert program.returncode == 0, err[-3000:]
    assert stopped_after < seconds, "kilnd was stopped after the suite ended"
    assert err.count(FALLBACK_WARNING) == 1 and "kilnd became unreachable" in err, err[-3000:]
    assert _asm(probe_json(subprocess.CompletedProcess([], 0, out))["kernels"]) == _asm(stock_suite)
    assert seconds < stock_seconds + SECONDS_ALLOWED, f"{seconds:.1f} s, stock {stock_seconds:.1f} s"


def _first_kernel_with_the_worker_held(kilnd, seconds, env):
    """The probe's first kernel, compiled while `kilnd`'s one worker is stopped
    for `seconds` (the program's compile in its hands meanwhile)."""
    kilnd.wait_for_workers_started(1)
    (worker,) = kilnd.worker_pids()
    os.kill(worker, signal.SIGSTOP)
    held = threading.Timer(seconds, os.kill, (worker, signal.SIGCONT))
    held.start()
    try:
        return subprocess.run([sys.executable, str(PROBE), "first"], capture_output=True, text=True,
                              timeout=seconds + 300, env=env)
    finally:
        held.join()


def test_a_compile_that_takes_90_seconds_in_a_healthy_kilnd_completes_through_it(tmp_path, stock_first):
    """kilnd's one worker is stopped for 90 s with the program's compile in its
    hands: kilnd's gRPC answers the client's PINGs meanwhile, and the program
    gets kilnd's kernel, with no fallback."""
    kilnd = Kilnd(tmp_path / "kilnd", f"--toolchain={sys.executable}", "--compile-workers=1")
    try:
        program = _first_kernel_with_the_worker_held(kilnd, 90, _probe_env(
            tmp_path, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}"))
        assert program.returncode == 0, program.stderr[-3000:]
        (kernel,) = probe_json(program)["kernels"].values()
        stored = kilnd.stub.Lookup(api.LookupRequest(namespace="triton", key=kernel["metadata"]["hash"]))
        compiles = kilnd.stats().compiles
    finally:
        kilnd.stop()
    assert FALLBACK_WARNING not in program.stderr
    assert compiles == 1 and stored.found
    assert _asm(probe_json(program)["kernels"]) == _asm(stock_first["kernels"])


def _threads_stopped(pid, seconds=5):
    """Waits until every thread of `pid` is stopped (a thread in an
    uninterruptible wait stops only as it ends); their states, as /proc says."""
    deadline = time.monotonic() + seconds
    while True:
        states = {}
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                states[task.name] = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue  # ended meanwhile
        if all(state in "tT" for state in states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(0.01)


def test_a_farm_kilnd_stopped_ends_a_call_that_may_wait_minutes_within_seconds(tmp_path, pki, monkeypatch):
    """grpcio's keepalive, on a farm's path: a call with a compile's deadline
    whose kilnd stops answering ends in seconds, its retry's handshake included."""
    from kiln.service import connection, paths

    kilnd, address = tls_kilnd(pki, tmp_path / "farm")
    try:
        for name, value in _farm_client_settings(pki, address).items():
            monkeypatch.setenv(name, value)
        farm = connection.Connection(paths.Endpoint(f"grpcs://{address}"))
        farm.stub.GetStats(api.GetStatsRequest())  # connected, and served
        os.kill(kilnd.process.pid, signal.SIGSTOP)
        states = _threads_stopped(kilnd.process.pid)
        started = time.monotonic()
        try:
            with pytest.raises(RpcError) as stopped:
                answer = farm.stub.Lookup(api.LookupRequest(namespace="triton", key="ab" * 32), timeout=900)
                pytest.fail(f"a stopped kilnd answered in {time.monotonic() - started:.2f} s: {answer!r}; "
                            f"its threads' states before the call: {states}")
            seconds = time.monotonic() - started
        finally:
            os.kill(kilnd.process.pid, signal.SIGCONT)
        farm.close()
    finally:
        kilnd.stop()
    assert stopped.value.code() is StatusCode.UNAVAILABLE, stopped.value
    # A PING after 2 s of waiting, 3 s for its answer, 4 s for the retry's
    # handshake: 9-10 s (a PING timed by gRPC's default took 75 s).
    assert seconds < 13, f"{seconds:.1f} s: {stopped.value.details()}"


def test_a_farm_compile_that_takes_15_seconds_completes_through_kilnd_answering_the_pings(tmp_path, pki,
                                                                                         stock_first):
    """The farm's path pings a waiting call every 2 s; a farm kilnd allows it.
    A kilnd that allowed gRPC's default, one in 5 min, would end the connection
    at the third PING with GOAWAY "too_many_pings", which gRPC logs to the
    program's stderr (its retry then completes the compile)."""
    kilnd, address = tls_kilnd(pki, tmp_path / "farm", f"toolchain = {sys.executable}\ncompile_workers = 1\n")
    try:
        program = _first_kernel_with_the_worker_held(kilnd, 15, _probe_env(
            tmp_path, KILN="1", KILN_STRICT="1", **_farm_client_settings(pki, address)))
        compiles = kilnd.stats().compiles
    finally:
        kilnd.stop()
    assert program.returncode == 0, program.stderr[-3000:]
    assert FALLBACK_WARNING not in program.stderr
    assert "too_many_pings" not in program.stderr, program.stderr[-3000:]
    assert compiles == 1
    assert _asm(probe_json(program)["kernels"]) == _asm(stock_first["kernels"])
