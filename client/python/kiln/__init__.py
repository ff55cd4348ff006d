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

import os
import sys

__version__ = "0.1.0"
__all__ = ["enable", "disable", "is_enabled", "KilnUnavailable"]

_ENV_SET_BY_US = False


from kiln import _own_modules  # noqa: E402  (before any other of Kiln's modules)

_own_modules.install()

from kiln.service.errors import KilnUnavailable  # noqa: E402
from kiln.triton import CACHE_MANAGER as _MANAGER  # noqa: E402


def _configure_logging():
    if os.environ.get("KILN_DEBUG", "") not in ("", "0"):
        import logging  # only here: it is a third of an interpreter's start

        logger = logging.getLogger("kiln")
        if not logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("kiln[%(process)d] %(levelname)s %(message)s"))
            logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)


def activate_lazily():
    """Points Triton's cache manager at Kiln through the environment, so this
    process and its children activate on Triton's first cache access. Imports
    nothing but the table of Kiln's patches: this runs at every interpreter
    start under KILN=1."""
    global _ENV_SET_BY_US
    _configure_logging()
    if os.environ.get("TRITON_CACHE_MANAGER") != _MANAGER:
        os.environ["TRITON_CACHE_MANAGER"] = _MANAGER
        _ENV_SET_BY_US = True
    if "kiln.triton.cache_manager" in sys.modules:  # enabled again after disable()
        sys.modules["kiln.triton.cache_manager"].claim_knob()
    os.environ.setdefault("KILN", "1")
    from . import _after_import, _patches

    _after_import.patch(_patches.TRITON)
    if os.environ.get("KILN_INDUCTOR", "1") != "0":
        _activate_inductor()
        _after_import.patch(_patches.INDUCTOR)


# Inductor's switches for its remote caches (torch 2.6 through 2.11) that Kiln
# turns on. Not its bundled autotune cache, which stock leaves off: kilnd
# serves each autotune result on its own as cheaply, and the bundle cost the
# first torch.compile call of a process 14 ms more than stock (H100).
_INDUCTOR_REMOTE_CACHES = ("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
                           "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE")


def _activate_inductor():
    """Turns inductor's remote caches on, unless the user set them: Kiln's
    backend (inductor/caches) serves them from kilnd."""
    for switch in _INDUCTOR_REMOTE_CACHES:
        os.environ.setdefault(switch, "1")
    if sys.platform == "win32":
        # Inductor's default under %TEMP% makes paths that pass MAX_PATH. Beside
        # Kiln's files (kiln.service.paths.files_dir()), worked out here with
        # os.path: paths imports pathlib, which with the modules it brings (re,
        # glob, enum...) was 0.1 s of every python.exe's start under Wine.
        files = os.environ.get("KILN_FILES_DIR") or os.path.join(
            os.environ.get("LOCALAPPDATA") or os.path.join(os.path.expanduser("~"), "AppData", "Local"),
            "kiln", "files")
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                              os.path.join(os.path.dirname(os.path.normpath(files)), "inductor"))


def enable(endpoint=None):
    """Routes Triton's compiles and cache through kilnd. Returns True when kilnd
    is in use; False (after one warning) when Triton stays stock; raises
    KilnUnavailable in strict mode."""
    if endpoint:
        os.environ["KILN_ENDPOINT"] = endpoint
    activate_lazily()
    from kiln.triton import remote as _triton

    return _triton.active()


def disable():
    """Stock Triton again, in this process and the children it starts from now on."""
    global _ENV_SET_BY_US
    if os.environ.get("TRITON_CACHE_MANAGER") == _MANAGER:
        del os.environ["TRITON_CACHE_MANAGER"]
    _ENV_SET_BY_US = False
    os.environ.pop("KILN", None)
    if "kiln.triton.cache_manager" in sys.modules:
        sys.modules["kiln.triton.cache_manager"].release_knob()
    for hook in ("kiln.triton.build_hook", "kiln.triton.stages_hook"):  # set before, or without, kiln.triton.remote's import
        if hook in sys.modules:
            sys.modules[hook].release()
    if "kiln.triton.remote" in sys.modules:
        sys.modules["kiln.triton.remote"].uninstall()


def is_enabled():
    # kiln.triton.remote may be half made (another thread imports it): not fallen back.
    installed = getattr(sys.modules.get("kiln.triton.remote"), "_installed", None)
    return os.environ.get("TRITON_CACHE_MANAGER") == _MANAGER and installed is not False
