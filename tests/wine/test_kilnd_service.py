"""The zip's kilnd.exe as a Windows service under Wine's Service Control
Manager: install, start, status, stop and uninstall through kilnd.exe's own
commands; kiln.exe reaching the running service through the machine's
endpoint file; and no acknowledged put lost when the service is stopped, or
killed with TerminateProcess, in the middle of a burst of puts."""

import hashlib
import re
import subprocess
import threading
import time

import pytest
from kiln.service import api as _api
from kiln.service import paths as _paths
from kiln.service import connection as _service
from kiln.service.errors import RpcError

from conftest import linux_path, prefix_with_services, runner, windows_path

SERVICE_DATA = r"C:\ProgramData\kiln"


@pytest.fixture(scope="module")
def wine(tmp_path_factory):
    with prefix_with_services(tmp_path_factory, "serviceprefix") as env:
        yield env


@pytest.fixture(scope="module")
def kilnd(wine, binaries):
    return runner(wine, binaries[0])


@pytest.fixture(scope="module")
def kiln(wine, binaries):
    return runner(wine, binaries[1])


def service_pid(kilnd):
    """The running service's Windows pid, or None when it is not running."""
    status = kilnd("status", check=False)
    found = re.search(r"running \(pid (\d+)\)", status.stdout)
    return int(found.group(1)) if found else None


def connect(wine):
    """The Linux client of the service, through the machine's endpoint file."""
    return _service.Connection(_paths.read_endpoint_file(linux_path(wine, SERVICE_DATA + r"\run\kilnd.endpoint")))


def payload(i):
    return hashlib.sha256(str(i).encode()).digest() * 2048  # 64 KiB: a blob file, not inline


class PutBurst:
    """Puts burst/k0, burst/k1, ... one after another until a put fails,
    remembering each key kilnd acknowledged."""

    def __init__(self, wine):
        self.connection = connect(wine)
        self.acknowledged = []
        self.error = None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        i = 0
        while True:
            request = _api.PutRequest(namespace="burst", key=f"k{i}", blobs=[_api.blob("kernel.cubin", payload(i))])
            try:
                self.connection.stub.Put(request, timeout=30)
            except RpcError as error:
                self.error = error
                return
            self.acknowledged.append(i)
            i += 1

    def wait_for(self, count):
        deadline = time.monotonic() + 120
        while len(self.acknowledged) < count:
            assert self.error is None, f"the burst failed before it was interrupted: {self.error}"
            assert time.monotonic() < deadline, "the burst is too slow"
            time.sleep(0.05)

    def finish(self):
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "a put hangs after the service went away"
        self.connection.close()
        return self.acknowledged


def assert_all_stored(wine, kiln, acknowledged):
    connection = connect(wine)
    try:
        for i in acknowledged:
            found = connection.stub.Lookup(_api.LookupRequest(namespace="burst", key=f"k{i}"), timeout=30)
            assert found.found, f"acknowledged put burst/k{i} was lost"
            assert found.entry.blobs[0].data == payload(i), f"burst/k{i} came back changed"
    finally:
        connection.close()
    verified = kiln("verify")
    assert " 0 corrupt" in verified.stdout, verified.stdout


def test_install_registers_the_service_with_the_machines_data_directory(kilnd, wine):
    installed = kilnd("install")
    assert SERVICE_DATA in installed.stdout, installed.stdout
    assert kilnd("status", check=False).returncode == 3  # installed, not running
    assert kilnd("install", check=False).returncode != 0  # a second install is refused


def test_start_serves_kiln_exe_through_the_machines_endpoint_file(kilnd, kiln, wine, tmp_path):
    kilnd("start")
    status = kilnd("status")
    assert "running" in status.stdout and "LocalService" in status.stdout, status.stdout
    # A fresh account has no per-user kilnd, so kiln.exe finds the service's endpoint file.
    assert "SERVING" in kiln("health", "--wait", "30").stdout
    blob = tmp_path / "kernel.cubin"
    blob.write_bytes(payload("service"))
    kiln("put", "tests", "via-service", f"kernel.cubin={windows_path(blob)}")
    kiln("get", "tests", "via-service", "-o", windows_path(tmp_path / "out"))
    assert (tmp_path / "out" / "kernel.cubin").read_bytes() == blob.read_bytes()
    assert linux_path(wine, SERVICE_DATA + r"\kiln.db").exists()


def test_stop_during_a_burst_of_puts_loses_nothing_acknowledged(kilnd, kiln, wine):
    burst = PutBurst(wine)
    burst.wait_for(40)
    kilnd("stop")
    acknowledged = burst.finish()
    assert kilnd("status", check=False).returncode == 3
    kilnd("start")
    assert_all_stored(wine, kiln, acknowledged)


def test_terminate_process_during_a_burst_loses_nothing_acknowledged(kilnd, kiln, wine):
    pid = service_pid(kilnd)
    assert pid is not None
    burst = PutBurst(wine)
    burst.wait_for(40)
    # taskkill /F is TerminateProcess: no stop control, no cleanup.
    subprocess.run(["wine", "taskkill", "/F", "/PID", str(pid)], env=wine, capture_output=True, check=True,
                   timeout=60)
    acknowledged = burst.finish()
    # Windows' SCM restarts a killed service by its recovery actions; Wine's
    # notices the death only when asked to start it again.
    kilnd("start", check=False)
    restarted = service_pid(kilnd)
    assert restarted is not None and restarted != pid, kilnd("status", check=False).stdout
    assert_all_stored(wine, kiln, acknowledged)


def test_stop_and_uninstall_remove_the_service(kilnd, kiln, wine):
    kilnd("stop")
    assert kiln("health", check=False).returncode == 3  # unreachable
    kilnd("uninstall")
    assert kilnd("status", check=False).returncode == 4  # not installed
