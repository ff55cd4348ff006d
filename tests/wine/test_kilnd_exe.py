"""The Windows release zip (scripts/package-windows) and the kilnd.exe and
kiln.exe inside it, under Wine: kilnd.exe on its per-user defaults
(%LOCALAPPDATA%\\kiln, a 127.0.0.1 endpoint file with a token), kiln.exe
reaching it through that file."""

import base64
import hashlib
import json
import os
import re
import ssl
import struct
import subprocess
import time
import zipfile

import pytest
from kiln.service import api as _api
from kiln.service import paths as _paths
from kiln.service import connection as _service

import registry_server
import token_server
from bundle_files import publisher_key, write_bundle
from conftest import linux_path, local_app_data, new_wine_prefix, runner, start_persistent_wineserver, windows_path


@pytest.fixture(scope="module")
def wine(tmp_path_factory):
    """A Wine prefix of this module's own, so that the per-user defaults are new."""
    env = new_wine_prefix(tmp_path_factory, "wineprefix")
    yield env
    subprocess.run(["wineserver", "-k"], env=env, capture_output=True)


def trusted_bundle_keys(wine):
    """The file kilnd.exe's config names as trusted_bundle_keys (read at each import)."""
    return local_app_data(wine) / "kiln" / "trusted-bundle-keys.pem"


def bundle_shelf(wine):
    """The directory kilnd.exe's config subscribes to (bundle_sources), checked every 2 s."""
    return local_app_data(wine) / "kiln-shelf"


@pytest.fixture(scope="module")
def kilnd(wine, binaries):
    # Every other setting is its default.
    config = local_app_data(wine) / "kiln" / "kilnd.conf"
    config.parent.mkdir(parents=True, exist_ok=True)
    bundle_shelf(wine).mkdir(parents=True, exist_ok=True)
    config.write_text(f"trusted_bundle_keys = {windows_path(trusted_bundle_keys(wine))}\r\n"
                      f"bundle_sources = {windows_path(bundle_shelf(wine))}\r\nbundle_refresh = 2s\r\n")
    process = subprocess.Popen(["wine", str(binaries[0])], env=wine, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    endpoint_file = local_app_data(wine) / "kiln" / "run" / "kilnd.endpoint"
    deadline = time.monotonic() + 60
    while not endpoint_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"kilnd.exe wrote no {endpoint_file}:\n{process.stdout.read().decode(errors='replace')}")
        time.sleep(0.2)
    yield endpoint_file
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def kiln(wine, binaries):
    """Runs the zip's kiln.exe, which finds kilnd through its endpoint file."""
    return runner(wine, binaries[1])


def test_the_zip_holds_what_the_installer_installs(release):
    archive, _ = release
    with zipfile.ZipFile(archive) as opened:
        names = sorted(name.removeprefix("kiln-windows-x64/") for name in opened.namelist() if not name.endswith("/"))
    wheel = next(name for name in names if name.startswith("kiln_triton-") and name.endswith("-py3-none-any.whl"))
    # CPython's headers for launcher builds in an embedded Python, with their license.
    headers = [name for name in names if name.startswith("python/")]
    assert "python/3.13/include/Python.h" in headers and "python/3.13/include/pyconfig.h" in headers
    assert "python/3.13/LICENSE" in headers
    assert all(name.startswith("python/3.13/include/") or name in ("python/3.13/LICENSE", "python/3.13/SOURCE")
               for name in headers), headers
    assert [name for name in names if name not in headers] == sorted(
        ["kilnd.exe", "kiln.exe", "kiln_worker.py", "install-kiln.ps1", "README.md", wheel])


def test_kilnd_serves_on_its_per_user_defaults(wine, kilnd, kiln):
    target, token = kilnd.read_text().splitlines()[:2]
    assert target.startswith("127.0.0.1:") and len(token) >= 32
    assert "SERVING" in kiln("health", "--wait", "30").stdout
    # Its data lives in %LOCALAPPDATA%\kiln: the SQLite index is there.
    assert (local_app_data(wine) / "kiln" / "kiln.db").exists()


def test_put_get_stats_verify_and_gc_through_the_endpoint_file(kilnd, kiln, tmp_path):
    blob = tmp_path / "kernel.cubin"
    blob.write_bytes(os.urandom(200_000))
    kiln("put", "tests", "key-1", f"kernel.cubin={windows_path(blob)}")
    out = tmp_path / "out"
    kiln("get", "tests", "key-1", "-o", windows_path(out))
    assert (out / "kernel.cubin").read_bytes() == blob.read_bytes()
    assert kiln("get", "tests", "no-such-key", check=False).returncode == 1  # a miss
    stats = kiln("stats").stdout
    assert int(re.search(r"(\d+) puts", stats).group(1)) >= 1, stats
    assert kiln("verify").returncode == 0
    assert kiln("gc", "0").returncode == 0
    assert kiln("get", "tests", "key-1", check=False).returncode == 1  # evicted


def test_a_call_without_the_token_is_refused(kilnd, kiln):
    target = kilnd.read_text().splitlines()[0]
    refused = kiln("--endpoint", target, "stats", check=False)
    assert refused.returncode != 0
    assert "access token" in refused.stderr, refused.stderr



def test_files_another_process_holds_open_are_left_and_reused_not_fatal(wine, kilnd, kiln, hold_open, tmp_path):
    """A virus scanner or backup agent holding a cache file open must not stop
    kilnd: eviction leaves the file, a new put of the same content reuses it,
    and the next eviction after the holder lets go deletes it."""
    content = os.urandom(300_000)
    blob = tmp_path / "held.cubin"
    blob.write_bytes(content)
    kiln("put", "tests", "held", f"held.cubin={windows_path(blob)}")
    connection = _service.Connection(_paths.read_endpoint_file(kilnd))
    found = connection.stub.Lookup(_api.LookupRequest(namespace="tests", key="held", as_files=True), timeout=30)
    assert found.found
    served = linux_path(wine, found.entry.blobs[0].path)
    digest = hashlib.sha256(content).hexdigest()
    stored = local_app_data(wine) / "kiln" / "blobs" / digest[:2] / digest
    assert served.read_bytes() == content and stored.exists()

    holder = hold_open(wine, served, stored)
    try:
        assert kiln("gc", "0").returncode == 0
        assert kiln("get", "tests", "held", check=False).returncode == 1  # evicted, though its files stay
        assert stored.exists(), "Windows refuses to delete a file held open without FILE_SHARE_DELETE"
        kiln("put", "tests", "held", f"held.cubin={windows_path(blob)}")
        out = tmp_path / "out"
        kiln("get", "tests", "held", "-o", windows_path(out))
        assert (out / "held.cubin").read_bytes() == content
        assert "SERVING" in kiln("health").stdout
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert kiln("verify").returncode == 0
    assert kiln("gc", "0").returncode == 0
    assert not stored.exists() and not served.exists()


def test_kiln_exe_starts_the_kilnd_exe_beside_it_when_none_serves(tmp_path_factory, binaries, tmp_path):
    """No kilnd.exe running: `kiln.exe put` starts the one beside it (the zip's
    layout), detached, and waits for its endpoint file; `stats` never starts one."""
    env = new_wine_prefix(tmp_path_factory, "autostart")
    start_persistent_wineserver(env)
    endpoint_file = local_app_data(env) / "kiln" / "run" / "kilnd.endpoint"
    blob = tmp_path / "kernel.cubin"
    blob.write_bytes(os.urandom(1000))
    # Wine hands a program's Unix stderr on to every process it starts, the
    # detached kilnd.exe too: a file, not a pipe this test would wait on.
    errors = tmp_path / "kiln.err"

    def kiln(*args):
        with open(errors, "w") as stderr:
            result = subprocess.run(["wine", str(binaries[1]), *args], env=env, stdout=subprocess.PIPE,
                                    stderr=stderr, text=True, timeout=120)
        return result.returncode, result.stdout, errors.read_text()

    try:
        assert kiln("stats")[0] == 3 and not endpoint_file.exists()
        code, out, err = kiln("put", "tests", "started", f"kernel.cubin={windows_path(blob)}")
        assert code == 0 and "started one" in err, err
        assert endpoint_file.exists()
        code, out, err = kiln("get", "tests", "started")
        assert code == 0 and "kernel.cubin" in out and "started one" not in err, err
    finally:
        subprocess.run(["wineserver", "-k"], env=env, capture_output=True)


def test_a_bundle_signed_on_linux_imports_from_a_trusted_key_and_brings_nothing_otherwise(wine, kilnd, kiln,
                                                                                          tmp_path):
    """A bundle made and signed on Linux (openssl, the Linux layout of the
    format) imported by kiln.exe into kilnd.exe: its entries when kilnd.exe
    trusts the key, none while it does not (read at each import, no restart)."""
    private, public, key_id = publisher_key(tmp_path)
    cubin = os.urandom(5000)
    bundle = tmp_path / "linux.kilnbundle"
    write_bundle(bundle, [("wine-bundle", "from-linux", {"k.cubin": cubin}),
                          ("triton-files", "ab" * 32 + "/__triton_launcher.pyd", {"__triton_launcher.pyd": b"MZ"})],
                 signer=private)
    trusted_bundle_keys(wine).write_text("")
    refused = kiln("import", windows_path(bundle), check=False)
    assert refused.returncode != 0 and "holds no PEM public key" in refused.stderr, refused

    _, other_public, _ = publisher_key(tmp_path, "other")
    trusted_bundle_keys(wine).write_text(other_public.read_text())
    untrusted = kiln("import", windows_path(bundle))
    assert f"signed by key {key_id}, which kilnd does not trust" in untrusted.stdout, untrusted.stdout
    assert kiln("get", "wine-bundle", "from-linux", check=False).returncode == 1

    trusted_bundle_keys(wine).write_text(other_public.read_text() + public.read_text())
    imported = kiln("import", windows_path(bundle))
    assert f"signed by key {key_id}, which kilnd trusts" in imported.stdout, imported.stdout
    assert "stored 1," in imported.stdout and "refused 1: native code" in imported.stdout, imported.stdout
    out = tmp_path / "out"
    kiln("get", "wine-bundle", "from-linux", "-o", windows_path(out))
    assert (out / "k.cubin").read_bytes() == cubin


def test_kilnd_exe_imports_a_bundle_put_in_the_directory_it_subscribes_to(wine, kilnd, kiln, tmp_path):
    """A per-user kilnd.exe with bundle_sources naming a directory (C:\\...)
    imports a signed bundle put there within a refresh, as a ComfyUI user's
    kilnd.exe subscribed to a shared drive would."""
    private, public, key_id = publisher_key(tmp_path)
    trusted_bundle_keys(wine).write_text(public.read_text())
    cubin = os.urandom(6000)
    staged = tmp_path / "shelved.kilnbundle"
    write_bundle(staged, [("wine-shelf", "subscribed", {"k.cubin": cubin})], signer=private)
    os.replace(staged, bundle_shelf(wine) / "shelved.kilnbundle")
    deadline = time.monotonic() + 60
    while kiln("get", "wine-shelf", "subscribed", check=False).returncode != 0:
        assert time.monotonic() < deadline, kiln("stats").stdout
        time.sleep(1)
    out = tmp_path / "out"
    kiln("get", "wine-shelf", "subscribed", "-o", windows_path(out))
    assert (out / "k.cubin").read_bytes() == cubin
    stats = kiln("stats").stdout
    assert f"bundle source {windows_path(bundle_shelf(wine))}: 1 of 1 files" in stats, stats
    assert f"signed by trusted key {key_id}; 1 stored" in stats, stats


def trust_in_the_windows_certificate_store(wine, ca_pem):
    """Adds the CA to the prefix's machine Root store, as certutil -addstore
    Root would: its registry key, named by the certificate's SHA-1, holds the
    DER certificate as a serialized property (CERT_CERT_PROP_ID, 32)."""
    der = ssl.PEM_cert_to_DER_cert(ca_pem.read_text())
    blob = struct.pack("<III", 32, 1, len(der)) + der
    key = ("HKLM\\Software\\Microsoft\\SystemCertificates\\Root\\Certificates\\"
           + hashlib.sha1(der).hexdigest().upper())
    subprocess.run(["wine", "reg", "add", key, "/v", "Blob", "/t", "REG_BINARY", "/d", blob.hex(), "/f"],
                   env=wine, check=True, capture_output=True, timeout=120)


def test_kiln_exe_pushes_through_a_token_service_and_pulls_into_kilnd_exe_trusting_the_windows_certificate_store(
        wine, kilnd, binaries, tmp_path):
    """kiln.exe speaks the registry's API through libcurl over Schannel. With
    no SSL_CERT_FILE it trusts the Windows certificate store, where the test
    puts its CA; a signed bundle is pushed with docker's login traded for a
    token, and pulled by digest into kilnd.exe. Wine's Schannel leaves a
    certificate unchecked when the system is to check it (Windows' checks it
    against the store), so the refusal is shown where libcurl checks the chain
    itself: SSL_CERT_FILE naming another CA."""
    registry = registry_server.start(tmp_path / "registry", token=True)
    try:
        address = registry.address.replace("127.0.0.1", "localhost")
        private, public, key_id = publisher_key(tmp_path)
        cubin = os.urandom(7000)
        bundle = tmp_path / "pushed.kilnbundle"
        write_bundle(bundle, [("wine-registry", "pulled", {"k.cubin": cubin})], signer=private)
        trusted_bundle_keys(wine).write_text(public.read_text())
        login = base64.b64encode(f"{token_server.USER}:{token_server.PASSWORD}".encode()).decode()
        docker = tmp_path / "docker"
        docker.mkdir()
        (docker / "config.json").write_text(json.dumps({"auths": {address: {"auth": login}}}))
        environment = {name: value for name, value in wine.items() if name not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
        kiln = runner(dict(environment, DOCKER_CONFIG=windows_path(docker)), binaries[1])

        (tmp_path / "other").mkdir()
        other_ca = registry_server.make_ca(tmp_path / "other")
        untrusted = runner(dict(environment, SSL_CERT_FILE=windows_path(other_ca), DOCKER_CONFIG=windows_path(docker)),
                           binaries[1])("push", windows_path(bundle), f"{address}/wine/kernels:v1", check=False)
        assert untrusted.returncode != 0 and "certificate is not trusted" in untrusted.stderr, untrusted
        # Schannel has no directory of CAs: refused, not left unread.
        directory = runner(dict(environment, SSL_CERT_DIR=windows_path(tmp_path / "other"),
                                DOCKER_CONFIG=windows_path(docker)),
                           binaries[1])("push", windows_path(bundle), f"{address}/wine/kernels:v1", check=False)
        assert directory.returncode != 0 and "cannot read a directory of CAs" in directory.stderr, directory

        trust_in_the_windows_certificate_store(wine, registry.ca)
        pushed = kiln("push", windows_path(bundle), f"{address}/wine/kernels:v1")
        assert f"signed by key {key_id}" in pushed.stdout, pushed.stdout
        assert registry.tokens.scopes_asked()[-1] == ["repository:wine/kernels:pull,push"]
        digest = pushed.stdout.strip().rsplit("@", 1)[1]
        pulled = kiln("pull", f"{address}/wine/kernels@{digest}")
        assert "which kilnd trusts" in pulled.stdout and "stored 1," in pulled.stdout, pulled.stdout
        out = tmp_path / "out"
        kiln("get", "wine-registry", "pulled", "-o", windows_path(out))
        assert (out / "k.cubin").read_bytes() == cubin
    finally:
        registry.stop()
