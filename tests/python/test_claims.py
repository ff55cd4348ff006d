"""Claims through a real kilnd: N clients that miss one key run its compile
once, and nobody ever waits on a claimant that failed, went away or died."""

import signal
import subprocess
import sys
import threading
import time
import uuid

import grpc
from triton.backends.compiler import GPUTarget

import kernel_suite
import triton_frontend
from kiln.service import api as _api
from pipeline_client import blobs_by_name, compile_request

TARGET = GPUTarget("cuda", 80, 32)


def _fresh_key():
    return uuid.uuid4().hex  # a key nobody holds, for tests that compile nothing


def _claim(kilnd, key, claimant=""):
    """Opens a LookupOrClaim call; returns the call and its one response."""
    call = kilnd.stub.LookupOrClaim(_api.LookupRequest(namespace="triton", key=key, claimant=claimant))
    return call, next(call)


class Waiter:
    """A LookupOrClaim (or unary Lookup) in a thread, timed from when it is released."""

    def __init__(self, kilnd, key, unary=False):
        self.response = None
        self.answered_at = None
        if unary:
            request = _api.LookupRequest(namespace="triton", key=key, wait_for_compile=True)
            ask = lambda: kilnd.stub.Lookup(request, timeout=120)  # noqa: E731
        else:
            ask = lambda: next(kilnd.stub.LookupOrClaim(  # noqa: E731
                _api.LookupRequest(namespace="triton", key=key, claimant=uuid.uuid4().hex), timeout=120))
        self.thread = threading.Thread(target=lambda: self._run(ask))
        self.thread.start()

    def _run(self, ask):
        self.response = ask()
        self.answered_at = time.monotonic()

    def join(self):
        self.thread.join(120)
        assert not self.thread.is_alive(), "the waiter was never answered"
        return self.response


def _wait_until_waiting(kilnd, count, before):
    deadline = time.time() + 30
    while kilnd.stats().lookups_waited - before < count and time.time() < deadline:
        time.sleep(0.01)
    assert kilnd.stats().lookups_waited - before >= count


def test_clients_missing_the_same_key_wait_for_the_first_ones_compile(kilnd):
    case = kernel_suite.Case("claimed", kernel_suite.softmax_kernel, kernel_suite.SUITE[6].signature,
                             {"BLOCK": 512})
    frontend = triton_frontend.run_frontend(case, TARGET)
    call, first = _claim(kilnd, frontend.hash)
    assert not first.found and first.claimed
    before = kilnd.stats().lookups_waited
    waiters = [Waiter(kilnd, frontend.hash) for _ in range(3)] + [Waiter(kilnd, frontend.hash, unary=True)]
    _wait_until_waiting(kilnd, 4, before)
    assert all(waiter.thread.is_alive() for waiter in waiters), "waiters must wait for the claimant"
    compiled = kilnd.stub.Compile(compile_request(frontend))
    for waiter in waiters:
        response = waiter.join()
        assert response.found and not response.claimed
        assert blobs_by_name(response.entry) == blobs_by_name(compiled.entry)
    # kilnd ended the claimant's call itself once the result was stored.
    assert list(call) == []


def test_waiters_are_released_to_compile_themselves_when_the_claimants_compile_fails(kilnd):
    case = kernel_suite.Case("claim_fails", kernel_suite.add_kernel, kernel_suite.SUITE[0].signature,
                             {"BLOCK": 64}, {"ptx_options": "--no-such-ptxas-flag"})
    frontend = triton_frontend.run_frontend(case, TARGET)
    call, first = _claim(kilnd, frontend.hash)
    assert first.claimed
    before = kilnd.stats().lookups_waited
    waiter = Waiter(kilnd, frontend.hash)
    _wait_until_waiting(kilnd, 1, before)
    assert kilnd.stub.Compile(compile_request(frontend)).error.kind == _api.CompileError.KIND_PTXAS_ERROR
    response = waiter.join()
    assert not response.found and not response.claimed
    call.cancel()


def test_a_claimant_that_ends_its_call_releases_its_waiters_at_once(kilnd):
    # What the Python client does when Triton's frontend fails.
    key = _fresh_key()
    call, first = _claim(kilnd, key)
    assert first.claimed
    before = kilnd.stats().lookups_waited
    waiters = [Waiter(kilnd, key), Waiter(kilnd, key, unary=True)]
    _wait_until_waiting(kilnd, 2, before)
    ended_at = time.monotonic()
    call.cancel()
    for waiter in waiters:
        response = waiter.join()
        assert not response.found and not response.claimed  # compile yourself
        assert waiter.answered_at - ended_at < 1.0
    # The key is free again: the next client claims it.
    again, response = _claim(kilnd, key)
    assert response.claimed
    again.cancel()


CLAIM_AND_HANG = """
import sys, time
import grpc
from kiln.service import api as _api
channel = grpc.insecure_channel(sys.argv[1])
call = _api.KilnStub(channel).LookupOrClaim(_api.LookupRequest(namespace="triton", key=sys.argv[2]))
print("claimed" if next(call).claimed else "not claimed", flush=True)
time.sleep(600)
"""


def test_a_claimant_killed_with_sigkill_releases_its_waiters_at_once(kilnd):
    key = _fresh_key()
    claimant = subprocess.Popen([sys.executable, "-c", CLAIM_AND_HANG, f"unix:{kilnd.socket}", key],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert claimant.stdout.readline().strip() == "claimed"
        before = kilnd.stats().lookups_waited
        waiter = Waiter(kilnd, key)
        _wait_until_waiting(kilnd, 1, before)
        killed_at = time.monotonic()
        claimant.send_signal(signal.SIGKILL)
        response = waiter.join()
    finally:
        claimant.kill()
        claimant.wait()
    assert not response.found and not response.claimed
    assert waiter.answered_at - killed_at < 1.0, f"released after {waiter.answered_at - killed_at:.3f} s"


def test_a_process_asking_again_for_a_key_it_holds_takes_its_claim_over(kilnd):
    key, me = _fresh_key(), uuid.uuid4().hex
    first_call, first = _claim(kilnd, key, claimant=me)
    assert first.claimed
    second_call, second = _claim(kilnd, key, claimant=me)
    assert second.claimed, "a process must never wait on its own claim"
    assert list(first_call) == []  # the first call ended: its claim moved on
    # Another process still waits on the claim, now held by the second call.
    before = kilnd.stats().lookups_waited
    waiter = Waiter(kilnd, key)
    _wait_until_waiting(kilnd, 1, before)
    second_call.cancel()
    assert not waiter.join().claimed


def test_a_unary_lookup_never_claims(kilnd):
    # Nothing would end a claim held by a unary call whose caller went away.
    key = _fresh_key()
    response = kilnd.stub.Lookup(_api.LookupRequest(namespace="triton", key=key, wait_for_compile=True),
                                 timeout=10)
    assert not response.found and not response.claimed
    call, first = _claim(kilnd, key)
    assert first.claimed
    call.cancel()


def test_a_claim_on_a_bad_key_is_refused(kilnd):
    call = kilnd.stub.LookupOrClaim(_api.LookupRequest(namespace="triton", key="bad key\n"))
    try:
        next(call)
        raise AssertionError("a bad key must be refused")
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
