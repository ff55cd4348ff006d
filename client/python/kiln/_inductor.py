"""kilnd as the store behind torch.compile's own caches (inductor's FX graph
cache, AOTAutograd cache and autotune results), so a new process, venv or
machine starts warm, not only with Triton's kernels but with inductor's work.

Inductor reads these through torch/_inductor/remote_cache.py: each cache class
(RemoteFxGraphCache, ...) has a `backend_override_cls` that replaces its Redis
backend. Kiln sets it to KilnInductorBackend when that module is imported, and
turns the remote caches on through inductor's environment variables (an
explicit 0 from the user wins). Entries live in kilnd's "inductor" namespace
of the caller's trust domain, under the cache's size cap, eviction and
integrity checks. An entry kilnd serves this account as a file (_index) is
read from it, with no call: a warm start then imports no gRPC, like stock's
local caches.
"""

import logging
import os
import sys

from . import _files, _index

log = logging.getLogger("kiln")

# Inductor's switches for its remote caches (torch 2.6 through 2.11).
REMOTE_CACHE_SWITCHES = ("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
                         "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE", "TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE")
_CACHE_CLASSES = ("RemoteFxGraphCache", "RemoteAOTAutogradCache", "RemoteAutotuneCache",
                  "RemoteBundledAutotuneCache")
_MODULE = "torch._inductor.remote_cache"
NAMESPACE = "inductor"
VALUE_BLOB = "value"  # an entry's one blob
_unreachable = False


def _backend_base():
    from torch._inductor.remote_cache import RemoteCacheBackend

    return RemoteCacheBackend


def _make_backend_class():
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
            import grpc

            from . import _api, _service

            if _unreachable:
                return None
            try:
                response = _service.connect().stub.Lookup(_api.LookupRequest(namespace=NAMESPACE, key=key))
            except (grpc.RpcError, _service.KilnUnavailable) as error:
                _unreachable = True
                _service.fall_back(f"kilnd unreachable for inductor's caches ({error})")
                return None
            return response.entry.blobs[0].data if response.found else None

        def _put(self, key, data):
            import grpc

            from . import _api, _service

            if _unreachable:
                return
            try:
                _service.connect().stub.Put(_api.PutRequest(namespace=NAMESPACE, key=key, blobs=[
                    _api.blob(VALUE_BLOB, data)]))
            except (grpc.RpcError, _service.KilnUnavailable) as error:
                log.debug("inductor cache entry not stored: %s", error)

    return KilnInductorBackend


def install(remote_cache_module):
    """Points inductor's remote caches at kilnd; False (with one warning) when
    this torch's interface is not the one Kiln knows."""
    base = getattr(remote_cache_module, "RemoteCacheBackend", None)
    classes = [getattr(remote_cache_module, name, None) for name in _CACHE_CLASSES]
    if base is None or not hasattr(base, "_get") or any(
            cls is None or not hasattr(cls, "backend_override_cls") for cls in classes):
        import torch

        from . import _service

        _service.fall_back(f"torch {torch.__version__}'s inductor cache interface is not supported; "
                           "inductor's caches stay local")
        return False
    backend = _make_backend_class()
    for cls in classes:
        cls.backend_override_cls = backend
    log.debug("inductor's remote caches go to kilnd")
    return True


class _PatchAfterImport:
    """A meta-path finder that runs install() right after inductor's
    remote_cache module executes, however and whenever torch imports it."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                execute = spec.loader.exec_module

                def exec_module(module, execute=execute):
                    execute(module)
                    try:
                        install(module)
                    except Exception as error:  # never break torch's import
                        log.debug("inductor caches not redirected: %s", error)

                spec.loader.exec_module = exec_module
                return spec
        return None


def activate():
    """Turns inductor's remote caches on (unless the user set them) and
    arranges for them to use kilnd. Cheap: imports nothing from torch."""
    for switch in REMOTE_CACHE_SWITCHES:
        os.environ.setdefault(switch, "1")
    if sys.platform == "win32":
        # Inductor's default under %TEMP% makes paths that pass MAX_PATH.
        from . import _paths

        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_paths.files_dir().parent / "inductor"))
    if _MODULE in sys.modules:
        install(sys.modules[_MODULE])
    elif not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
