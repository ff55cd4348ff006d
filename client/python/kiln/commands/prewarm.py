"""python -m kiln prewarm FILE --target cuda:89 [--target ...]: compiles the
Triton kernels of a bundle (`kiln export`) for other GPUs, through kilnd, so
clients with those GPUs start warm. The same as `kiln prewarm`, for machines
with only this package."""

import concurrent.futures
import hashlib
import struct
import sys
import threading
import time
from pathlib import Path

from kiln.local import index as _index
from kiln.service import api as _api
from kiln.service import connection as _service

_MAGIC = b"KILNBUNDLE 1\n"
_TRAILER = b"END "
_DIGEST_SIZE = 32


class BundleError(ValueError):
    pass


def read_bundle(path):
    """The entries of a bundle file, every digest checked first (one changed
    byte refuses all of it). BundleError names what is wrong."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise BundleError(f"cannot read {path}: {error.strerror}") from error
    if not data.startswith(_MAGIC):
        raise BundleError(f"{path} is not a Kiln bundle (make one with `kiln export`)")

    def damaged(what):
        return BundleError(f"{path} is damaged ({what}); copy or export it again")

    trailer_at = len(data) - len(_TRAILER) - _DIGEST_SIZE
    if trailer_at < len(_MAGIC) or data[trailer_at:trailer_at + len(_TRAILER)] != _TRAILER:
        raise damaged("it ends early")
    body = data[:trailer_at]
    if hashlib.sha256(body).digest() != data[-_DIGEST_SIZE:]:
        raise damaged("its checksum does not match")
    entries, at = [], len(_MAGIC)
    while at < len(body):
        if len(body) - at < 4 or len(body) - at - 4 < struct.unpack_from("<I", body, at)[0]:
            raise damaged("an entry ends early")
        size = struct.unpack_from("<I", body, at)[0]
        try:
            entry = _api.BundleEntry.FromString(body[at + 4:at + 4 + size])
        except Exception as error:  # noqa: BLE001  (protobuf's DecodeError, by version)
            raise damaged("an entry does not parse") from error
        at += 4 + size
        for blob in entry.blobs:
            if hashlib.sha256(blob.data).digest() != blob.sha256 or blob.size != len(blob.data):
                raise damaged(f"blob {blob.name} of {entry.namespace}/{entry.key} does not match its SHA-256")
        entries.append(entry)
    return entries


def recorded_kernels(entries):
    """(kernel name, PrewarmRequest without its target) of each Triton kernel of a bundle."""
    kernels = []
    for entry in entries:
        recorded = [blob for blob in entry.blobs
                    if blob.name.endswith(".source") or blob.name == _index.KEY_INPUTS_BLOB]
        source = next((blob.name for blob in recorded if blob.name.endswith(".source")), None)
        if source is not None:  # launchers and inductor's graphs have no frontend output
            kernels.append((source[:-len(".source")], _api.PrewarmRequest(namespace=entry.namespace,
                                                                            recorded=recorded)))
    return kernels


def parse_target(text):
    backend, _, arch = text.partition(":")
    if backend != "cuda" or not arch.isdigit():
        raise ValueError(f"target '{text}': write cuda:ARCH, e.g. cuda:89")
    return _api.Target(backend="cuda", arch=arch, warp_size=32)


def _kernel_specific(error):
    """Whether an RPC error is about one recording (the others may still go)."""
    import grpc

    return isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.INVALID_ARGUMENT


class _Progress:
    """One status line redrawn in place on a terminal, with printed lines going
    above it; elsewhere (a log, a pipe) only the printed lines. As `kiln`'s."""

    _ERASE = "\r\x1b[2K"

    def __init__(self, out):
        self.out, self.terminal, self.status = out, out.isatty(), ""

    def update(self, status):
        if self.terminal and status != self.status:
            self.out.write(self._ERASE + status)
            self.out.flush()
            self.status = status

    def print(self, line):
        drawn = self.terminal and self.status
        self.out.write((self._ERASE if drawn else "") + line + "\n" + (self.status if drawn else ""))
        self.out.flush()

    def clear(self):
        if self.terminal and self.status:
            self.out.write(self._ERASE)
            self.out.flush()
            self.status = ""


def prewarm(path, target_texts, out=sys.stdout):
    try:
        targets = [parse_target(text) for text in target_texts]
        kernels = recorded_kernels(read_bundle(path))
    except ValueError as error:
        print(f"kiln: {error}", file=sys.stderr)
        return 2
    if not targets:
        print("kiln: prewarm needs at least one --target", file=sys.stderr)
        return 2
    if not kernels:
        print(f"kiln: {path} holds no recorded Triton kernel (entries with <kernel>.source); export a cache that "
              "the kiln Python client filled", file=sys.stderr)
        return 2
    try:
        stub = _service.connect(autostart=False).stub
    except _service.KilnUnavailable as error:
        print(f"kiln: kilnd is not reachable: {error}", file=sys.stderr)
        return 3

    # Set by an error no other kernel would escape (kilnd gone, no toolchain of
    # the bundle's Triton, refused): nothing more is sent.
    stop = threading.Event()

    def send(request, target):
        if stop.is_set():
            return None
        request = _api.PrewarmRequest.FromString(request.SerializeToString())
        request.target.CopyFrom(target)
        try:
            return stub.Prewarm(request, timeout=600)
        except Exception as error:
            if not _kernel_specific(error):
                stop.set()
            raise

    progress, started = _Progress(out), time.monotonic()
    counts = {"compiled": 0, "cache hit": 0, "skipped": 0, "failed": 0}
    exit_code, not_sent = 0, 0
    # A few at a time: kilnd runs them on its workers, and a bundle may hold thousands.
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        pending = {pool.submit(send, request, target): f"{name} {target.backend}:{target.arch}"
                   for name, request in kernels for target in targets}
        total = len(pending)
        while pending:
            done, _ = concurrent.futures.wait(pending, timeout=0.1, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                label = pending.pop(future)
                try:
                    response = future.result()
                except Exception as error:  # noqa: BLE001  (grpc.RpcError, reported as kiln compile does)
                    counts["failed"] += 1
                    progress.clear()
                    print(f"kiln: {label}: {getattr(error, 'details', lambda: str(error))()}", file=sys.stderr)
                    exit_code = max(exit_code, 4)
                    continue
                if response is None:
                    not_sent += 1
                    continue
                if response.skipped:
                    counts["skipped"] += 1
                    progress.print(f"{label}: skipped: {response.skipped}")
                elif response.compile.HasField("error"):
                    counts["failed"] += 1
                    progress.clear()
                    print(f"kiln: {label}: {response.compile.error.message}", file=sys.stderr)
                    exit_code = max(exit_code, 5)
                else:
                    outcome = "cache hit" if response.compile.cache_hit else "compiled"
                    counts[outcome] += 1
                    progress.print(f"{label}: {outcome}")
            finished = total - len(pending)
            progress.update(f"prewarming {Path(path).name}: {finished}/{total} done, "
                            f"{min(len(pending), 8)} running, {counts['failed']} failed, "
                            f"{time.monotonic() - started:.1f} s")
    if not_sent:
        progress.clear()
        print(f"kiln: stopped after that error; {not_sent} kernel and target pairs were not sent", file=sys.stderr)
        return exit_code
    progress.print(f"prewarmed {len(kernels)} kernels for {len(targets)} targets: {counts['compiled']} compiled, "
                   f"{counts['cache hit']} already cached, {counts['skipped']} skipped, {counts['failed']} failed, "
                   f"{time.monotonic() - started:.1f} s")
    progress.clear()
    return exit_code
