"""An OCI registry for tests (tests/python's and tests/wine's): Debian's
docker-registry on loopback, serving TLS with a certificate of a CA made here,
and asking for a htpasswd login, or (token=True) for a token of the token
service token_server.py runs beside it."""

import base64
import json
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import token_server

USER, PASSWORD = "publisher", "s3cret-pass"


@dataclass
class Registry:
    address: str   # 127.0.0.1:PORT
    storage: Path  # where it keeps blobs (docker/registry/v2/blobs/sha256/HH/HEX/data)
    ca: Path       # the PEM CA its certificate chains to
    process: subprocess.Popen
    tokens: "token_server.TokenServer | None" = None

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)
        if self.tokens is not None:
            self.tokens.stop()

    def layer_file(self, digest):
        """The file where it keeps the blob `digest` ("sha256:HEX")."""
        hex_digest = digest.removeprefix("sha256:")
        return self.storage / "docker" / "registry" / "v2" / "blobs" / "sha256" / hex_digest[:2] / hex_digest / "data"


def _openssl(*args, cwd):
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory):
    """A CA of the test's own: directory/ca.pem and its key, ca.key."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
             "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=registry-ca", cwd=directory)
    return Path(directory) / "ca.pem"


def start(directory, token=False):
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    make_ca(directory)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "server.key",
             "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=directory)
    (directory / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "2", "-extfile", "server.ext", cwd=directory)
    htpasswd = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], check=True, capture_output=True, text=True)
    (directory / "htpasswd").write_text(htpasswd.stdout)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    storage = directory / "storage"
    (directory / "config.yml").write_text(f"""version: 0.1
log: {{level: warn}}
storage: {{filesystem: {{rootdirectory: {storage}}}}}
http: {{addr: "127.0.0.1:{port}", tls: {{certificate: {directory / 'server.pem'}, key: {directory / 'server.key'}}}}}
""")
    tokens = None
    if token:
        tokens = token_server.TokenServer(directory / "tokens", directory / "server.pem", directory / "server.key")
        with open(directory / "config.yml", "a") as config:
            config.write(f"""auth: {{token: {{realm: "{tokens.realm}", service: {token_server.SERVICE}, \
issuer: {token_server.ISSUER}, rootcertbundle: {tokens.signer_cert}}}}}
""")
    else:
        with open(directory / "config.yml", "a") as config:
            config.write(f"auth: {{htpasswd: {{realm: kiln-test, path: {directory / 'htpasswd'}}}}}\n")
    log = open(directory / "registry.log", "w")
    process = subprocess.Popen(["docker-registry", "serve", str(directory / "config.yml")], stdout=log,
                               stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("docker-registry did not start:\n" + (directory / "registry.log").read_text())
            time.sleep(0.1)
    return Registry(f"127.0.0.1:{port}", storage, directory / "ca.pem", process, tokens)


def docker_config(folder, registry_address, password=PASSWORD, user=USER, **settings):
    """A $DOCKER_CONFIG as `docker login` leaves it (with `settings` besides
    "auths": credsStore, credHelpers)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {registry_address: {"auth": auth}}, **settings}))
    return folder
