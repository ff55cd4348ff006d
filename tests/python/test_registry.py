"""Bundles through an OCI registry (`kiln push`, `kiln pull`): Debian's
docker-registry on loopback, with TLS (certificates this test makes) and
htpasswd logins; a real kilnd imports what is pulled; skopeo reads what Kiln
pushed."""

import base64
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

import hostile_registry
import registry_server
import token_server
from bundle_files import publisher_key, write_bundle
from conftest import Kilnd
from test_bundle import KILN, import_counts, trusting

# kilnd takes outside bytes here: the asan lane runs these against its ASan+UBSan build.
pytestmark = pytest.mark.outside_bytes

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
    assert refused.returncode != 0 and "asks for a login to push to team/one, and none was found" in refused.stderr
    assert f"`docker login {address}`" in refused.stderr, refused.stderr
    wrong = dict(env, DOCKER_CONFIG=str(registry_server.docker_config(tmp_path / "wrong", address, password="nope")))
    refused = kiln(wrong, "pull", f"{address}/team/one:v1", "-o", tmp_path / "x.kilnbundle")
    assert refused.returncode != 0 and "refused the credentials" in refused.stderr, refused.stderr
    untrusted_ca = dict(env, SSL_CERT_FILE="/dev/null")
    refused = kiln(untrusted_ca, "push", bundle, f"{address}/team/one:v1")
    assert refused.returncode != 0 and "certificate is not trusted" in refused.stderr, refused.stderr
    assert "SSL_CERT_FILE" in refused.stderr
    bad = kiln(env, "pull", "not-a-reference", "-o", tmp_path / "x.kilnbundle")
    assert bad.returncode == 2 and "REGISTRY/REPOSITORY:TAG" in bad.stderr


# --- a registry that hands out tokens (Docker Hub's, GHCR's, Quay's, Harbor's way) ---------

@pytest.fixture(scope="module")
def token_registry(tmp_path_factory):
    server = registry_server.start(tmp_path_factory.mktemp("token-registry"), token=True)
    yield server
    server.stop()


def _token_env(tmp_path, registry, **docker):
    """kiln's environment: the test CA, and a $DOCKER_CONFIG with `docker` in it
    (none: no login at all)."""
    env = dict(os.environ, SSL_CERT_FILE=str(registry.ca), DOCKER_CONFIG=str(tmp_path / "no-docker"))
    env.pop("KILN_REGISTRY_TOKEN", None)
    if docker:
        folder = tmp_path / f"docker-{len(list(tmp_path.glob('docker-*')))}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(docker))
        env["DOCKER_CONFIG"] = str(folder)
    return env


def _auth(user, password):
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_a_login_traded_for_a_token_pushes_anyone_pulls_a_public_repository_and_a_private_one_asks_for_a_login(
        tmp_path, token_registry):
    address = token_registry.address
    bundle = tmp_path / "kernels.kilnbundle"
    write_bundle(bundle, [("triton", f"k{i}", {"k.cubin": os.urandom(3000)}) for i in range(3)])
    publisher = _token_env(tmp_path, token_registry,
                           auths={address: _auth(token_server.USER, token_server.PASSWORD)})
    asked_before = len(token_registry.tokens.asked)
    for repository in ("team/kernels", "public/kernels", "private/kernels"):
        pushed = kiln(publisher, "push", bundle, f"{address}/{repository}:v1")
        assert pushed.returncode == 0, pushed.stderr
    # The registry challenges a push's first request (a HEAD) for pull alone:
    # one token for pull and push together serves all of it, asked for once.
    assert token_registry.tokens.scopes_asked()[asked_before:] == [
        [f"repository:{repository}:pull,push"] for repository in ("team/kernels", "public/kernels", "private/kernels")]

    # skopeo, another client, reads the manifest through the same token service.
    certs = tmp_path / "skopeo-certs"
    certs.mkdir()
    (certs / "ca.crt").write_bytes(token_registry.ca.read_bytes())
    manifest = json.loads(subprocess.run(
        ["skopeo", "inspect", "--raw", "--creds", f"{token_server.USER}:{token_server.PASSWORD}", "--cert-dir",
         str(certs), f"docker://{address}/team/kernels:v1"], check=True, capture_output=True, text=True,
        timeout=120).stdout)
    assert manifest["layers"][0]["digest"] == "sha256:" + hashlib.sha256(bundle.read_bytes()).hexdigest()

    anyone = _token_env(tmp_path, token_registry)
    public = kiln(anyone, "pull", f"{address}/public/kernels:v1", "-o", tmp_path / "public.kilnbundle")
    assert public.returncode == 0, public.stderr
    assert (tmp_path / "public.kilnbundle").read_bytes() == bundle.read_bytes()
    private = kiln(anyone, "pull", f"{address}/private/kernels:v1", "-o", tmp_path / "private.kilnbundle")
    assert private.returncode != 0 and not (tmp_path / "private.kilnbundle").exists()
    assert f"{address} asks for a login to pull from private/kernels, and none was found" in private.stderr
    assert f"docker login {address}" in private.stderr and "refused" not in private.stderr, private.stderr


def test_a_login_that_may_only_pull_is_told_it_may_not_push_and_a_wrong_password_is_refused(tmp_path, token_registry):
    address = token_registry.address
    bundle = tmp_path / "one.kilnbundle"
    write_bundle(bundle, [("triton", "one", {"k.cubin": b"cubin"})])
    reader = _token_env(tmp_path, token_registry,
                        auths={address: _auth(token_server.READER, token_server.READER_PASSWORD)})
    refused = kiln(reader, "push", bundle, f"{address}/team/reader-push:v1")
    assert refused.returncode != 0, refused.stdout
    assert f"user {token_server.READER}" in refused.stderr and "may not push to team/reader-push" in refused.stderr
    assert "refused the credentials" not in refused.stderr, refused.stderr

    wrong = _token_env(tmp_path, token_registry, auths={address: _auth(token_server.USER, "nope")})
    refused = kiln(wrong, "push", bundle, f"{address}/team/wrong:v1")
    assert refused.returncode != 0 and f"{address} refused the credentials" in refused.stderr, refused.stderr
    assert f"user {token_server.USER}" in refused.stderr and f"docker login {address}" in refused.stderr


def test_logins_come_from_docker_credential_helpers_and_identity_tokens(tmp_path, token_registry):
    address = token_registry.address
    bundle = tmp_path / "helped.kilnbundle"
    write_bundle(bundle, [("triton", "helped", {"k.cubin": os.urandom(2000)})])
    helpers = token_server.helper_script(tmp_path / "bin", "kilntest", {address: (token_server.USER, token_server.PASSWORD)})
    token_server.helper_script(tmp_path / "bin", "empty", {})
    path = f"{helpers}{os.pathsep}{os.environ['PATH']}"

    # credHelpers names a helper for this registry; credsStore, one for all.
    for docker in ({"credHelpers": {address: "kilntest"}, "credsStore": "empty"}, {"credsStore": "kilntest"}):
        env = dict(_token_env(tmp_path, token_registry, auths={address: {}}, **docker), PATH=path)
        pushed = kiln(env, "push", bundle, f"{address}/private/helped:v1")
        assert pushed.returncode == 0, (docker, pushed.stderr)
        pulled = kiln(env, "pull", f"{address}/private/helped:v1", "-o", tmp_path / "helped-back.kilnbundle")
        assert pulled.returncode == 0 and (tmp_path / "helped-back.kilnbundle").read_bytes() == bundle.read_bytes()

    # The helper keeps nothing for this registry: as with no login at all.
    env = dict(_token_env(tmp_path, token_registry, credsStore="empty"), PATH=path)
    none = kiln(env, "pull", f"{address}/private/helped:v1", "-o", tmp_path / "x.kilnbundle")
    assert none.returncode != 0 and "none was found" in none.stderr, none.stderr
    # A helper that is not there is named, with what to do.
    env = _token_env(tmp_path, token_registry, credsStore="not-installed")
    missing = kiln(env, "pull", f"{address}/private/helped:v1", "-o", tmp_path / "x.kilnbundle")
    assert missing.returncode != 0 and "docker-credential-not-installed cannot be run" in missing.stderr, missing.stderr

    # An identity token (a refresh token that `docker login` kept) is traded through OAuth2's form.
    env = _token_env(tmp_path, token_registry, auths={address: {"identitytoken": token_server.IDENTITY_TOKEN}})
    asked_before = len(token_registry.tokens.asked)
    pulled = kiln(env, "pull", f"{address}/private/helped:v1", "-o", tmp_path / "identity.kilnbundle")
    assert pulled.returncode == 0, pulled.stderr
    assert [method for method, *_ in token_registry.tokens.asked[asked_before:]] == ["POST"]


# --- a registry that breaks the rules (hostile_registry.py) ----------------------------

@pytest.fixture(scope="module")
def hostile(registry):
    server = hostile_registry.HostileRegistry(registry.ca.parent / "server.pem", registry.ca.parent / "server.key")
    yield server
    server.stop()


def hostile_env(tmp_path, registry):
    """A client that trusts the test's CA and has no login."""
    env = dict(os.environ, SSL_CERT_FILE=str(registry.ca), DOCKER_CONFIG=str(tmp_path / "no-docker"))
    env.pop("KILN_REGISTRY_TOKEN", None)
    return env


def refused_pull(env, reference, said, *flags):
    pulled = kiln(env, "pull", reference, *flags)
    assert pulled.returncode != 0 and said in pulled.stderr, pulled.stderr
    assert "Traceback" not in pulled.stderr and len(pulled.stderr) < 2000


@pytest.mark.parametrize("behaviour, said", [
    ("long-header", "longer than 64 KiB"),
    ("endless-headers", "more than 256 header lines"),
    ("endless-trailers", "more than 256 header lines"),
    ("bad-chunk-end", "malformed chunked encoding"),
    ("bad-chunk-size", "malformed chunked encoding"),
    ("bare-lf-location", "a header line holding a bare CR or LF"),
    ("negative-size", "the manifest gives its layer no valid size"),
    ("fractional-size", "the manifest gives its layer no valid size"),
    ("huge-size", "the manifest gives its layer no valid size"),
    ("string-size", "the manifest gives its layer no valid size"),
])
def test_a_registry_that_breaks_the_rules_gets_a_clear_error_and_nothing_is_kept(
        tmp_path, registry, hostile, behaviour, said):
    env = hostile_env(tmp_path, registry)
    bundle = tmp_path / "pulled.kilnbundle"
    refused_pull(env, f"{hostile.address}/hostile/{behaviour}:v1", said, "-o", bundle)
    assert not bundle.exists() and not bundle.with_name(bundle.name + ".partial").exists()
    # The same server, behaving: the pull works, so the refusal was the behaviour's.
    well = kiln(env, "pull", f"{hostile.address}/team/kernels:v1", "-o", tmp_path / "well.kilnbundle")
    assert well.returncode == 0 and (tmp_path / "well.kilnbundle").read_bytes() == hostile_registry.BUNDLE, well.stderr


@pytest.mark.parametrize("behaviour, said", [
    ("index-bad-digest", "the index names no valid digest for cuda:90"),
    ("index-nested", "is not a Kiln bundle"),
    ("index-wrong-member", "the manifest for cuda:90 has digest"),
    ("index-not-a-list", "is an index with no Kiln bundle for any GPU target"),
    ("index-members-not-objects", "is an index with no Kiln bundle for any GPU target"),
])
def test_an_index_that_is_not_what_push_makes_gets_a_clear_error_and_nothing_is_kept(
        tmp_path, registry, hostile, behaviour, said):
    refused_pull(hostile_env(tmp_path, registry), f"{hostile.address}/hostile/{behaviour}:v1", said,
                 "--target", "cuda:90", "-o", tmp_path / "pulled.kilnbundle")
    assert list(tmp_path.glob("pulled*")) == []
    # Each member is asked for once at most: nothing is followed further.
    assert len([line for line in hostile.requests if f"/hostile/{behaviour}/" in line]) <= 2
