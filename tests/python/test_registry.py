"""Bundles through an OCI registry (`kiln push`, `kiln pull`): Debian's
docker-registry on loopback, with TLS (certificates this test makes) and
htpasswd logins; a real kilnd imports what is pulled; skopeo reads what Kiln
pushed."""

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

import registry_server
from bundle_files import publisher_key, write_bundle
from conftest import Kilnd
from test_bundle import KILN, import_counts, trusting

@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    server = registry_server.start(tmp_path_factory.mktemp("registry"))
    yield server
    server.stop()


def kiln(env, *args, kilnd=None):
    endpoint = ["--endpoint", f"unix:{kilnd.socket}"] if kilnd else ["--no-autostart"]
    return subprocess.run([str(KILN), *endpoint, *map(str, args)], capture_output=True, text=True, timeout=600,
                          env=env)


def test_a_signed_bundle_pushed_then_pulled_by_tag_and_by_digest_imports_and_a_tampered_layer_is_refused(
        tmp_path, registry):
    address, ca = registry.address, registry.ca
    private, public, key_id = publisher_key(tmp_path)
    blobs = {f"entry{i}": os.urandom(2000 + i) for i in range(5)}
    bundle = tmp_path / "kernels.kilnbundle"
    write_bundle(bundle, [("triton", key, {"k.cubin": data}) for key, data in blobs.items()], signer=private)
    env = dict(os.environ, SSL_CERT_FILE=str(ca),
               DOCKER_CONFIG=str(registry_server.docker_config(tmp_path / "docker", address)))
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
        ["skopeo", "inspect", "--raw", "--creds", f"{registry_server.USER}:{registry_server.PASSWORD}",
         "--cert-dir", str(skopeo_certs), f"docker://{reference}"], check=True, capture_output=True, text=True, timeout=120).stdout)
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
        layer_file = registry.layer_file(layer["digest"])
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
    address, ca = registry.address, registry.ca
    bundle = tmp_path / "one.kilnbundle"
    write_bundle(bundle, [("triton", "one", {"k.cubin": b"cubin"})])
    env = dict(os.environ, SSL_CERT_FILE=str(ca), DOCKER_CONFIG=str(tmp_path / "no-docker"))
    env.pop("KILN_REGISTRY_TOKEN", None)
    refused = kiln(env, "push", bundle, f"{address}/team/one:v1")
    assert refused.returncode != 0 and f"asks for a login: `docker login {address}`" in refused.stderr, refused.stderr
    wrong = dict(env, DOCKER_CONFIG=str(registry_server.docker_config(tmp_path / "wrong", address, password="nope")))
    refused = kiln(wrong, "pull", f"{address}/team/one:v1", "-o", tmp_path / "x.kilnbundle")
    assert refused.returncode != 0 and "refused the credentials" in refused.stderr, refused.stderr
    untrusted_ca = dict(env, SSL_CERT_FILE="/dev/null")
    refused = kiln(untrusted_ca, "push", bundle, f"{address}/team/one:v1")
    assert refused.returncode != 0 and "certificate is not trusted" in refused.stderr, refused.stderr
    assert "SSL_CERT_FILE" in refused.stderr
    bad = kiln(env, "pull", "not-a-reference", "-o", tmp_path / "x.kilnbundle")
    assert bad.returncode == 2 and "REGISTRY/REPOSITORY:TAG" in bad.stderr
