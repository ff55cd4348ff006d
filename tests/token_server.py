"""A registry's token service for tests, as the distribution token spec has it
(what Docker Hub, GHCR, Quay and Harbor run): it trades a Basic login, an
identity token (OAuth2's refresh_token grant), or nothing (anonymous) for an
RS256 JWT granting the actions the account may do of those asked, with its
signing certificate in the JWT's x5c header. Debian's docker-registry checks
the JWTs against that certificate (registry_server.start(token=...)).

Accounts: USER may pull and push everything; READER may pull team/*;
anyone may pull public/*. Each request is kept in `asked`."""

import base64
import json
import os
import secrets
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

USER, PASSWORD = "publisher", "s3cret-pass"
READER, READER_PASSWORD = "reader", "r3ader-pass"
IDENTITY_TOKEN = "identity-token-of-the-publisher"  # what `docker login` keeps as "identitytoken"
SERVICE, ISSUER = "kiln-test-registry", "kiln-test-token-issuer"

_RIGHTS = {USER: {"": {"pull", "push"}}, READER: {"team/": {"pull"}}, None: {"public/": {"pull"}}}


def _b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _openssl(*args, cwd, **kwargs):
    return subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True, timeout=60,
                          **kwargs)


def granted(account, scope):
    """The access entry a token gives `account` for "repository:NAME:ACTIONS"."""
    kind, _, rest = scope.partition(":")
    name, _, actions = rest.rpartition(":")
    if kind != "repository" or not name:
        return None
    allowed = set()
    for who in {account, None}:  # anyone's rights are every account's too
        for prefix, rights in _RIGHTS.get(who, {}).items():
            if name.startswith(prefix):
                allowed |= rights
    return {"type": "repository", "name": name, "actions": sorted(allowed & set(actions.split(",")))}


class TokenServer:
    def __init__(self, directory, tls_cert, tls_key):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        # The signing key and its self-signed certificate: the registry's rootcertbundle.
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "signer.key", "-out", "signer.pem",
                 "-days", "2", "-subj", "/CN=kiln-test-token-signer", cwd=self.directory)
        self.signer_cert = self.directory / "signer.pem"
        der = _openssl("x509", "-in", "signer.pem", "-outform", "DER", cwd=self.directory).stdout
        self._x5c = base64.b64encode(der).decode()
        self.asked = []  # (method, {parameter: [values]}, account or None, answered status)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server._answer(self, parse_qs(urlsplit(self.path).query), self._basic_account())

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode())
                account = USER if form.get("refresh_token") == [IDENTITY_TOKEN] else False
                if form.get("grant_type") != ["refresh_token"]:
                    account = False
                if "scope" in form:  # the OAuth2 form: one space-separated parameter
                    form["scope"] = form["scope"][0].split(" ")
                server._answer(self, form, account, oauth=True)

            def _basic_account(self):
                """The account of a Basic login; None with none; False when refused."""
                header = self.headers.get("Authorization", "")
                if not header.startswith("Basic "):
                    return None
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
                accounts = {USER: PASSWORD, READER: READER_PASSWORD}
                return user if accounts.get(user) == password else False

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls_cert, tls_key)
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        # By name: Schannel (kiln.exe) matches a certificate to DNS names only.
        self.realm = f"https://localhost:{self._httpd.server_address[1]}/token"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def _answer(self, handler, parameters, account, oauth=False):
        if account is False:
            self.asked.append((handler.command, parameters, None, 401))
            handler.send_response(401)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        self.asked.append((handler.command, parameters, account, 200))
        access = [entry for entry in (granted(account, scope) for scope in parameters.get("scope", [])) if entry]
        token = self.sign({"iss": ISSUER, "sub": account or "", "aud": parameters.get("service", [SERVICE])[0],
                           "exp": int(time.time()) + 300, "nbf": int(time.time()) - 10, "iat": int(time.time()),
                           "jti": secrets.token_hex(8), "access": access})
        body = json.dumps({"access_token": token, "expires_in": 300} if oauth else
                          {"token": token, "expires_in": 300}).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def sign(self, claims):
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self._x5c]}
        signed = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = _openssl("dgst", "-sha256", "-sign", "signer.key", cwd=self.directory,
                             input=signed.encode()).stdout
        return f"{signed}.{_b64url(signature)}"

    def scopes_asked(self):
        """Each request's scopes, in order."""
        return [parameters.get("scope", []) for _, parameters, _, _ in self.asked]

    def stop(self):
        self._httpd.shutdown()
        self._httpd.server_close()


def helper_script(folder, name, logins):
    """A docker credential helper (`docker-credential-NAME get`) that answers
    `logins` ({server: (user, secret)}) and says "credentials not found" for
    any other, as the protocol has it. Returns the folder to put on PATH."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    helper = folder / f"docker-credential-{name}"
    helper.write_text(f"""#!/bin/sh
[ "$1" = get ] || exit 1
server=$(cat)
case "$server" in
{''.join(f'  {json.dumps(server)}) printf %s {json.dumps(json.dumps({"ServerURL": server, "Username": user, "Secret": secret}))}; exit 0 ;;{os.linesep}' for server, (user, secret) in logins.items())}
esac
echo "credentials not found in native keychain"
exit 1
""")
    helper.chmod(0o755)
    return folder
