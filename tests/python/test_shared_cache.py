"""A fleet of kilnds sharing compile results through Redis (redis_url): a real
redis-server (Debian's) on loopback, with a password, and real kilnd processes."""

import json
import signal
import shutil
import socket
import subprocess
import sys
import time

import pytest
from triton.backends.compiler import GPUTarget

import hermetic
import kernel_suite
import triton_frontend
from conftest import BUILD, PROBE, Kilnd, kilnd_refusing, probe_json, run_probe, tcp_kilnd
from pipeline_client import blobs_by_name, compile_request

# kilnd takes outside bytes here: the asan lane runs these against its ASan+UBSan build.
pytestmark = pytest.mark.outside_bytes

PASSWORD = "fleet-secret"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Redis:
    def __init__(self, directory, port):
        self.directory, self.port = directory, port
        self.process = None

    def start(self):
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--requirepass", PASSWORD,
             "--save", "", "--appendonly", "no", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while self.cli("PING").strip() != "PONG":
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)

    def stop(self):
        self.process.terminate()
        self.process.wait()

    def kill(self):
        """Gone at once, as a crash or an OOM kill would leave it: nothing saved."""
        self.process.kill()
        self.process.wait()

    def cli(self, *args):
        return subprocess.run(["redis-cli", "-p", str(self.port), "-a", PASSWORD, "--no-auth-warning", *args],
                              capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/install-deps installs it)")
    server = Redis(tmp_path_factory.mktemp("redis"), free_port())
    server.start()
    yield server
    server.stop()


def fleet_kilnd(directory, redis, prefix, *flags, secret_file=None):
    config = directory / "kilnd.conf"
    directory.mkdir(parents=True, exist_ok=True)
    config.write_text(f"redis_url = redis://:{PASSWORD}@127.0.0.1:{redis.port}\nredis_prefix = {prefix}\n"
                      + (f"redis_secret_file = {secret_file}\n" if secret_file else ""))
    return Kilnd(directory / "kilnd", f"--config={config}", f"--toolchain={sys.executable}", *flags)


def wait_for(condition, what, seconds=60):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_kilnd_with_an_empty_cache_serves_what_another_compiled_from_redis_without_compiling(
        redis, tmp_path, stock_suite):  # noqa: F811
    first = fleet_kilnd(tmp_path / "first", redis, "fleet1:")
    second = None
    try:
        base = hermetic.stock_env()
        client = dict(base, KILN="1", KILN_STRICT="1")
        run_probe(dict(client, KILN_ENDPOINT=f"unix:{first.socket}", TRITON_CACHE_DIR=str(tmp_path / "c1"),
                       KILN_FILES_DIR=str(tmp_path / "f1")), "suite")
        assert first.stats().compiles == 30
        wait_for(lambda: first.stats().shared_cache_stores >= 30, "the compiles never reached Redis")
        second = fleet_kilnd(tmp_path / "second", redis, "fleet1:")
        result = probe_json(run_probe(dict(client, KILN_ENDPOINT=f"unix:{second.socket}",
                                           TRITON_CACHE_DIR=str(tmp_path / "c2"), KILN_FILES_DIR=str(tmp_path / "f2")),
                                      "suite"))
        assert result["kernels"] == stock_suite
        stats = second.stats()
        assert stats.compiles == 0
        assert stats.shared_cache_hits >= 30 and stats.shared_cache_state == "up"
        # Each hit's cost is measured: what the fleet's cache adds to a compile it saves.
        assert stats.shared_cache_hit_latency.count == stats.shared_cache_hits
        assert 0 < stats.shared_cache_hit_latency.p50_ms <= stats.shared_cache_hit_latency.max_ms
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_three_kilnds_compiling_the_suite_at_once_compile_each_kernel_once_across_the_fleet(
        redis, tmp_path, stock_suite):  # noqa: F811
    fleet = [fleet_kilnd(tmp_path / f"kilnd{i}", redis, "fleet4:") for i in range(3)]
    try:
        base = hermetic.stock_env()
        clients = [subprocess.Popen(
            [sys.executable, str(PROBE), "suite"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{kilnd.socket}",
                     TRITON_CACHE_DIR=str(tmp_path / f"c{i}"), KILN_FILES_DIR=str(tmp_path / f"f{i}")))
            for i, kilnd in enumerate(fleet)]
        for client in clients:
            out, err = client.communicate(timeout=600)
            assert client.returncode == 0, err[-3000:]
            assert json.loads(out.splitlines()[-1])["kernels"] == stock_suite
        stats = [kilnd.stats() for kilnd in fleet]
        assert sum(s.compiles for s in stats) == 30, [s.compiles for s in stats]
        assert sum(s.shared_cache_compiles_awaited + s.shared_cache_hits for s in stats) >= 60
    finally:
        for kilnd in fleet:
            kilnd.stop()


def compile_one(kilnd, case_index=0, arch=90):
    frontend = triton_frontend.run_frontend(kernel_suite.SUITE[case_index], GPUTarget("cuda", arch, 32))
    response = kilnd.stub.Compile(compile_request(frontend), timeout=300)
    assert response.WhichOneof("result") == "entry", response.error
    return blobs_by_name(response.entry)


def made_in_redis(redis, directory, prefix, secret_file=None):
    """A kernel compiled by a kilnd of the fleet, once its entry is in Redis:
    (its blobs, its Redis entry key)."""
    maker = fleet_kilnd(directory, redis, prefix, secret_file=secret_file)
    try:
        made = compile_one(maker)
        wait_for(lambda: maker.stats().shared_cache_stores >= 1, "the compile never reached Redis")
    finally:
        maker.stop()
    [entry_key] = redis.cli("--scan", "--pattern", f"{prefix}e:*").split()
    return made, entry_key


def test_a_value_corrupted_in_redis_is_never_served(redis, tmp_path):
    made, _ = made_in_redis(redis, tmp_path / "maker", "fleet2:")
    blob_keys = redis.cli("--scan", "--pattern", "fleet2:b:*").split()
    assert blob_keys
    for key in blob_keys:
        redis.cli("SET", key, "not what the entry lists")
    reader = fleet_kilnd(tmp_path / "reader", redis, "fleet2:")
    try:
        got = compile_one(reader)
        assert got == made  # compiled again here, not taken from Redis
        stats = reader.stats()
        assert stats.compiles == 1 and stats.shared_cache_hits == 0 and stats.shared_cache_errors >= 1
        assert "poisoned or truncated" in (reader.root / "kilnd.out").read_text()
    finally:
        reader.stop()


def kiln_health(kilnd):
    return subprocess.run([str(BUILD / "client" / "cpp" / "kiln"), "--endpoint", f"unix:{kilnd.socket}",
                           "health"], capture_output=True, text=True)


def test_what_is_compiled_while_redis_is_down_reaches_it_once_it_is_back(redis, tmp_path):
    kilnd = fleet_kilnd(tmp_path / "kilnd", redis, "fleet3:")
    during_outage = [(1, 90), (2, 90), (3, 90)]
    try:
        redis.kill()
        made = [compile_one(kilnd, case, arch) for case, arch in during_outage]
        # A compile is answered before it is stored, and offered to Redis.
        wait_for(lambda: kilnd.stats().shared_cache_backlog == 3, "the outage's compiles never waited for Redis")
        stats = kilnd.stats()
        assert stats.compiles == 3 and stats.shared_cache_state.startswith("down since"), stats.shared_cache_state
        assert stats.shared_cache_dropped == 0
        # Requests are still served, so health passes, and says what is down.
        health = kiln_health(kilnd)
        assert health.returncode == 0 and "shared cache (Redis): down since" in health.stdout, health

        redis.start()  # empty: nothing of the outage's compiles was ever written
        back = time.monotonic()
        # No request is needed for kilnd to notice.
        wait_for(lambda: "shared cache (Redis): up" in kiln_health(kilnd).stdout, "health never said Redis is up",
                 seconds=10)
        print(f"health said Redis is up {time.monotonic() - back:.1f} s after it came back")
        wait_for(lambda: kilnd.stats().shared_cache_backlog == 0, "the backlog was never written")
        assert kilnd.stats().shared_cache_stores == 3
    finally:
        kilnd.stop()
        if redis.process.poll() is not None:
            redis.start()
    fresh = fleet_kilnd(tmp_path / "fresh", redis, "fleet3:")
    try:
        assert [compile_one(fresh, case, arch) for case, arch in during_outage] == made
        stats = fresh.stats()
        assert stats.compiles == 0 and stats.shared_cache_hits == 3
    finally:
        fresh.stop()


def test_a_hung_redis_costs_misses_no_more_than_a_fifth_more_than_no_redis(redis, tmp_path):
    """Redis stopped (SIGSTOP) answers nothing but its kernel still accepts
    connections: every call waits out its timeout. The first miss pays the
    lookup timeout; then no request asks Redis until the monitor finds it back."""
    kernels = [(case, arch) for case in range(1, 11) for arch in (80, 89, 90)]
    requests = [compile_request(triton_frontend.run_frontend(kernel_suite.SUITE[case], GPUTarget("cuda", arch, 32)))
                for case, arch in kernels]
    alone = Kilnd(tmp_path / "alone", f"--toolchain={sys.executable}")
    hung = fleet_kilnd(tmp_path / "hung", redis, "fleet10:")
    seconds = {alone: 0.0, hung: 0.0}
    try:
        for kilnd in seconds:  # the workers up, and the hung kilnd connected to Redis
            compile_one(kilnd, case_index=0)
        redis.process.send_signal(signal.SIGSTOP)
        for request in requests:  # by turns: the machine's load falls on both alike
            for kilnd in seconds:
                start = time.monotonic()
                response = kilnd.stub.Compile(request, timeout=300)
                seconds[kilnd] += time.monotonic() - start
                assert response.WhichOneof("result") == "entry", response.error
        stats = hung.stats()
        assert stats.compiles == 31 and stats.shared_cache_state.startswith("down since"), stats.shared_cache_state
        print(f"{len(requests)} misses: {seconds[alone]:.2f} s without Redis, {seconds[hung]:.2f} s with it hung")
        assert seconds[hung] <= 1.2 * seconds[alone], seconds
    finally:
        redis.process.send_signal(signal.SIGCONT)
        alone.stop()
        hung.stop()


def test_with_a_fleet_secret_an_entry_forged_in_redis_by_someone_without_it_is_never_served(redis, tmp_path):
    secret = tmp_path / "fleet.secret"
    secret.write_text("5d1f" * 16 + "\n")
    made, entry_key = made_in_redis(redis, tmp_path / "maker", "fleet9:", secret_file=secret)
    listing = redis.cli("GET", entry_key).rstrip("\n").split("\n")
    assert listing[-1].startswith("hmac-sha256\t")
    # Someone who can write to Redis but lacks the secret: the cubin's name now
    # lists the PTX's blob (each blob still matches its digest), signature kept.
    digests = dict(line.split("\t") for line in listing[:-1])
    cubin, ptx = (next(name for name in digests if name.endswith(ext)) for ext in (".cubin", ".ptx"))
    digests[cubin] = digests[ptx]
    forged = "".join(f"{name}\t{digest}\n" for name, digest in digests.items())
    for value in (forged + listing[-1] + "\n", forged):  # the old signature, and none
        redis.cli("SET", entry_key, value)
        reader = fleet_kilnd(tmp_path / f"reader{len(value)}", redis, "fleet9:", secret_file=secret)
        try:
            assert compile_one(reader) == made  # compiled itself: the forgery was not served
            stats = reader.stats()
            assert stats.compiles == 1 and stats.shared_cache_hits == 0 and stats.shared_cache_errors >= 1
        finally:
            reader.stop()
    # The genuine entry again (the last reader stored its own, signed): served to a kilnd of the fleet.
    wait_for(lambda: redis.cli("GET", entry_key).rstrip("\n").split("\n")[-1] == listing[-1],
             "the reader never stored its signed entry")
    served = fleet_kilnd(tmp_path / "served", redis, "fleet9:", secret_file=secret)
    try:
        assert compile_one(served) == made
        assert served.stats().compiles == 0 and served.stats().shared_cache_hits == 1
    finally:
        served.stop()

    secret.write_text("too short\n")
    printed = kilnd_refusing(tmp_path, f"redis_url = redis://127.0.0.1:{redis.port}\n"
                                          f"redis_secret_file = {secret}\n")
    assert "holds 9 bytes; a fleet's secret needs at least 32" in printed


def test_a_redis_url_that_does_not_parse_stops_kilnd_with_the_form_to_write(tmp_path):
    printed = kilnd_refusing(tmp_path, "redis_url = http://127.0.0.1:6379\n")
    assert "redis://[:PASSWORD@]HOST[:PORT][/DB]" in printed


def test_a_kilnd_waits_for_another_kilnds_claim_and_compiles_itself_once_the_claimants_lease_lapses(
        redis, tmp_path):
    import threading

    made, entry_key = made_in_redis(redis, tmp_path / "maker", "fleet5:")
    digest = entry_key[len("fleet5:e:"):]
    manifest = redis.cli("GET", entry_key)
    claim, channel = f"fleet5:c:{digest}", f"fleet5:d:{digest}"

    # A kilnd of the fleet is compiling it (its claim, as kilnd writes one): the
    # waiter takes its result as soon as it is announced.
    redis.cli("DEL", entry_key)
    redis.cli("SET", claim, "another-kilnd", "PX", "60000")
    waiter = fleet_kilnd(tmp_path / "waiter", redis, "fleet5:")
    try:
        answer = {}
        started = time.monotonic()
        thread = threading.Thread(target=lambda: answer.update(blobs=compile_one(waiter)))
        thread.start()
        wait_for(lambda: waiter.stats().shared_cache_misses + waiter.stats().shared_cache_hits >= 1,
                 "the waiter never looked in Redis")
        time.sleep(1.5)
        assert thread.is_alive()  # waiting on the claim
        redis.cli("SET", entry_key, manifest.rstrip("\n") + "\n")
        redis.cli("DEL", claim)
        redis.cli("PUBLISH", channel, "ended")
        thread.join(timeout=30)
        assert answer["blobs"] == made
        stats = waiter.stats()
        assert stats.compiles == 0 and stats.shared_cache_compiles_awaited == 1
        assert time.monotonic() - started < 20
    finally:
        waiter.stop()

    # A claimant that died: its lease lapses and the waiter compiles itself.
    # The claim is written once the kilnd is up, so its start-up (seconds on a
    # loaded CI machine) does not eat into the lease the test measures.
    redis.cli("DEL", entry_key)
    orphan = fleet_kilnd(tmp_path / "orphan", redis, "fleet5:")
    try:
        claimed = time.monotonic()
        redis.cli("SET", claim, "a-kilnd-that-died", "PX", "3000")
        assert compile_one(orphan) == made
        assert 2.5 < time.monotonic() - claimed < 30
        assert orphan.stats().compiles == 1
    finally:
        orphan.stop()


def test_a_client_listing_the_fleet_finishes_on_the_others_when_one_kilnd_is_killed(redis, tmp_path, stock_suite):  # noqa: F811
    import signal

    fleet, addresses = [], []
    try:
        for i in range(3):
            kilnd = tcp_kilnd(tmp_path / f"kilnd{i}", f"--toolchain={sys.executable}",
                              config=f"redis_url = redis://:{PASSWORD}@127.0.0.1:{redis.port}\nredis_prefix = fleet6:\n")
            fleet.append(kilnd)
            addresses.append(kilnd.tcp_address())
        base = hermetic.stock_env()
        client = subprocess.Popen(
            [sys.executable, str(PROBE), "suite"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=",".join(addresses),
                     TRITON_CACHE_DIR=str(tmp_path / "c"), KILN_FILES_DIR=str(tmp_path / "f")))
        # Kernels spread over the fleet by key. Mid-run, kill the kilnd that compiles most.
        wait_for(lambda: sum(kilnd.stats().compiles for kilnd in fleet) >= 2, "the fleet never compiled", 300)
        victim = max(fleet, key=lambda kilnd: kilnd.stats().compiles)
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait()
        out, err = client.communicate(timeout=600)
        assert client.returncode == 0, err[-3000:]
        assert json.loads(out.splitlines()[-1])["kernels"] == stock_suite
        assert sum(kilnd.stats().compiles for kilnd in fleet if kilnd is not victim) >= 1
    finally:
        for kilnd in fleet:
            kilnd.stop()


def test_clients_listing_the_fleet_send_each_kernel_to_one_kilnd_so_its_frontend_runs_once(tmp_path, stock_suite):  # noqa: F811
    fleet = []
    try:
        for i in range(2):
            fleet.append(tcp_kilnd(tmp_path / f"kilnd{i}", f"--toolchain={sys.executable}"))
        endpoint = ",".join(kilnd.tcp_address() for kilnd in fleet)
        base = hermetic.stock_env()
        clients = [subprocess.Popen(
            [sys.executable, str(PROBE), "suite"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=endpoint,
                     TRITON_CACHE_DIR=str(tmp_path / f"c{i}"), KILN_FILES_DIR=str(tmp_path / f"f{i}")))
            for i in range(2)]
        for client in clients:
            out, err = client.communicate(timeout=600)
            assert client.returncode == 0, err[-3000:]
            assert json.loads(out.splitlines()[-1])["kernels"] == stock_suite
        # Without Redis: the two clients' claims and compiles of a kernel met on
        # one kilnd, so one of them ran its frontend and sent it; the other waited.
        stats = [kilnd.stats() for kilnd in fleet]
        compile_calls = [sum(rpc.count for rpc in s.rpc_latency if rpc.method == "Compile") for s in stats]
        waited = [s.lookups_waited for s in stats]
        assert sum(compile_calls) == 30 and all(compile_calls), (compile_calls, waited)
        assert sum(s.compiles for s in stats) == 30, ([s.compiles for s in stats], compile_calls, waited)
    finally:
        for kilnd in fleet:
            kilnd.stop()
