"""kilnd's TCP listener for other machines: TLS, client identity (certificates
signed by the farm's CA, or bearer tokens from client_tokens) and tenants that
cannot see each other's puts. On loopback, with a CA the test makes (openssl)."""

import hashlib
import subprocess
import sys
import sysconfig
import time

import grpc
import pytest
from kiln.service import api as _api
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia import driver as nvidia_driver

import hermetic
import kernel_suite
import triton_frontend
from conftest import BUILD, Kilnd, kilnd_refusing, probe_json, run_probe
from pipeline_client import compile_request
from test_launcher import libcuda_dir  # noqa: F401  (fixture)

# kilnd takes outside bytes here: the asan lane runs these against its ASan+UBSan build.
pytestmark = pytest.mark.outside_bytes


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def new_key_and_request(directory, name, subject):
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", subject, cwd=directory)


def new_ca(directory, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
            f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}", cwd=directory)


def sign(directory, ca, name, extensions=None):
    args = ["x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2"]
    if extensions:
        (directory / f"{name}.ext").write_text(extensions)
        args += ["-extfile", f"{name}.ext"]
    openssl(*args, cwd=directory)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """The farm's CA, kilnd's certificate for 127.0.0.1, client certificates
    for tenants alpha and beta, and one for alpha from a CA kilnd does not trust."""
    directory = tmp_path_factory.mktemp("pki")
    new_ca(directory, "farm-ca")
    new_ca(directory, "other-ca")
    new_key_and_request(directory, "server", "/CN=localhost")
    sign(directory, "farm-ca", "server", "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for tenant, ca in (("alpha", "farm-ca"), ("beta", "farm-ca"), ("mallory", "other-ca")):
        new_key_and_request(directory, tenant, f"/CN={'alpha' if tenant == 'mallory' else tenant}")
        sign(directory, ca, tenant)
    return directory


TOKEN = "gamma-token-" + "7" * 40


@pytest.fixture(scope="module")
def farm(pki, tmp_path_factory):
    """kilnd with a TLS tcp_listen, mutual TLS and a token file; yields it and its address."""
    root = tmp_path_factory.mktemp("farm")
    tokens = root / "client_tokens"
    tokens.write_text(f"# tenant, SHA-256 of its token\ngamma {hashlib.sha256(TOKEN.encode()).hexdigest()}\n")
    config = root / "kilnd.conf"
    config.write_text(f"tcp_listen = 127.0.0.1:0\ntls_cert = {pki / 'server.pem'}\ntls_key = {pki / 'server.key'}\n"
                      f"tls_client_ca = {pki / 'farm-ca.pem'}\nclient_tokens = {tokens}\n")
    server = Kilnd(root / "kilnd", f"--config={config}", f"--toolchain={sys.executable}", "--compile-workers=1")
    yield server, server.tcp_address(), tokens
    server.stop()


def channel(pki, address, tenant=None, token=None):
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(pki / "farm-ca.pem").read_bytes(),
        private_key=(pki / f"{tenant}.key").read_bytes() if tenant else None,
        certificate_chain=(pki / f"{tenant}.pem").read_bytes() if tenant else None)
    if token:
        credentials = grpc.composite_channel_credentials(credentials, grpc.access_token_call_credentials(token))
    return grpc.secure_channel(address, credentials)


def stub(pki, address, tenant=None, token=None):
    return _api.KilnStub(channel(pki, address, tenant, token))


def refusal(call):
    with pytest.raises(grpc.RpcError) as error:
        call()
    return error.value


def test_a_remote_listener_without_tls_and_client_identity_is_refused_with_the_settings_to_add(tmp_path):
    printed = kilnd_refusing(tmp_path, "tcp_listen = 0.0.0.0:7733\nallow_remote = true\n")
    for setting in ("tls_cert", "tls_key", "tls_client_ca", "client_tokens"):
        assert setting in printed, printed


def test_clients_without_a_certificate_or_token_are_refused_unauthenticated(pki, farm):
    _, address, _ = farm
    refused = refusal(lambda: stub(pki, address).GetStats(_api.GetStatsRequest(), timeout=30))
    assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "KILN_CLIENT_CERT" in refused.details() and "KILN_TOKEN_FILE" in refused.details()


def test_a_certificate_from_another_ca_and_a_plaintext_client_are_refused(pki, farm):
    _, address, _ = farm
    other_ca = refusal(lambda: stub(pki, address, "mallory").GetStats(_api.GetStatsRequest(), timeout=30))
    assert other_ca.code() == grpc.StatusCode.UNAVAILABLE  # the TLS handshake fails
    plaintext = _api.KilnStub(grpc.insecure_channel(address))
    assert refusal(lambda: plaintext.GetStats(_api.GetStatsRequest(), timeout=30)).code() == \
        grpc.StatusCode.UNAVAILABLE


def test_a_revoked_token_is_refused_once_the_file_changes(pki, farm):
    _, address, tokens = farm
    assert stub(pki, address, token=TOKEN).GetStats(_api.GetStatsRequest(), timeout=30).uptime_seconds >= 0
    wrong = refusal(lambda: stub(pki, address, token="not-" + TOKEN).GetStats(_api.GetStatsRequest(), timeout=30))
    assert wrong.code() == grpc.StatusCode.UNAUTHENTICATED and "KILN_TOKEN_FILE" in wrong.details()
    original = tokens.read_text()
    tokens.write_text("# gamma revoked\n")
    try:
        deadline = time.monotonic() + 10
        while True:  # kilnd looks at the file at most once a second
            try:
                stub(pki, address, token=TOKEN).GetStats(_api.GetStatsRequest(), timeout=30)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNAUTHENTICATED
                break
            assert time.monotonic() < deadline, "the revoked token is still accepted"
            time.sleep(0.2)
    finally:
        tokens.write_text(original)
    deadline = time.monotonic() + 10
    while True:  # and takes it back once the line is back
        try:
            stub(pki, address, token=TOKEN).GetStats(_api.GetStatsRequest(), timeout=30)
            break
        except grpc.RpcError:
            assert time.monotonic() < deadline, "the restored token is still refused"
            time.sleep(0.2)


def test_a_tenant_sees_only_its_own_puts(pki, farm):
    server, address, _ = farm
    alpha, beta = stub(pki, address, "alpha"), stub(pki, address, "beta")
    alpha.Put(_api.PutRequest(namespace="triton", key="k-alpha", blobs=[_api.blob("a.cubin", b"alpha's bytes")]),
              timeout=30)
    found = alpha.Lookup(_api.LookupRequest(namespace="triton", key="k-alpha"), timeout=30)
    assert found.found and found.entry.blobs[0].data == b"alpha's bytes"
    assert not beta.Lookup(_api.LookupRequest(namespace="triton", key="k-alpha"), timeout=30).found
    assert not server.stub.Lookup(_api.LookupRequest(namespace="triton", key="k-alpha")).found  # nor the local user


def test_a_tenants_compile_is_served_from_kilnds_own_result_not_another_tenants_put(pki, farm):
    _, address, _ = farm
    alpha, beta = stub(pki, address, "alpha"), stub(pki, address, "beta")
    frontend = triton_frontend.run_frontend(kernel_suite.SUITE[0], GPUTarget("cuda", 90, 32))
    # alpha stores a poisoned entry under the kernel's own cache key...
    alpha.Put(_api.PutRequest(namespace="triton", key=frontend.hash,
                              blobs=[_api.blob("add_kernel.cubin", b"not a cubin")]), timeout=30)
    # ...and beta, compiling that kernel, gets what kilnd compiled.
    compiled = beta.Compile(compile_request(frontend), timeout=300)
    assert compiled.WhichOneof("result") == "entry", compiled.error
    cubins = [blob.data for blob in compiled.entry.blobs if blob.name.endswith(".cubin")]
    assert cubins and cubins[0].startswith(b"\x7fELF")
    # kilnd answers the compile, then records it under beta's key.
    deadline = time.monotonic() + 30
    while not (found := beta.Lookup(_api.LookupRequest(namespace="triton", key=frontend.hash), timeout=30)).found:
        assert time.monotonic() < deadline, "beta's compile was never recorded under its key"
        time.sleep(0.1)
    assert b"not a cubin" not in [blob.data for blob in found.entry.blobs]
    poisoned = alpha.Lookup(_api.LookupRequest(namespace="triton", key=frontend.hash), timeout=30)
    assert [blob.data for blob in poisoned.entry.blobs] == [b"not a cubin"]  # alpha poisoned only itself


def test_the_python_client_reaches_the_farm_with_tls_settings_from_the_environment(pki, farm, monkeypatch, tmp_path):
    from kiln.service import paths as _paths
    from kiln.service import connection as _service
    from kiln.service.errors import KilnUnavailable

    _, address, _ = farm
    monkeypatch.setenv("KILN_CA_FILE", str(pki / "farm-ca.pem"))
    monkeypatch.setenv("KILN_CLIENT_CERT", str(pki / "alpha.pem"))
    monkeypatch.setenv("KILN_CLIENT_KEY", str(pki / "alpha.key"))
    as_alpha = _service.Connection(_paths.Endpoint(f"grpcs://{address}"))
    as_alpha.stub.Put(_api.PutRequest(namespace="triton", key="k-client", blobs=[_api.blob("a.cubin", b"a")]),
                      timeout=30)
    assert as_alpha.stub.Lookup(_api.LookupRequest(namespace="triton", key="k-client"), timeout=30).found
    monkeypatch.delenv("KILN_CLIENT_CERT")
    monkeypatch.delenv("KILN_CLIENT_KEY")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("KILN_TOKEN_FILE", str(token_file))
    as_gamma = _service.Connection(_paths.Endpoint(f"grpcs://{address}"))
    assert not as_gamma.stub.Lookup(_api.LookupRequest(namespace="triton", key="k-client"), timeout=30).found
    monkeypatch.setenv("KILN_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(KilnUnavailable, match="KILN_TOKEN_FILE"):
        _service.Connection(_paths.Endpoint(f"grpcs://{address}"))
    monkeypatch.setenv("KILN_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("KILN_CA_FILE", str(pki / "other-ca.pem"))  # not the CA of kilnd's certificate
    with pytest.raises(KilnUnavailable, match="TLS handshake failed: KILN_CA_FILE"):
        _service.connect(f"grpcs://{address}", autostart=False)


def test_the_kiln_cli_reaches_the_farm_with_tls_settings_from_the_environment(pki, farm, tmp_path):
    import os

    _, address, _ = farm
    kiln = [str(BUILD / "client" / "cpp" / "kiln"), "--endpoint", f"grpcs://{address}"]
    env = dict(os.environ, KILN_CA_FILE=str(pki / "farm-ca.pem"))
    anonymous = subprocess.run([*kiln, "stats"], env=env, capture_output=True, text=True, timeout=60)
    assert anonymous.returncode == 4 and "KILN_CLIENT_CERT" in anonymous.stderr, anonymous.stderr
    env.update(KILN_CLIENT_CERT=str(pki / "beta.pem"), KILN_CLIENT_KEY=str(pki / "beta.key"))
    blob = tmp_path / "k.cubin"
    blob.write_bytes(b"beta's cubin")
    subprocess.run([*kiln, "put", "triton", "k-cli", f"k.cubin={blob}"], env=env, check=True, timeout=60)
    subprocess.run([*kiln, "get", "triton", "k-cli", "-o", str(tmp_path / "out")], env=env, check=True, timeout=60)
    assert (tmp_path / "out" / "k.cubin").read_bytes() == b"beta's cubin"
    missing = subprocess.run([*kiln, "stats"], env=dict(env, KILN_CA_FILE=str(tmp_path / "none.pem")),
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 3 and "KILN_CA_FILE" in missing.stderr, missing.stderr


def remote_client_env(pki, address, tmp_path, tenant):
    """A Triton program on another machine, whose kiln client reaches the farm over TLS."""
    env = hermetic.stock_env()
    return dict(env, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"grpcs://{address}",
                KILN_CA_FILE=str(pki / "farm-ca.pem"), KILN_CLIENT_CERT=str(pki / f"{tenant}.pem"),
                KILN_CLIENT_KEY=str(pki / f"{tenant}.key"), TRITON_CACHE_DIR=str(tmp_path / "triton-cache"),
                KILN_FILES_DIR=str(tmp_path / "kiln-files"))


def test_a_remote_client_compiles_the_suite_over_tls_as_stock_does_and_gets_launchers_built_by_the_farm(
        pki, farm, tmp_path, stock_suite, libcuda_dir):  # noqa: F811
    server, address, _ = farm
    env = remote_client_env(pki, address, tmp_path, "beta")
    # KILN_STRICT: any call the farm refused would have failed the program.
    result = probe_json(run_probe(env, "suite"))
    assert result["kernels"] == stock_suite
    before = server.stats()
    launcher = probe_json(run_probe(dict(env, LD_LIBRARY_PATH=str(libcuda_dir)), "launcher", str(libcuda_dir)))
    assert launcher["launch"] is True
    # The farm built the module (the client has no build of its own to fall back on in strict mode).
    after = server.stats()
    assert after.launcher_builds + after.launcher_cache_hits > before.launcher_builds + before.launcher_cache_hits


def remote_launcher_request(source, origin):
    from triton.runtime.cache import triton_key

    return _api.BuildLauncherRequest(
        module_name="__triton_launcher", c_source=source,
        python_abi=_api.PythonAbi(version="%d.%d" % sys.version_info[:2], abiflags=getattr(sys, "abiflags", ""),
                                  ext_suffix=sysconfig.get_config_var("EXT_SUFFIX"),
                                  platform=sysconfig.get_platform(), include_dir="/client/python/include"),
        include_dirs=["/client/include"], library_dirs=["/client/lib"], libraries=["libcuda.so.1"],
        triton_key=triton_key(), origin=origin)


LAUNCHER_ARGS = ({(4,): 1024}, {0: "*fp32", 1: "*fp32", 2: "*fp32", 3: "i32", 4: "constexpr"}, None)


def test_the_farm_compiles_no_c_a_remote_client_wrote_and_says_what_it_needs(pki, farm, tmp_path):
    server, address, _ = farm
    beta = stub(pki, address, "beta")
    generated = nvidia_driver.make_launcher(*LAUNCHER_ARGS)
    origin = _api.LauncherOrigin(make_launcher_args=repr(LAUNCHER_ARGS))
    built = beta.BuildLauncher(remote_launcher_request(generated, origin), timeout=120)
    assert built.WhichOneof("result") == "module", built.error
    assert built.module.data.startswith(b"\x7fELF")
    # C that Triton did not generate: one that would hand over this machine's files ...
    leak = '#include "/etc/passwd"\n' + generated
    for request in (remote_launcher_request(leak, None), remote_launcher_request(leak, origin)):
        refused = refusal(lambda: beta.BuildLauncher(request, timeout=120))
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "generated" in refused.details(), refused.details()
    # ... arguments that are code, not values, are never run ...
    marker = tmp_path / "ran"
    code = _api.LauncherOrigin(make_launcher_args=f"__import__('pathlib').Path({str(marker)!r}).touch()")
    refused = refusal(lambda: beta.BuildLauncher(remote_launcher_request(generated, code), timeout=120))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and "makes no launcher" in refused.details()
    assert not marker.exists()
    # ... and what the farm lacks is named.
    other_python = remote_launcher_request(generated, origin)
    other_python.python_abi.version, other_python.python_abi.ext_suffix = "3.99", ".cpython-399-x86_64-linux-gnu.so"
    refused = refusal(lambda: beta.BuildLauncher(other_python, timeout=120))
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "Register a toolchain" in refused.details() and "3.99" in refused.details()
    unknown_triton = remote_launcher_request(generated, origin)
    unknown_triton.triton_key = "0" * 64
    refused = refusal(lambda: beta.BuildLauncher(unknown_triton, timeout=120))
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert server.stub.GetStats(_api.GetStatsRequest()).launcher_builds >= 1  # still serving


def inductor_module_that_touches(marker):
    """A kernel module as inductor's would be named, whose import leaves `marker`."""
    return f"import pathlib\npathlib.Path({str(marker)!r}).touch()\ntriton_poi_fused_0 = None\n"


def test_the_farm_runs_no_kernel_module_a_remote_client_sent(pki, farm, tmp_path):
    """CompileInductorKernel imports the caller's Python module in a worker:
    kilnd serves it to its own user only, never to a tenant (test_inductor_threads.py
    compiles real modules)."""
    server, address, _ = farm
    marker = tmp_path / "ran"
    request = _api.CompileInductorKernelRequest(
        triton_key=server.stub.ListToolchains(_api.ListToolchainsRequest()).toolchains[0].triton_key,
        kernel_name="triton_poi_fused_0", source=inductor_module_that_touches(marker),
        inductor_cache_dir=str(tmp_path / "inductor"))
    refused = refusal(lambda: stub(pki, address, "beta").CompileInductorKernel(request, timeout=60))
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "own user" in refused.details(), refused.details()
    assert not marker.exists()
    # kilnd's own user, on its local socket, is served: this toolchain has no
    # torch to load the module with, and the answer says so.
    answer = server.stub.CompileInductorKernel(request, timeout=120)
    assert answer.WhichOneof("result") == "error" and "torch" in answer.error.message, answer


def test_a_tenant_storing_past_its_cap_evicts_only_its_own_entries(pki, tmp_path):
    import random

    config = tmp_path / "kilnd.conf"
    config.write_text(f"tcp_listen = 127.0.0.1:0\ntls_cert = {pki / 'server.pem'}\ntls_key = {pki / 'server.key'}\n"
                      f"tls_client_ca = {pki / 'farm-ca.pem'}\ntenant_max_size = 1MiB\nzstd_level = 0\n")
    server = Kilnd(tmp_path / "kilnd", f"--config={config}")
    try:
        address = server.tcp_address()
        alpha, beta = stub(pki, address, "alpha"), stub(pki, address, "beta")
        rng = random.Random(7)

        def put(client, key):
            client.Put(_api.PutRequest(namespace="triton", key=key, blobs=[_api.blob("k.cubin", rng.randbytes(100_000))]),
                       timeout=30)

        def found(client, key):
            return client.Lookup(_api.LookupRequest(namespace="triton", key=key), timeout=30).found

        put(beta, "beta-early")  # the least recently used entry of the whole cache
        for i in range(30):  # 3 MB: three times alpha's cap
            put(alpha, f"alpha-{i}")
        deadline = time.monotonic() + 30
        while server.stats().evictions == 0:  # not a lookup: that would make the entry recently used
            assert time.monotonic() < deadline, "alpha's entries were never evicted"
            time.sleep(0.2)
        assert not found(alpha, "alpha-0")
        assert found(beta, "beta-early")
        assert found(alpha, "alpha-29")
        assert sum(found(alpha, f"alpha-{i}") for i in range(30)) <= 10
    finally:
        server.stop()


def test_a_tenant_flooding_the_farm_delays_only_itself(pki, farm):
    """The farm runs one compile of a tenant at a time (tenant_compiles, here
    half of its one worker): alpha queues five kernels, then beta asks for
    one, and beta's is done right after alpha's first, not after all five."""
    from concurrent.futures import ThreadPoolExecutor

    server, address, _ = farm
    alpha, beta = stub(pki, address, "alpha"), stub(pki, address, "beta")
    target = GPUTarget("cuda", 90, 32)
    flood = [triton_frontend.run_frontend(case, target) for case in kernel_suite.SUITE[9:14]]
    asked = triton_frontend.run_frontend(kernel_suite.SUITE[3], GPUTarget("cuda", 80, 32))
    finished = []

    def compile_as(client, name, frontend):
        response = client.Compile(compile_request(frontend), timeout=300)
        assert response.WhichOneof("result") == "entry", response.error
        finished.append(name)

    with ThreadPoolExecutor(6) as pool:
        flooding = [pool.submit(compile_as, alpha, f"alpha{i}", frontend) for i, frontend in enumerate(flood)]
        deadline = time.monotonic() + 60
        while server.stats().tenant_compiles_waiting < 3:  # alpha's are queued at kilnd
            assert time.monotonic() < deadline and not all(f.done() for f in flooding), finished
            time.sleep(0.01)
        beta_done = pool.submit(compile_as, beta, "beta", asked)
        for future in [*flooding, beta_done]:
            future.result()
    assert finished.index("beta") <= 2, f"beta waited behind alpha's queue: {finished}"


# HTTP/2's client preface, then an empty SETTINGS frame: what a client sends before its first call.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def tls_kilnd(pki, root, config=""):
    """A farm kilnd (TLS, client certificates of farm-ca) with `config` lines added, and its address."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "kilnd.conf"
    path.write_text(f"tcp_listen = 127.0.0.1:0\ntls_cert = {pki / 'server.pem'}\n"
                    f"tls_key = {pki / 'server.key'}\ntls_client_ca = {pki / 'farm-ca.pem'}\n" + config)
    server = Kilnd(root / "kilnd", f"--config={path}")
    return server, server.tcp_address()


def silent_peer(pki, address):
    """A peer that completes TLS and HTTP/2's preface, then makes no call."""
    import socket
    import ssl

    context = ssl.create_default_context(cafile=str(pki / "farm-ca.pem"))
    context.set_alpn_protocols(["h2"])
    host, port = address.rsplit(":", 1)
    peer = context.wrap_socket(socket.create_connection((host, int(port)), timeout=10), server_hostname=host)
    peer.sendall(HTTP2_PREFACE)
    return peer


def closed_at(connection, deadline):
    """When kilnd ended `connection` (time.monotonic()), reading what it sends
    meanwhile; None if it was still open at `deadline`."""
    import socket
    import ssl

    while True:
        connection.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not connection.recv(65536):
                return time.monotonic()
        except socket.timeout:
            return None
        except (ConnectionError, ssl.SSLError):  # a reset, or TLS cut short
            return time.monotonic()


IDLE_SECONDS = 3


def test_peers_that_connect_and_never_call_are_closed_within_the_idle_limit_while_a_client_is_served(pki, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    server, address = tls_kilnd(pki, tmp_path, f"tcp_idle_seconds = {IDLE_SECONDS}\n")
    peers = []
    try:
        peers += [silent_peer(pki, address) for _ in range(50)]
        connected = time.monotonic()  # every peer's idle time started before this
        alpha = stub(pki, address, "alpha")
        served = 0
        with ThreadPoolExecutor(len(peers)) as pool:
            closes = [pool.submit(closed_at, peer, connected + IDLE_SECONDS + 5) for peer in peers]
            while not all(close.done() for close in closes):
                alpha.GetStats(_api.GetStatsRequest(), timeout=10)  # raises if alpha is not served
                served += 1
                time.sleep(0.1)
        after = [close.result() - connected if close.result() else None for close in closes]
        assert None not in after, f"{after.count(None)} of 50 peers still connected after {IDLE_SECONDS + 5} s"
        # gRPC's timer fires within milliseconds; a second of slack for a loaded machine.
        assert max(after) < IDLE_SECONDS + 1, f"the last closed {max(after):.2f} s after the peers connected"
        assert served >= 10
        assert alpha.GetStats(_api.GetStatsRequest(), timeout=10).uptime_seconds > 0
    finally:
        for peer in peers:
            peer.close()
        server.stop()


def test_connections_past_the_cap_are_closed_at_once_and_the_listener_accepts_again_once_some_go(pki, tmp_path):
    import socket

    server, address = tls_kilnd(pki, tmp_path, "tcp_max_connections = 5\ntcp_idle_seconds = 4\n")
    host, port = address.rsplit(":", 1)
    connections = []

    def connect():
        connections.append(socket.create_connection((host, int(port)), timeout=10))
        return connections[-1]

    try:
        peers = [silent_peer(pki, address) for _ in range(5)]
        connections += peers
        for _ in range(20):  # a flood of them, each closed before it could start TLS
            started = time.monotonic()
            closed = closed_at(connect(), started + 2)
            assert closed is not None, "a sixth connection was kept open"
            assert closed - started < 0.5
        # Refusals are not calls: the silent peers go after the idle limit, and then a client is served.
        for peer in peers:
            assert closed_at(peer, time.monotonic() + 5) is not None
        alpha = stub(pki, address, "alpha")
        assert alpha.GetStats(_api.GetStatsRequest(), timeout=10).uptime_seconds > 0
        # The listener is whole: it fills to the cap again (alpha's connection
        # is one of the five) and refuses the next.
        connections += [silent_peer(pki, address) for _ in range(4)]
        assert closed_at(connect(), time.monotonic() + 1) is not None
        # One line in kilnd's log, not one per refused connection.
        warnings = [line for line in (server.root / "kilnd.out").read_text().splitlines()
                    if "tcp_max_connections" in line and "refusing" in line]
        assert len(warnings) == 1, warnings
        # The local socket is never capped, and its stats count every refusal.
        assert server.stats().tcp_connections_refused == 21
    finally:
        for connection in connections:
            connection.close()
        server.stop()


def valid_requests():
    """One well-formed request per RPC, the seeds the fuzzer mutates."""
    frontend = triton_frontend.run_frontend(kernel_suite.SUITE[0], GPUTarget("cuda", 90, 32))
    return {
        "Lookup": _api.LookupRequest(namespace="triton", key="k-fuzz"),
        "LookupOrClaim": _api.LookupRequest(namespace="triton", key="k-fuzz", claimant="fuzzer"),
        "Put": _api.PutRequest(namespace="triton", key="k-fuzz", blobs=[_api.blob("k.cubin", b"\x7fELF" * 64)]),
        "RecordHits": _api.RecordHitsRequest(namespace="triton", keys=["k-fuzz"]),
        "Compile": compile_request(frontend),
        "BuildLauncher": remote_launcher_request(nvidia_driver.make_launcher(*LAUNCHER_ARGS),
                                                 _api.LauncherOrigin(make_launcher_args=repr(LAUNCHER_ARGS))),
        "GetStats": _api.GetStatsRequest(),
        "ListToolchains": _api.ListToolchainsRequest(),
        "Evict": _api.EvictRequest(target_bytes=0),
        "Verify": _api.VerifyRequest(),
        "ListEntries": _api.ListEntriesRequest(namespace="triton", limit=10),
        "ListMisses": _api.ListMissesRequest(last=5),
        "CompileInductorKernel": _api.CompileInductorKernelRequest(
            triton_key="0" * 64, kernel_name="triton_poi_fused_0", inductor_cache_dir="/nonexistent",
            source=inductor_module_that_touches("/tmp/kiln-fuzzed-module-ran")),
        "Prewarm": _api.PrewarmRequest(
            namespace="triton", target=_api.Target(backend="cuda", arch="80", warp_size=32),
            recorded=[_api.blob(f"{frontend.name}.source", frontend.ttir.encode()),
                      _api.blob("kiln.key-inputs.json", triton_frontend.key_inputs(
                          kernel_suite.SUITE[0], GPUTarget("cuda", 90, 32)).encode())]),
    }


def mutations(seed, count, rng):
    """`count` requests as bytes: random ones, and the seed with bytes flipped, cut, repeated or inserted."""
    for i in range(count):
        data = bytearray(seed)
        kind = i % 5
        if kind == 0 or not data:
            yield rng.randbytes(rng.randrange(0, 512))
        elif kind == 1:
            for _ in range(rng.randrange(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            yield bytes(data)
        elif kind == 2:
            yield bytes(data[:rng.randrange(len(data))])
        elif kind == 3:
            yield bytes(data + data[:rng.randrange(len(data) + 1)])
        else:
            at = rng.randrange(len(data) + 1)
            yield bytes(data[:at] + rng.randbytes(rng.randrange(1, 64)) + data[at:])


def test_a_thousand_random_and_mutated_requests_per_rpc_get_answers_and_kilnd_keeps_serving(pki, farm):
    """From an identified tenant and from a client with no identity, through TLS:
    every call ends with a status (no hang, no crash), nothing the anonymous
    client sends is admitted, and kilnd serves normally afterwards."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    server, address, _ = farm
    rng = random.Random(1234)
    seeds = valid_requests()
    for tenant in ("alpha", None):
        fuzz_channel = channel(pki, address, tenant)
        codes = {}

        def call(method, payload):
            streaming = method == "LookupOrClaim"
            path = f"/kiln.v1.Kiln/{method}"
            invoke = (fuzz_channel.unary_stream if streaming else fuzz_channel.unary_unary)(path)
            try:
                result = invoke(payload, timeout=60)
                if streaming:
                    # A granted claim lasts while its stream is open: the first
                    # answer is the verdict, and a real client that got a claim
                    # closes the stream once it has compiled.
                    next(result, None)
                    result.cancel()
                return "OK"
            except grpc.RpcError as error:
                assert error.code() != grpc.StatusCode.DEADLINE_EXCEEDED, f"{method} hung"
                if error.code() == grpc.StatusCode.INVALID_ARGUMENT and "does not parse" in error.details():
                    return "UNPARSED"  # never reached a handler (malformed_requests.h)
                return "OK" if error.code() == grpc.StatusCode.CANCELLED else error.code().name

        with ThreadPoolExecutor(16) as pool:
            for method, seed in seeds.items():
                payloads = list(mutations(seed.SerializeToString(), 1000, rng))
                codes[method] = set(pool.map(lambda payload, m=method: call(m, payload), payloads))
        if tenant is None:
            # Refused by kilnd, or before authentication when the bytes do not parse.
            assert all(found <= {"UNAUTHENTICATED", "UNPARSED"} and "UNAUTHENTICATED" in found
                       for found in codes.values()), codes
        else:
            # Maintenance and exports stay with kilnd's local user, however the request is bent.
            assert "OK" not in codes["Evict"] | codes["Verify"] | codes["ListEntries"], codes
            assert codes["CompileInductorKernel"] <= {"PERMISSION_DENIED", "UNPARSED"}, codes
            assert "UNAVAILABLE" not in set().union(*codes.values()), codes
        fuzz_channel.close()
    assert server.process.poll() is None, "kilnd died"
    alpha = stub(pki, address, "alpha")
    alpha.Put(_api.PutRequest(namespace="triton", key="after-fuzz", blobs=[_api.blob("a.cubin", b"still here")]),
              timeout=30)
    assert alpha.Lookup(_api.LookupRequest(namespace="triton", key="after-fuzz"), timeout=30).entry.blobs[0].data == \
        b"still here"
