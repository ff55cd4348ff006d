"""kilnd's Prometheus page (metrics_listen): a real kilnd, real traffic, and the
page read with prometheus_client's own parser, as Prometheus reads it."""

import re
import socket
import sys
import time
import urllib.error
import urllib.request

import pytest
from kiln.service import api as _api
from prometheus_client.parser import text_string_to_metric_families
from triton.backends.compiler import GPUTarget

import kernel_suite
import triton_frontend
from conftest import Kilnd, kilnd_refusing
from pipeline_client import compile_request


def scrape(url):
    """{(sample name, frozenset of labels): value} of the page at `url`."""
    with urllib.request.urlopen(url, timeout=30) as page:
        assert page.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = page.read().decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


@pytest.fixture
def metered(tmp_path):
    server = Kilnd(tmp_path / "kilnd", "--metrics-listen=127.0.0.1:0", f"--toolchain={sys.executable}")
    # kilnd answers on its socket a moment before the metrics page is up (and logged).
    deadline, found = time.monotonic() + 30, None
    while found is None and time.monotonic() < deadline:
        found = re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", (server.root / "kilnd.out").read_text())
        time.sleep(0.05)
    assert found, (server.root / "kilnd.out").read_text()
    yield server, f"http://127.0.0.1:{found.group(1)}/metrics"
    server.stop()


def test_metrics_move_with_real_traffic(metered):
    server, url = metered
    before = scrape(url)
    assert before[("kiln_compiles_total", frozenset())] == 0

    server.stub.Lookup(_api.LookupRequest(namespace="triton", key="no-such-key"))
    server.stub.Put(_api.PutRequest(namespace="triton", key="k1", blobs=[_api.blob("a.cubin", b"bytes")]))
    server.stub.Lookup(_api.LookupRequest(namespace="triton", key="k1"))
    claim = server.stub.LookupOrClaim(_api.LookupRequest(namespace="triton", key="k2", claimant="test",
                                                         key_components=_api.KeyComponents(kernel="k@cuda:90")))
    assert next(claim).claimed
    claim.cancel()
    frontend = triton_frontend.run_frontend(kernel_suite.SUITE[0], GPUTarget("cuda", 90, 32))
    response = server.stub.Compile(compile_request(frontend), timeout=300)
    assert response.WhichOneof("result") == "entry", response.error

    # kilnd answers a compile before it stores the result: wait for the store.
    deadline = time.monotonic() + 30
    while (after := scrape(url))[("kiln_store_entries", frozenset())] < 2:
        assert time.monotonic() < deadline, "the compile's entry was never stored"
        time.sleep(0.1)
    assert after[("kiln_compiles_total", frozenset())] == 1
    assert after[("kiln_compile_seconds_total", frozenset())] > 0
    assert after[("kiln_puts_total", frozenset())] >= 1
    lookups = frozenset({("namespace", "local/triton"), ("result", "hit")})
    misses = frozenset({("namespace", "local/triton"), ("result", "miss")})
    assert after[("kiln_lookups_total", lookups)] == 1 and after[("kiln_lookups_total", misses)] >= 1
    assert after[("kiln_misses_total", frozenset({("reason", "new kernel")}))] == 1
    # Latency histograms: cumulative buckets ending in +Inf, which is the count.
    compile_label = ("method", "Compile")
    buckets = sorted((float(dict(labels)["le"]), value) for (name, labels), value in after.items()
                     if name == "kiln_rpc_duration_seconds_bucket" and compile_label in labels)
    assert [value for _, value in buckets] == sorted(value for _, value in buckets)
    assert buckets[-1] == (float("inf"), 1)
    assert after[("kiln_rpc_duration_seconds_count", frozenset({compile_label}))] == 1
    assert after[("kiln_rpc_duration_seconds_sum", frozenset({compile_label}))] > 0
    lookup_count = after[("kiln_rpc_duration_seconds_count", frozenset({("method", "Lookup")}))]
    assert lookup_count == before[("kiln_rpc_duration_seconds_count", frozenset({("method", "Lookup")}))] + 2


def test_the_metrics_page_refuses_other_requests_and_kilnd_keeps_serving(metered):
    server, url = metered
    root = url.rsplit("/", 1)[0]
    with pytest.raises(urllib.error.HTTPError) as other:
        urllib.request.urlopen(root + "/other", timeout=30)
    assert other.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as post:
        urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=30)
    assert post.value.code == 405
    host, port = root[len("http://"):].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as flood:  # a head that never ends
        flood.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"y" * 10000)
        assert flood.recv(100).startswith(b"HTTP/1.1 431")
    with socket.create_connection((host, int(port)), timeout=30):
        pass  # a client that connects and says nothing is dropped after its timeout
    assert ("kiln_compiles_total", frozenset()) in scrape(url)
    assert server.stats().server_version


def test_metrics_on_another_machines_address_need_allow_remote(tmp_path):
    printed = kilnd_refusing(tmp_path, "metrics_listen = 0.0.0.0:9464\n")
    assert "allow_remote" in printed and "metrics_listen" in printed
