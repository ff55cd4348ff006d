"""Bundles through an OCI registry (`kiln push`, `kiln pull`): Debian's
docker-registry on loopback, with TLS (certificates this test makes) and
htpasswd logins; a real kilnd imports what is pulled; skopeo reads what Kiln
pushed."""

import base64
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import Kilnd
from bundle_files import publisher_key, write_bundle
from test_bundle import KILN, import_counts, trusting
from test_remote_tls import new_ca, new_key_and_request, sign
from test_shared_cache import free_port

USER, PASSWORD = "publisher", "s3cret-pass"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """(HOST:PORT, its storage directory, the CA file) of a docker-registry
    serving TLS for 127.0.0.1 and asking for USER's login."""
    directory = tmp_path_factory.mktemp("registry")
    new_ca(directory, "registry-ca")
    new_key_and_request(directory, "registry", "/CN=127.0.0.1")
    sign(directory, "registry-ca", "registry", "subjectAltName=IP:127.0.0.1\n")
    htpasswd = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], check=True, capture_output=True, text=True)
    (directory / "htpasswd").write_text(htpasswd.stdout)
    port = free_port()
    storage = directory / "storage"
    (directory / "config.yml").write_text(f"""version: 0.1
log: {{level: warn}}
storage: {{filesystem: {{rootdirectory: {storage}}}, delete: {{enabled: true}}}}
http: {{addr: "127.0.0.1:{port}", tls: {{certificate: {directory / 'registry.pem'}, key: {directory / 'registry.key'}}}}}
auth: {{htpasswd: {{realm: kiln-test, path: {directory / 'htpasswd'}}}}}
""")
    log = open(directory / "registry.log", "w")
    process = subprocess.Popen(["docker-registry", "serve", str(directory / "config.yml")], stdout=log,
                               stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        probe = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-brief"],
                               input="", capture_output=True, text=True, timeout=10)
        if probe.returncode == 0:
            break
        assert process.poll() is None, (directory / "registry.log").read_text()
        time.sleep(0.2)
    yield f"127.0.0.1:{port}", storage, directory / "registry-ca.pem"
    process.terminate()
    process.wait(timeout=30)


def docker_config(folder, registry, password=PASSWORD):
    """A $DOCKER_CONFIG as `docker login` leaves it."""
    folder.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {registry: {"auth": auth}}}))
    return folder


def kiln(env, *args, kilnd=None):
    endpoint = ["--endpoint", f"unix:{kilnd.socket}"] if kilnd else ["--no-autostart"]
    return subprocess.run([str(KILN), *endpoint, *map(str, args)], capture_output=True, text=True, timeout=600,
                          env=env)


def test_a_signed_bundle_pushed_then_pulled_by_tag_and_by_digest_imports_and_a_tampered_layer_is_refused(
        tmp_path, registry):
    address, storage, ca = registry
    private, public, key_id = publisher_key(tmp_path)
    blobs = {f"entry{i}": os.urandom(2000 + i) for i in range(5)}
    bundle = tmp_path / "kernels.kilnbundle"
    write_bundle(bundle, [("triton", key, {"k.cubin": data}) for key, data in blobs.items()], signer=private)
    env = dict(os.environ, SSL_CERT_FILE=str(ca), DOCKER_CONFIG=str(docker_config(tmp_path / "docker", address)))
    env.pop("KILN_REGISTRY_TOKEN", None)
    reference = f"{address}/team/kernels:v1"

    pushed = kiln(env, "push", bundle, reference)
    assert pushed.returncode == 0, pushed.stderr
    assert f"(5 entries, signed by key {key_id}" in pushed.stdout, pushed.stdout
    digest = pushed.stdout.strip().rsplit("@", 1)[1]
    assert digest.startswith("sha256:")

    # skopeo, another client, reads the manifest: Kiln's media types, the bundle as its one layer.
    skopeo_certs = tmp_path / "skopeo-certs"  # skopeo's --cert-dir: the registry's CA as ca.crt
    skopeo_certs.mkdir()
    (skopeo_certs / "ca.crt").write_bytes(ca.read_bytes())
    manifest = json.loads(subprocess.run(
        ["skopeo", "inspect", "--raw", "--creds", f"{USER}:{PASSWORD}", "--cert-dir", str(skopeo_certs),
         f"docker://{reference}"], check=True, capture_output=True, text=True, timeout=120).stdout)
    assert manifest["artifactType"] == "application/vnd.kiln.bundle.v1"
    assert manifest["config"]["mediaType"] == "application/vnd.kiln.bundle.config.v1+json"
    [layer] = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.kiln.bundle.v1"
    assert layer["digest"] == "sha256:" + hashlib.sha256(bundle.read_bytes()).hexdigest()
    assert layer["size"] == bundle.stat().st_size

    target = Kilnd(tmp_path / "target", trusting(public))
    try:
        pulled = kiln(env, "pull", reference, kilnd=target)
        assert pulled.returncode == 0, pulled.stderr
        assert f"{reference}@{digest}: 5 entries, signed by key {key_id}, which kilnd trusts" in pulled.stdout
        assert import_counts(pulled.stdout)["stored"] == 5
        got = kiln(env, "get", "triton", "entry3", "-o", tmp_path / "got", kilnd=target)
        assert got.returncode == 0 and (tmp_path / "got" / "k.cubin").read_bytes() == blobs["entry3"]

        by_digest = kiln(env, "pull", f"{address}/team/kernels@{digest}", "-o", tmp_path / "by-digest.kilnbundle")
        assert by_digest.returncode == 0, by_digest.stderr
        assert (tmp_path / "by-digest.kilnbundle").read_bytes() == bundle.read_bytes()
        wrong_digest = "sha256:" + "0" * 64
        refused = kiln(env, "pull", f"{address}/team/kernels@{wrong_digest}", "-o", tmp_path / "wrong.kilnbundle")
        assert refused.returncode != 0 and not (tmp_path / "wrong.kilnbundle").exists()

        # The registry's copy of the layer changed (a byte flipped where it stores it): refused, nothing kept.
        layer_file = storage / "docker" / "registry" / "v2" / "blobs" / "sha256" / layer["digest"][7:9] / \
            layer["digest"][7:] / "data"
        data = bytearray(layer_file.read_bytes())
        data[len(data) // 2] ^= 1
        layer_file.write_bytes(bytes(data))
        tampered = kiln(env, "pull", reference, kilnd=target)
        assert tampered.returncode == 4, tampered  # DATA_LOSS: the registry served other bytes
        assert "tampered with or damaged in the registry; nothing was kept" in tampered.stderr, tampered.stderr
        assert target.stats().entries == 5
        assert not list(Path(tmp_path).glob("*.partial"))
    finally:
        target.stop()


def test_without_a_login_or_with_a_wrong_one_push_and_pull_say_what_to_do(tmp_path, registry):
    address, _, ca = registry
    bundle = tmp_path / "one.kilnbundle"
    write_bundle(bundle, [("triton", "one", {"k.cubin": b"cubin"})])
    env = dict(os.environ, SSL_CERT_FILE=str(ca), DOCKER_CONFIG=str(tmp_path / "no-docker"))
    env.pop("KILN_REGISTRY_TOKEN", None)
    refused = kiln(env, "push", bundle, f"{address}/team/one:v1")
    assert refused.returncode != 0 and f"asks for a login: `docker login {address}`" in refused.stderr, refused.stderr
    wrong = dict(env, DOCKER_CONFIG=str(docker_config(tmp_path / "wrong", address, password="nope")))
    refused = kiln(wrong, "pull", f"{address}/team/one:v1", "-o", tmp_path / "x.kilnbundle")
    assert refused.returncode != 0 and "refused the credentials" in refused.stderr, refused.stderr
    untrusted_ca = dict(env, SSL_CERT_FILE="/dev/null")
    refused = kiln(untrusted_ca, "push", bundle, f"{address}/team/one:v1")
    assert refused.returncode != 0 and "certificate is not trusted" in refused.stderr, refused.stderr
    assert "SSL_CERT_FILE" in refused.stderr
    bad = kiln(env, "pull", "not-a-reference", "-o", tmp_path / "x.kilnbundle")
    assert bad.returncode == 2 and "REGISTRY/REPOSITORY:TAG" in bad.stderr
