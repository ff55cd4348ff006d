"""Kiln: Triton compiles and caches through the kilnd service.

    import kiln
    kiln.enable()    # @triton.jit, autotuning and torch.compile now use kilnd
    kiln.disable()   # stock Triton again

Or set KILN=1 (or KILN_ENDPOINT=...) in the environment: the kiln-activate.pth
file this package installs enables Kiln at interpreter start in every process,
subprocesses and inductor's compile workers included. KILN_STRICT=1 makes a
missing kilnd an error instead of a fallback to stock Triton; KILN_DEBUG=1 logs
what Kiln does to stderr. torch.compile's own caches (FX graph, AOTAutograd,
autotuning) go to kilnd too, unless KILN_INDUCTOR=0.
"""

import logging
import os
import sys

__version__ = "0.1.0"
__all__ = ["enable", "disable", "is_enabled", "KilnUnavailable"]

_MANAGER = "kiln._cache:KilnCacheManager"
_ENV_SET_BY_US = False


from ._errors import KilnUnavailable  # noqa: E402


def _configure_logging():
    if os.environ.get("KILN_DEBUG", "") not in ("", "0"):
        logger = logging.getLogger("kiln")
        if not logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("kiln[%(process)d] %(levelname)s %(message)s"))
            logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)


def activate_lazily():
    """Points Triton's cache manager at Kiln through the environment, so this
    process and its children activate on Triton's first cache access. Imports
    nothing heavy: this runs at every interpreter start under KILN=1."""
    global _ENV_SET_BY_US
    _configure_logging()
    if os.environ.get("TRITON_CACHE_MANAGER") != _MANAGER:
        os.environ["TRITON_CACHE_MANAGER"] = _MANAGER
        _ENV_SET_BY_US = True
    if "kiln._cache" in sys.modules:  # enabled again after disable()
        sys.modules["kiln._cache"].claim_knob()
    os.environ.setdefault("KILN", "1")
    from . import _after_import, _loaded_launchers, _triton_memos

    _after_import.patch(_triton_memos.INSTALLERS)
    _after_import.patch(_loaded_launchers.INSTALLERS)
    if os.environ.get("KILN_INDUCTOR", "1") != "0":
        from . import _inductor

        _inductor.activate()


def enable(endpoint=None):
    """Routes Triton's compiles and cache through kilnd. Returns True when kilnd
    is in use; False (after one warning) when Triton stays stock; raises
    KilnUnavailable in strict mode."""
    if endpoint:
        os.environ["KILN_ENDPOINT"] = endpoint
    activate_lazily()
    from . import _triton

    return _triton.active()


def disable():
    """Stock Triton again, in this process and the children it starts from now on."""
    global _ENV_SET_BY_US
    if os.environ.get("TRITON_CACHE_MANAGER") == _MANAGER:
        del os.environ["TRITON_CACHE_MANAGER"]
    _ENV_SET_BY_US = False
    os.environ.pop("KILN", None)
    if "kiln._cache" in sys.modules:
        sys.modules["kiln._cache"].release_knob()
    if "kiln._triton" in sys.modules:
        sys.modules["kiln._triton"].uninstall()


def is_enabled():
    triton_side = sys.modules.get("kiln._triton")
    return os.environ.get("TRITON_CACHE_MANAGER") == _MANAGER and (
        triton_side is None or triton_side._installed is not False)
