"""Bundle files for tests (tests/python's and tests/wine's): Ed25519 keys that
openssl makes, and bundles written as client/cpp/bundle.h lays them out,
signed by openssl, so that what Kiln's own writer does is not what the tests
rely on."""

import hashlib
import struct
import subprocess
from pathlib import Path


def openssl(*args):
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def publisher_key(folder, name="publisher"):
    """A new Ed25519 key made by openssl: (private key PEM, public key PEM, key id)."""
    private, public, der = (folder / f"{name}.pem", folder / f"{name}.pub.pem", folder / f"{name}.der")
    openssl("genpkey", "-algorithm", "ed25519", "-out", private)
    openssl("pkey", "-in", private, "-pubout", "-out", public)
    openssl("pkey", "-in", private, "-pubout", "-outform", "DER", "-out", der)
    return private, public, hashlib.sha256(der.read_bytes()[-32:]).hexdigest()  # the raw key ends the DER


def write_bundle(path, entries, signer=None):
    """A bundle of `entries` ((namespace, key, {name: bytes})), written as
    client/cpp/bundle.h lays it out, a record at a time: version 1, or version 2
    signed by the private key file `signer` (openssl signs)."""
    from kiln.service import api

    digest = hashlib.sha256()
    with open(path, "wb") as out:
        def write(data):
            digest.update(data)
            out.write(data)

        write(b"KILNBUNDLE 2\n" if signer else b"KILNBUNDLE 1\n")
        for namespace, key, blobs in entries:
            record = api.BundleEntry(namespace=namespace, key=key, blobs=[
                api.blob(name, data) for name, data in blobs.items()]).SerializeToString()
            write(struct.pack("<I", len(record)) + record)
        out.write(b"END " + digest.digest())
        if signer:
            message = Path(f"{path}.signed-message")
            message.write_bytes(b"kiln bundle signature\n" + digest.digest())
            der = Path(f"{path}.der")
            openssl("pkey", "-in", signer, "-pubout", "-outform", "DER", "-out", der)
            signature = subprocess.run(["openssl", "pkeyutl", "-sign", "-inkey", str(signer), "-rawin",
                                        "-in", str(message)], check=True, capture_output=True, timeout=60).stdout
            out.write(b"SIG " + hashlib.sha256(der.read_bytes()[-32:]).digest() + signature)


def read_bundle(path):
    """The entries (kiln.v1.BundleEntry) of the bundle file at `path`, read as
    client/cpp/bundle.h lays them out (its checksum and signature unchecked)."""
    from kiln.service import api

    data = Path(path).read_bytes()
    assert data.startswith((b"KILNBUNDLE 1\n", b"KILNBUNDLE 2\n")), data[:16]
    offset, entries = len(b"KILNBUNDLE 1\n"), []
    while data[offset:offset + 4] != b"END ":
        (length,) = struct.unpack_from("<I", data, offset)
        entries.append(api.BundleEntry.FromString(data[offset + 4:offset + 4 + length]))
        offset += 4 + length
    return entries
