"""kilnd's subscriptions (bundle_sources): bundles it imports by itself from
an OCI registry (Debian's docker-registry, TLS with a CA the test makes) or a
directory, checked at start and every bundle_refresh, on a thread no call
waits on."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
import triton

import hermetic
import registry_server
from bundle_files import publisher_key, write_bundle
from conftest import BUILD, REPO, Kilnd, probe_json, run_probe
from test_bundle import KILN, trusting
from test_metrics import scrape
from test_registry import kiln

# kilnd takes outside bytes here: the asan lane runs these against its ASan+UBSan build.
pytestmark = pytest.mark.outside_bytes

REFRESH = 2  # seconds between a subscribed kilnd's checks


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    server = registry_server.start(tmp_path_factory.mktemp("registry"))
    yield server
    server.stop()


def registry_env(tmp_path, registry):
    """What kiln and kilnd need to reach the test's registry: its CA and a docker login."""
    env = dict(os.environ, SSL_CERT_FILE=str(registry.ca),
               DOCKER_CONFIG=str(registry_server.docker_config(tmp_path / "docker", registry.address)))
    env.pop("KILN_REGISTRY_TOKEN", None)
    return env


def wait_for(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s: {what}")


def source_report(kilnd, source):
    [report] = [s for s in kilnd.stats().subscriptions if s.source == source]
    return report


def cubin_of(kilnd, key, out):
    """The k.cubin kilnd holds under triton/KEY (None when it has no such entry)."""
    got = subprocess.run([str(KILN), "--endpoint", f"unix:{kilnd.socket}", "get", "triton", key,
                          "-o", str(out)], capture_output=True, timeout=60)
    return (out / "k.cubin").read_bytes() if got.returncode == 0 else None


def test_a_subscribed_kilnd_imports_a_newly_pushed_tag_within_one_refresh_and_after_a_restart_fetches_nothing(
        tmp_path, registry):
    env = registry_env(tmp_path, registry)
    private, public, key_id = publisher_key(tmp_path)
    reference = f"{registry.address}/fleet/kernels:stable"
    first = {"k.cubin": os.urandom(3000)}
    write_bundle(tmp_path / "v1.kilnbundle", [("triton", "first", first)], signer=private)
    assert kiln(env, "push", tmp_path / "v1.kilnbundle", reference).returncode == 0

    flags = (trusting(public), f"--bundle-sources={reference}", f"--bundle-refresh={REFRESH}")
    node = Kilnd(tmp_path / "node", *flags, env=env)
    try:
        report = wait_for(lambda: source_report(node, reference).imports == 1 and source_report(node, reference),
                          30, "the tag imported at start")
        assert report.imported.startswith("sha256:") and report.error == ""
        assert report.last_import_result.stored == 1 and report.last_import_result.trusted
        assert report.last_import_result.signed_by == key_id
        assert cubin_of(node, "first", tmp_path / "got1") == first["k.cubin"]

        # The publisher pushes a new bundle to the same tag: imported within one refresh.
        second = {"k.cubin": os.urandom(4000)}
        write_bundle(tmp_path / "v2.kilnbundle", [("triton", "second", second)], signer=private)
        pushed = kiln(env, "push", tmp_path / "v2.kilnbundle", reference)
        digest = pushed.stdout.strip().rsplit("@", 1)[1]
        pushed_at = time.monotonic()
        wait_for(lambda: source_report(node, reference).imported == digest, 3 * REFRESH + 10,
                 "the new digest imported")
        assert time.monotonic() - pushed_at < 2 * REFRESH + 10
        assert cubin_of(node, "second", tmp_path / "got2") == second["k.cubin"]
        assert source_report(node, reference).imports == 2

        # `kiln stats` and the metrics say what was pulled.
        stats = subprocess.run([str(KILN), "--endpoint", f"unix:{node.socket}", "stats"],
                               capture_output=True, text=True, timeout=60).stdout
        assert f"bundle source {reference}: {digest}" in stats, stats
        assert f"signed by trusted key {key_id}; 1 stored" in stats, stats
    finally:
        node.stop()

    # A restart knows what it imported: it checks, and fetches nothing.
    node = Kilnd(tmp_path / "node", *flags, env=env)
    try:
        report = wait_for(lambda: source_report(node, reference).checks >= 1 and source_report(node, reference),
                          30, "a check after the restart")
        assert report.imported == digest and report.imports == 0 and report.error == ""
    finally:
        node.stop()


def test_a_directory_source_imports_each_new_or_changed_bundle_and_an_untrusted_damaged_one_is_refused_once(tmp_path):
    private, public, key_id = publisher_key(tmp_path)
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    a = {"k.cubin": os.urandom(2000)}
    write_bundle(shelf / "a.kilnbundle", [("triton", "a", a)], signer=private)
    (shelf / "notes.txt").write_text("not a bundle: left alone")
    node = Kilnd(tmp_path / "node", trusting(public), f"--bundle-sources={shelf}", f"--bundle-refresh={REFRESH}")
    try:
        wait_for(lambda: source_report(node, str(shelf)).imports == 1, 30, "a.kilnbundle imported")
        assert source_report(node, str(shelf)).imported == "1 of 1 files"
        assert cubin_of(node, "a", tmp_path / "got-a") == a["k.cubin"]

        b = {"k.cubin": os.urandom(2500)}
        write_bundle(shelf / "b.kilnbundle", [("triton", "b", b)], signer=private)
        (shelf / "broken.kilnbundle").write_bytes(b"KILN" + os.urandom(100))
        wait_for(lambda: source_report(node, str(shelf)).imports == 2, 3 * REFRESH + 10, "b.kilnbundle imported")
        assert cubin_of(node, "b", tmp_path / "got-b") == b["k.cubin"]
        report = wait_for(lambda: "broken.kilnbundle" in source_report(node, str(shelf)).error
                          and source_report(node, str(shelf)), 3 * REFRESH + 10, "the damaged file refused")
        assert report.imported == "2 of 3 files"
        # Refused for what it is: not imported again while it is unchanged, and said at each check.
        time.sleep(2 * REFRESH + 1)
        report = source_report(node, str(shelf))
        assert report.imports == 2 and "refused, and unchanged since" in report.error, report
        log = (tmp_path / "node" / "kilnd.out").read_text()
        assert log.count("broken.kilnbundle: ") == 1, log  # its reason once; then "(refused, and unchanged since)"
    finally:
        node.stop()


class BlackHole:
    """A TCP port whose connections are taken and never answered: a registry
    that hangs."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.held = []
        self.thread = threading.Thread(target=self._take, daemon=True)
        self.thread.start()

    def _take(self):
        while True:
            try:
                self.held.append(self.listener.accept()[0])
            except OSError:
                return

    def close(self):
        self.listener.close()
        for connection in self.held:
            connection.close()


def test_a_stopped_or_hanging_registry_costs_kilnds_calls_nothing_is_logged_once_a_refresh_and_a_stop_ends_it(
        tmp_path, registry):
    hole = BlackHole()
    stopped = socket.socket()
    stopped.bind(("127.0.0.1", 0))  # bound, never listening: connections refused
    stopped_address = "127.0.0.1:%d" % stopped.getsockname()[1]
    sources = [f"{stopped_address}/fleet/kernels:v1", f"{hole.address}/fleet/kernels:v1"]
    env = registry_env(tmp_path, registry)
    node = Kilnd(tmp_path / "node", f"--bundle-sources={','.join(sources)}", f"--bundle-refresh={REFRESH}",
                 "--metrics-listen=127.0.0.1:0", env=env)
    try:
        # The hanging one holds the subscription's thread; calls never wait on it.
        time.sleep(1)
        kiln_cli = [str(KILN), "--endpoint", f"unix:{node.socket}"]
        payload = tmp_path / "payload"
        payload.write_bytes(os.urandom(1000))
        for i in range(20):
            started = time.monotonic()
            put = subprocess.run([*kiln_cli, "put", "triton", f"key{i}", f"k.cubin={payload}"], capture_output=True,
                                 timeout=60)
            assert put.returncode == 0, put.stderr
            assert time.monotonic() - started < 5
        time.sleep(3 * REFRESH)
        refused = source_report(node, sources[0])
        assert refused.checks >= 2 and refused.failures == refused.checks and refused.imports == 0
        assert "cannot connect" in refused.error, refused.error
        log = (tmp_path / "node" / "kilnd.out").read_text()
        # Once a refresh, not in a tight loop.
        assert 2 <= log.count(f"bundle source {sources[0]}:") <= refused.checks + 1, log
        assert [s.source for s in node.stats().subscriptions] == sources
        port = re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", log).group(1)
        metrics = scrape(f"http://127.0.0.1:{port}/metrics")
        refused_source = frozenset({("source", sources[0])})
        assert metrics[("kiln_bundle_source_up", refused_source)] == 0
        assert metrics[("kiln_bundle_source_failures_total", refused_source)] >= 2
        assert metrics[("kiln_bundle_source_imports_total", refused_source)] == 0
    finally:
        started = time.monotonic()
        assert node.stop() == 0
        stop_seconds = time.monotonic() - started
        hole.close()
        stopped.close()
    assert stop_seconds < 15, f"kilnd took {stop_seconds:.1f} s to stop with a registry hanging"


def test_a_bundle_source_kilnd_cannot_use_stops_its_start_with_the_fix(tmp_path):
    started = subprocess.run([str(BUILD / "service" / "kilnd"),
                              f"--data-dir={tmp_path / 'data'}", f"--local-socket={tmp_path / 'kilnd.sock'}",
                              "--bundle-sources=./shelf", "--bundle-refresh=1h"],
                             capture_output=True, text=True, timeout=60)
    said = started.stdout + started.stderr
    assert started.returncode != 0
    assert "bundle_sources" in said and "./shelf" in said and "absolute path" in said, said
    bad_refresh = subprocess.run([str(BUILD / "service" / "kilnd"),
                                  f"--data-dir={tmp_path / 'data'}", "--bundle-refresh=0s"],
                                 capture_output=True, text=True, timeout=60)
    said = bad_refresh.stdout + bad_refresh.stderr
    assert bad_refresh.returncode != 0 and "bundle_refresh" in said, said


def test_a_bundle_recorded_for_sm90_pushed_as_an_index_for_three_targets_leaves_an_sm89_node_nothing_to_compile(
        tmp_path, registry):
    """The publisher needs no GPU: kilnd compiles the sm90 recording's kernels
    for sm80 and sm89, and `kiln push --target` publishes one index of three
    bundles. A node whose GPU is an sm89 (gpu_targets: this machine has none)
    subscribes, takes the sm89 bundle only, and a compile-only client of sm89
    then compiles nothing, in kilnd or in itself, and gets stock's bytes."""
    env = registry_env(tmp_path, registry)
    base = hermetic.stock_env()
    stock_sm89 = probe_json(run_probe(dict(base, TRITON_CACHE_DIR=str(tmp_path / "stock")), "suite-sm89"))["kernels"]
    private, public, key_id = publisher_key(tmp_path)
    recording = tmp_path / "sm90.kilnbundle"
    reference = f"{registry.address}/fleet/suite:v1"
    publisher = Kilnd(tmp_path / "publisher", f"--toolchain={sys.executable}", env=env)
    try:
        run_probe(dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{publisher.socket}",
                       TRITON_CACHE_DIR=str(tmp_path / "c1"), KILN_FILES_DIR=str(tmp_path / "f1")), "suite-sm90")
        assert kiln(env, "export", recording, kilnd=publisher).returncode == 0
        recorded = publisher.stats().compiles
        pushed = kiln(env, "push", recording, reference, "--target", "cuda:80", "--target", "cuda:89",
                      "--target", "cuda:90", "--sign", private, kilnd=publisher)
        assert pushed.returncode == 0, pushed.stderr
        for target in ("cuda:80", "cuda:89", "cuda:90"):
            assert re.search(rf"^{target}: \d+ entries, 15 of them kernels of Triton {triton.__version__}$",
                             pushed.stdout, re.M), pushed.stdout
        assert f"pushed an index of 3 targets (signed by key {key_id}" in pushed.stdout, pushed.stdout
        # sm80 and sm89; the sm90 kernels went as recorded.
        assert publisher.stats().compiles - recorded == 30
    finally:
        publisher.stop()
    index_digest = pushed.stdout.strip().rsplit("@", 1)[1]

    # skopeo, another client, reads the index and each manifest.
    certs = tmp_path / "skopeo-certs"
    certs.mkdir()
    (certs / "ca.crt").write_bytes(registry.ca.read_bytes())
    skopeo = ["skopeo", "inspect", "--raw", "--creds", f"{registry_server.USER}:{registry_server.PASSWORD}",
              "--cert-dir", str(certs)]
    index = json.loads(subprocess.run([*skopeo, f"docker://{reference}"], check=True, capture_output=True,
                                      text=True, timeout=120).stdout)
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert [m["annotations"]["dev.kiln.target"] for m in index["manifests"]] == ["cuda:80", "cuda:89", "cuda:90"]
    assert {m["annotations"]["dev.kiln.triton"] for m in index["manifests"]} == {triton.__version__}
    for member in index["manifests"]:
        manifest = json.loads(subprocess.run(
            [*skopeo, f"docker://{registry.address}/fleet/suite@{member['digest']}"], check=True,
            capture_output=True, text=True, timeout=120).stdout)
        assert manifest["artifactType"] == "application/vnd.kiln.bundle.v1"
        [layer] = manifest["layers"]
        assert layer["mediaType"] == "application/vnd.kiln.bundle.v1"

    node = Kilnd(tmp_path / "node", f"--toolchain={sys.executable}", trusting(public), f"--bundle-sources={reference}",
                 "--gpu-targets=cuda:89", f"--bundle-refresh={REFRESH}", env=env)
    try:
        report = wait_for(lambda: source_report(node, reference).imports == 1 and source_report(node, reference),
                          120, "the index's sm89 bundle imported")
        assert report.imported == f"{index_digest} (cuda:89 of cuda:80, cuda:89, cuda:90)", report
        assert report.last_import_result.trusted and report.last_import_result.signed_by == key_id
        assert list(node.stats().gpu_targets) == ["cuda:89"]
        client = dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{node.socket}",
                      TRITON_CACHE_DIR=str(tmp_path / "c2"), KILN_FILES_DIR=str(tmp_path / "f2"),
                      KILN_FIRST_COMPILE_HERE="1", KILN_COMPILE_HERE="1")
        result = probe_json(run_probe(client, "suite-sm89"))
        assert result["kernels"] == stock_sm89
        assert result["frontend_runs"] == 0
        assert node.stats().compiles == 0
    finally:
        node.stop()

    # A node of another GPU takes nothing, and says what the index holds.
    other = Kilnd(tmp_path / "other", f"--bundle-sources={reference}", "--gpu-targets=cuda:75",
                  f"--bundle-refresh={REFRESH}", env=env)
    try:
        report = wait_for(lambda: source_report(other, reference).checks >= 1 and source_report(other, reference),
                          30, "a check")
        assert report.imports == 0 and "holds kernels for cuda:80, cuda:89, cuda:90, none for cuda:75" in report.error
    finally:
        other.stop()

    # Nor does a node of the GPU whose kilnd has toolchains of another Triton only.
    other_triton = REPO / ".venv-triton" / "3.5.1" / "bin" / "python"
    other = Kilnd(tmp_path / "other-triton", f"--toolchain={other_triton}", f"--bundle-sources={reference}",
                  "--gpu-targets=cuda:89", f"--bundle-refresh={REFRESH}", env=env)
    try:
        report = wait_for(lambda: source_report(other, reference).checks >= 1 and source_report(other, reference),
                          60, "a check")
        assert report.imports == 0, report
        assert (f"holds kernels for cuda:80 (Triton {triton.__version__}), cuda:89 (Triton {triton.__version__}), "
                f"cuda:90 (Triton {triton.__version__}), none of a Triton this kilnd has a toolchain of (3.5.1)"
                in report.error), report.error
    finally:
        other.stop()
