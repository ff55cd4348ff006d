"""Where the client finds kilnd and keeps its files, matching kilnd's defaults
(common/platform_posix.cc)."""

import os
import sys
from pathlib import Path


def _cache_home():
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return Path(xdg) if xdg.startswith("/") else Path.home() / ".cache"


def socket_dir():
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime_dir.startswith("/"):
        return Path(runtime_dir) / "kiln"
    return Path(f"/tmp/kiln-{os.getuid()}")


def default_endpoint():
    """$KILN_ENDPOINT, else kilnd's per-user Unix socket."""
    configured = os.environ.get("KILN_ENDPOINT")
    if configured:
        return configured
    return f"unix:{socket_dir() / 'kilnd.sock'}"


def files_dir():
    """Artifacts handed to Triton as files: short, content-addressed names."""
    configured = os.environ.get("KILN_FILES_DIR")
    return Path(configured) if configured else _cache_home() / "kiln" / "files"
