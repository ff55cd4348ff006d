"""kilnd as the store behind torch.compile's own caches (inductor's FX graph
cache, AOTAutograd cache and autotune results), so a new process, venv or
machine starts warm, not only with Triton's kernels but with inductor's work.

Inductor reads these through torch/_inductor/remote_cache.py: each cache class
(RemoteFxGraphCache, ...) has a `backend_override_cls` that replaces its Redis
backend. Kiln sets it to KilnInductorBackend when that module is imported, and
turns the remote caches on through inductor's environment variables (an
explicit 0 from the user wins). Entries live in kilnd's "inductor" namespace
of the caller's trust domain, under the cache's size cap, eviction and
integrity checks. An entry kilnd serves this account as a file (local/index) is
read from it, with no call: a warm start then imports no client of kilnd, like stock's
local caches. Misses of the FX graph, AOTAutograd and autotune caches are
single flight across processes (inductor/claims), and a process whose
graphs all come from the cache starts no compile workers (inductor/pool).
"""

import functools
import logging
import time

from kiln.inductor import claims as _inductor_claims
from kiln.local import files as _files
from kiln.local import index as _index

log = logging.getLogger("kiln")

_CACHE_CLASSES = ("RemoteFxGraphCache", "RemoteAOTAutogradCache", "RemoteAutotuneCache",
                  "RemoteBundledAutotuneCache")
# A miss of these inside a claim scope of their kind claims its key (inductor/claims).
_SINGLE_FLIGHT_KINDS = {"RemoteFxGraphCache": _inductor_claims.GRAPHS,
                        "RemoteAOTAutogradCache": _inductor_claims.GRAPHS,
                        "RemoteAutotuneCache": _inductor_claims.AUTOTUNING}
NAMESPACE = "inductor"
VALUE_BLOB = "value"  # an entry's one blob
_unreachable = False


def _backend_base():
    from torch._inductor.remote_cache import RemoteCacheBackend

    return RemoteCacheBackend


def _make_backend_class(single_flight_kind):
    class KilnInductorBackend(_backend_base()):
        """Bytes in, bytes out, keyed by inductor's own cache keys."""

        def _get(self, key):
            global _unreachable
            served = _index.lookup_file(NAMESPACE, key, VALUE_BLOB)
            if served is not None:
                try:
                    return _files.read(served)
                except OSError:
                    pass  # removed since it was found: kilnd knows
            from kiln.service import connection as _service

            if _unreachable:
                return None
            try:
                if single_flight_kind and _inductor_claims.in_scope(single_flight_kind):
                    return _lookup_or_claim(key)
                from kiln.service import api as _api

                response = _service.connect().stub.Lookup(_api.LookupRequest(namespace=NAMESPACE, key=key))
            except Exception as error:  # noqa: BLE001  (every failure of Kiln's falls back)
                _unreachable = True
                reason = f"kilnd unreachable for inductor's caches ({error})"
                _service.forget(shun_because=reason)
                _service.fall_back(reason)
                return None
            return response.entry.blobs[0].data if response.found else None

        def _put(self, key, data):
            from kiln.service import api as _api
            from kiln.service import connection as _service

            try:
                if _unreachable:
                    return
                _inductor_claims.storing(key)
                # As files: the next process reads it through kilnd's link, with no call.
                _service.connect().stub.Put(_api.PutRequest(namespace=NAMESPACE, key=key, blobs=[
                    _api.blob(VALUE_BLOB, data)], serve_as_files=True))
            except Exception as error:  # noqa: BLE001  (a cache entry not stored is the program's loss of nothing)
                log.debug("inductor cache entry not stored: %s", error)
            finally:
                _inductor_claims.release(key)  # stored or not, nobody waits on it now

    return KilnInductorBackend


def _lookup_or_claim(key):
    """The entry, or None on a miss this process compiles: then it holds the
    claim (others wait) until it stores the key or its compile scope ends. A
    miss that waited on another process and found nothing is compiled here
    too: that process failed, bypassed the cache or went away."""
    from kiln.service import api as _api
    from kiln.service import connection as _service
    from kiln.triton import frontend as _frontend

    call = _service.connect().stub.LookupOrClaim(_api.LookupRequest(
        namespace=NAMESPACE, key=key, claimant=_frontend.CLAIMANT))
    asked = time.monotonic()
    try:
        response = next(call)
    except StopIteration:
        response = _api.LookupResponse()
    outcome = "claimed" if response.claimed else "found" if response.found else "missing: compiling it here"
    log.debug("inductor entry %s %s after %.3f s", key, outcome, time.monotonic() - asked)
    if response.claimed:
        _inductor_claims.hold(key, call, response.claim_seconds, functools.partial(_renew_claim, key))
        return None
    return response.entry.blobs[0].data if response.found else None


def _renew_claim(key):
    """Renews this process's claim on key while it compiles the entry: the
    seconds the claim has left, or None when it is no longer this process's."""
    from kiln.service import api as _api
    from kiln.service import connection as _service
    from kiln.triton import frontend as _frontend

    response = next(_service.connect().stub.LookupOrClaim(
        _api.LookupRequest(namespace=NAMESPACE, key=key, claimant=_frontend.CLAIMANT, renew_claim=True),
        timeout=10), None)
    return response.claim_seconds if response is not None and response.claimed else None


def install(remote_cache_module):
    """Points inductor's remote caches at kilnd; False (with one warning) when
    this torch's interface is not the one Kiln knows."""
    base = getattr(remote_cache_module, "RemoteCacheBackend", None)
    classes = [getattr(remote_cache_module, name, None) for name in _CACHE_CLASSES]
    if base is None or not hasattr(base, "_get") or any(
            cls is None or not hasattr(cls, "backend_override_cls") for cls in classes):
        import torch

        from kiln.service import connection as _service

        _service.fall_back(f"torch {torch.__version__}'s inductor cache interface is not supported; "
                           "inductor's caches stay local")
        return False
    for name, cls in zip(_CACHE_CLASSES, classes):
        cls.backend_override_cls = _make_backend_class(_SINGLE_FLIGHT_KINDS.get(name))
    log.debug("inductor's remote caches go to kilnd")
    return True
