"""python -m kiln prewarm FILE --target cuda:89 [--target ...]: compiles the
Triton kernels of a bundle (`kiln export`) for other GPUs, through kilnd, so
clients with those GPUs start warm. The same as `kiln prewarm`, for machines
with only this package."""

import concurrent.futures
import hashlib
import os
import struct
import sys
import threading
import time
from pathlib import Path

from kiln.local import index as _index
from kiln.service import api as _api
from kiln.service import connection as _service
from kiln.service import wire as _wire

# The format of client/cpp/bundle.h: version 1 unsigned, version 2 signed
# (a signature record after the checksum, which prewarm has no use for: it
# sends only what kilnd compiles itself).
_MAGICS = {b"KILNBUNDLE 1\n": 0, b"KILNBUNDLE 2\n": 4 + 32 + 64}
_TRAILER = b"END "
_DIGEST_SIZE = 32
_MAX_ENTRY_BYTES = 32 << 20


class BundleError(ValueError):
    pass


def read_bundle(path):
    """Yields the entries of a bundle file a record at a time, every blob's
    digest checked, then checks the whole file's checksum: a caller acts on
    what it kept only once the last entry came. BundleError names what is wrong."""
    try:
        bundle = open(path, "rb")  # noqa: SIM115  (closed below, across yields)
    except OSError as error:
        raise BundleError(f"cannot read {path}: {error.strerror}") from error
    with bundle:
        size = os.fstat(bundle.fileno()).st_size
        magic = bundle.read(len(next(iter(_MAGICS))))
        if magic not in _MAGICS:
            raise BundleError(f"{path} is not a Kiln bundle (make one with `kiln export`)")

        def damaged(what):
            return BundleError(f"{path} is damaged ({what}); copy or export it again")

        body_end = size - len(_TRAILER) - _DIGEST_SIZE - _MAGICS[magic]
        if body_end < len(magic):
            raise damaged("it ends early")
        digest = hashlib.sha256(magic)
        at = len(magic)

        def read(count):
            data = bundle.read(count)
            if len(data) != count:
                raise damaged("it ends early")
            return data

        while at < body_end:
            if body_end - at < 4:
                raise damaged("an entry ends early")
            length = read(4)
            entry_size = struct.unpack("<I", length)[0]
            if entry_size > body_end - at - 4:
                raise damaged("an entry ends early")
            if entry_size > _MAX_ENTRY_BYTES:
                raise damaged(f"an entry of {entry_size} bytes, over the limit of {_MAX_ENTRY_BYTES}")
            record = read(entry_size)
            digest.update(length)
            digest.update(record)
            at += 4 + entry_size
            try:
                entry = _api.BundleEntry.FromString(record)
            except _wire.DecodeError as error:
                raise damaged(f"an entry does not parse ({error})") from None
            for blob in entry.blobs:
                if hashlib.sha256(blob.data).digest() != blob.sha256 or blob.size != len(blob.data):
                    raise damaged(f"blob {blob.name} of {entry.namespace}/{entry.key} does not match its SHA-256")
            yield entry
        trailer = read(len(_TRAILER) + _DIGEST_SIZE)
        if trailer[:len(_TRAILER)] != _TRAILER or trailer[len(_TRAILER):] != digest.digest():
            raise damaged("its checksum does not match")


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
    from kiln.service.errors import RpcError, StatusCode

    return isinstance(error, RpcError) and error.code() is StatusCode.INVALID_ARGUMENT


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
                except Exception as error:  # noqa: BLE001  (an RpcError, reported as kiln compile does)
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
