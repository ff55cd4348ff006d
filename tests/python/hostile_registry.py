"""A scripted HTTPS server in an OCI registry's place that breaks one rule of
HTTP/1.1 or of the distribution API (BEHAVIOURS), named by the repository a
pull asks for: hostile/<behaviour>. Everything else it answers as a registry
holding one small bundle would.

A stand-in for a registry Kiln does not control: what is tested is the
client (`kiln pull`), which no real registry makes misbehave on cue."""

import hashlib
import json
import socket
import ssl
import threading

BUNDLE = b"KILNBUNDLE 2\n" + b"\0" * 32  # what the layer holds; never imported here
LAYER_DIGEST = "sha256:" + hashlib.sha256(BUNDLE).hexdigest()
CONFIG = b'{"entries":0,"signed_by":""}'
CONFIG_DIGEST = "sha256:" + hashlib.sha256(CONFIG).hexdigest()


def manifest(size=len(BUNDLE)):
    return json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.kiln.bundle.config.v1+json", "digest": CONFIG_DIGEST,
                   "size": len(CONFIG)},
        "layers": [{"mediaType": "application/vnd.kiln.bundle.v1", "digest": LAYER_DIGEST, "size": size}],
    }).encode()


def digest_of(body):
    return "sha256:" + hashlib.sha256(body).hexdigest()


def index(*members, manifests=None):
    """An OCI image index of bundles for cuda:90 (`kiln push --target`): a
    member per digest, or `manifests` as given."""
    return json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests if manifests is not None else [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": 500,
             "annotations": {"dev.kiln.target": "cuda:90"}} for digest in members],
    }).encode()


NESTED = index(digest_of(manifest()))
# behaviour -> (the index under the tag, {digest: what the registry answers for it})
INDEXES = {
    "index-bad-digest": (index("sha256:zz/../../x"), {}),
    # A member that is itself an index: never followed further.
    "index-nested": (index(digest_of(NESTED)), {digest_of(NESTED): NESTED}),
    # The member the registry sends is not the one the index names.
    "index-wrong-member": (index(digest_of(manifest())), {digest_of(manifest()): manifest(size=len(BUNDLE) + 1)}),
    "index-not-a-list": (index(manifests=5), {}),
    "index-members-not-objects": (index(manifests=["cuda:90", 7, None]), {}),
}


def _plain(body, headers=b""):
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), headers, body)


def _chunked(body, after_chunk=b"\r\n"):
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s%s0\r\n\r\n" % (len(body), body, after_chunk)


# behaviour -> (its answer to the manifest request, to the layer's, or None for a well-behaved one)
BEHAVIOURS = {
    "long-header": (b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * (100 << 10) + b"\r\n\r\n", None),
    "endless-headers": (b"HTTP/1.1 200 OK\r\n" + b"X-N: v\r\n" * 100_000 + b"\r\n", None),
    "bad-chunk-end": (_chunked(manifest(), after_chunk=b"XX"), None),
    "bad-chunk-size": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", None),
    "endless-trailers": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + b"X-T: v\r\n" * 100_000
                         + b"\r\n", None),
    "bare-lf-location": (None, b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /v2/elsewhere\nInjected: yes\r\n"
                         b"Content-Length: 0\r\n\r\n"),
    "negative-size": (_plain(manifest(size=-5)), None),
    "fractional-size": (_plain(manifest(size=1.5)), None),
    "huge-size": (_plain(manifest(size=1e300)), None),
    "string-size": (_plain(manifest(size="NaN")), None),
}


class HostileRegistry:
    def __init__(self, cert, key):
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(cert, key)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.requests = []  # request lines, as received
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection):
        try:
            with self._context.wrap_socket(connection, server_side=True) as tls:
                head = b""
                while b"\r\n\r\n" not in head:
                    data = tls.recv(65536)
                    if not data:
                        return
                    head += data
                request_line = head.split(b"\r\n", 1)[0].decode()
                self.requests.append(request_line)
                tls.sendall(self._response(request_line.split(" ")[1]))
        except (OSError, ssl.SSLError):
            pass  # the client gave up, as it should

    def _response(self, path):
        # /v2/hostile/<behaviour>/manifests/<tag> or /v2/hostile/<behaviour>/blobs/<digest>
        parts = path.split("/")
        behaviour = parts[3] if len(parts) > 5 and parts[2] == "hostile" else ""
        on_manifest, on_layer = BEHAVIOURS.get(behaviour, (None, None))
        if behaviour in INDEXES and "/manifests/" in path:
            top, members = INDEXES[behaviour]
            reference = path.rsplit("/", 1)[1]
            return _plain(members.get(reference, top) if reference.startswith("sha256:") else top)
        if "/manifests/" in path:
            return on_manifest or _plain(manifest())
        if path.endswith(LAYER_DIGEST):
            return on_layer or _plain(BUNDLE)
        return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"

    def stop(self):
        self._listener.close()
