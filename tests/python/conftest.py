"""Fixtures that run the real kilnd binary with the real triton package."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KILN_BUILD_DIR", REPO / "build"))
sys.path[:0] = [str(Path(__file__).parent), str(REPO / "tests")]

import hermetic  # noqa: E402
import process_table  # noqa: E402
from built_wheels import build_wheels  # noqa: E402

# Before any test or fixture runs: none of them reaches this account's kilnd,
# caches or files (a no-op under scripts/test, which did it already).
hermetic.enter()
hermetic.apply_test_settings()


from kiln.service import api as _api  # noqa: E402  (the client package's API messages and stub)


def pytest_configure(config):
    # tests/run-suites picks its lanes by these: the linux lane runs every test
    # but outside_bytes ones that a sanitizer can run, the asan lane those.
    config.addinivalue_line("markers", "outside_bytes: kilnd takes bytes from outside (stores, bundles, "
                            "registries, TCP callers, faults); run against the ASan+UBSan kilnd")
    config.addinivalue_line("markers", "release_build: measures what a sanitizer changes (memory, "
                            "address space); run against the release build only")

PROBE = Path(__file__).parent / "client_probe.py"


def run_probe(env, *args, check=True):
    result = subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"probe failed:\n{result.stderr[-4000:]}")
    return result


def probe_json(result):
    return json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope="session")
def stock_suite(tmp_path_factory):
    """The kernel suite as stock Triton compiles it, once for every module that compares with it."""
    env = hermetic.stock_env()
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("stock-cache"))
    return probe_json(run_probe(env, "suite"))["kernels"]


def run_on_terminal(command, env=None, timeout=600):
    """Runs `command` with its stdout on a pseudo-terminal: (exit status, what
    the terminal showed, stderr)."""
    import pty

    primary, secondary = pty.openpty()
    process = subprocess.Popen(command, stdout=secondary, stderr=subprocess.PIPE, env=env)
    os.close(secondary)
    shown = b""
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # the terminal's other end closed: the command exited
            break
        if not chunk:
            break
        shown += chunk
    os.close(primary)
    return process.wait(timeout=timeout), shown.decode(), process.stderr.read().decode()


def kilnd_refusing(directory, config_text, *flags, wrapper=()):
    """Runs kilnd with `config_text` as its config file and `flags`, started by
    `wrapper` if any, expecting it to refuse to start (an error exit, not a
    crash); returns what it printed."""
    config = directory / "kilnd.conf"
    config.write_text(config_text)
    result = subprocess.run([*wrapper, str(BUILD / "service" / "kilnd"), f"--config={config}",
                             f"--data-dir={directory / 'd'}", f"--local-socket={directory / 's'}", *flags],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode > 0, result
    return result.stdout + result.stderr


def kilnd_processes_with(variable, value):
    """PIDs of the kilnd processes whose environment sets `variable` to `value`:
    those a client started for a test's own XDG_RUNTIME_DIR."""
    def is_kilnd(pid):
        try:
            return os.readlink(f"/proc/{pid}/exe").endswith("/kilnd")
        except OSError:
            return False  # exited meanwhile
    return [pid for pid in hermetic.processes_with(variable, value) if is_kilnd(pid)]


def tcp_kilnd(root, *flags, config=""):
    """A Kilnd that also listens on loopback TCP, on a free port (its
    tcp_address()), with `config` lines added to its config file."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / "kilnd.conf"
    path.write_text("tcp_listen = 127.0.0.1:0\n" + config)
    return Kilnd(root / "kilnd", f"--config={path}", *flags)


class Kilnd:
    """A kilnd process on a private socket and data directory, started by
    `wrapper` (a command that ends by running the one it is given) if any."""

    def __init__(self, root, *flags, wrapper=(), env=None, wait_for_toolchains=True):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.socket = self.root / "kilnd.sock"
        self.log = open(self.root / "kilnd.out", "w")
        self.process = subprocess.Popen(
            [*wrapper, str(BUILD / "service" / "kilnd"), f"--data-dir={self.root / 'data'}",
             f"--local-socket={self.socket}", *flags],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.channel = grpc.insecure_channel(f"unix:{self.socket}", options=[
            ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
        try:
            grpc.channel_ready_future(self.channel).result(timeout=60)
        except grpc.FutureTimeoutError:
            self.stop()
            raise RuntimeError("kilnd did not start:\n" + (self.root / "kilnd.out").read_text())
        self.stub = _api.KilnStub(self.channel)
        # kilnd serves while it probes a toolchain it never saw: the tests
        # (but the one of that) begin once its --toolchain are registered,
        # which a ListToolchains waits for.
        if wait_for_toolchains and any(flag.startswith("--toolchain=") for flag in flags):
            self.stub.ListToolchains(_api.ListToolchainsRequest(), timeout=120)

    def stats(self):
        return self.stub.GetStats(_api.GetStatsRequest())

    def wait_for_workers_started(self, count, seconds=60):
        """Until `count` workers have started (each is ready for a job once counted)."""
        deadline = time.time() + seconds
        while self.stats().workers_started < count and time.time() < deadline:
            time.sleep(0.05)
        assert self.stats().workers_started >= count, f"kilnd started fewer than {count} workers in {seconds} s"

    def tcp_address(self):
        """HOST:PORT of its loopback TCP listener (tcp_listen = 127.0.0.1:0 picks the port)."""
        return re.search(r"127\.0\.0\.1:(\d+)", (self.root / "kilnd.out").read_text()).group(0)

    def worker_pids(self):
        """The kiln_worker.py processes this kilnd started."""
        return [pid for pid, process in process_table.running().items()
                if process.parent == self.process.pid and b"kiln_worker.py" in process.command_line]

    def descendant_pids(self):
        """Every process this kilnd started, and theirs."""
        return process_table.tree(self.process.pid, process_table.running())[1:]

    def stop(self):
        self.channel.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=60)
        self.log.close()
        return self.process.returncode


@pytest.fixture(scope="session")
def kilnd(tmp_path_factory):
    server = Kilnd(tmp_path_factory.mktemp("kilnd"), f"--toolchain={sys.executable}",
                   "--compile-workers=2")
    yield server
    assert server.stop() == 0, (server.root / "kilnd.out").read_text()


@pytest.fixture
def fresh_kilnd(tmp_path):
    """A kilnd with no toolchain registered, for registration tests."""
    servers = []

    def start(*flags):
        servers.append(Kilnd(tmp_path / str(len(servers)), *flags))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def wheels(tmp_path_factory):
    """kiln-triton's wheels (scripts/build-wheels): {"any" | "manylinux" | "win_amd64": path}."""
    built = build_wheels(tmp_path_factory.mktemp("wheels"))
    assert set(built) == {"any", "manylinux", "win_amd64"}, built
    return built
