"""Where the client finds kilnd and keeps its files, matching kilnd's defaults
(common/platform_posix.cc, common/platform_win.cc)."""

import os
import sys
from pathlib import Path


def _cache_home():
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return Path(xdg) if xdg.startswith("/") else Path.home() / ".cache"


def runtime_dir():
    """The private directory of the user's kilnd's socket (POSIX) or endpoint file (Windows)."""
    if sys.platform == "win32":
        return _cache_home() / "kiln" / "run"
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/"):
        return Path(runtime) / "kiln"
    return Path(f"/tmp/kiln-{os.getuid()}")


def machine_socket():
    """The socket of the machine's kilnd (deploy/linux/kilnd.system.service), in
    $KILN_MACHINE_RUNTIME_DIR where that is set, as kilnd places it."""
    configured = os.environ.get("KILN_MACHINE_RUNTIME_DIR", "")
    return Path(configured if configured.startswith("/") else "/run/kiln") / "kilnd.sock"


def machine_endpoint_file():
    """The endpoint file of the machine's kilnd service (Windows)."""
    program_data = os.environ.get("ProgramData") or r"C:\ProgramData"
    return Path(program_data) / "kiln" / "run" / "kilnd.endpoint"


# The scheme of a KILN_ENDPOINT that asks for TLS (a farm's kilnd): grpcio's
# channel speaks it, the client's own local transport does not.
TLS_SCHEME = "grpcs://"


class Endpoint:
    """Where to reach kilnd: a gRPC target, the access token to send (read
    from an endpoint file, Windows' transport), and whether it is the user's
    own default kilnd (which the client may start). `problem` says why there
    is no target."""

    def __init__(self, target, token=None, endpoint_file=None, is_user_default=False, problem=None):
        self.target = target
        self.token = token
        self.endpoint_file = endpoint_file
        self.is_user_default = is_user_default
        self.problem = problem

    def describe(self):
        return self.target or self.problem


def read_endpoint_file(path, is_user_default=False):
    """An Endpoint from kilnd's "127.0.0.1:PORT\\nTOKEN\\n" file; target None while it is missing."""
    try:
        target, token = Path(path).read_text().splitlines()[:2]
    except PermissionError:
        return Endpoint(None, None, str(path), is_user_default,
                        f"{path} (this account may not read it: the machine's kilnd serves only the "
                        "accounts its kilnd.conf names with allowed_user = DOMAIN\\user)")
    except (OSError, ValueError):
        return Endpoint(None, None, str(path), is_user_default, f"(no endpoint file at {path})")
    return Endpoint(target, token, str(path), is_user_default)


def default_endpoint():
    """$KILN_ENDPOINT, else $KILN_ENDPOINT_FILE, else the user's kilnd: its Unix socket
    (POSIX) or its endpoint file (Windows), falling back to the machine service's."""
    configured = os.environ.get("KILN_ENDPOINT")
    if configured:
        return Endpoint(configured)
    configured_file = os.environ.get("KILN_ENDPOINT_FILE")
    if configured_file:
        return read_endpoint_file(configured_file)
    if sys.platform != "win32":
        user_socket = runtime_dir() / "kilnd.sock"
        # The system unit's socket, when this account may reach it (group kiln).
        if not os.path.exists(user_socket) and os.path.exists(machine_socket()):
            return Endpoint(f"unix:{machine_socket()}")
        return Endpoint(f"unix:{user_socket}", is_user_default=True)
    user_file = runtime_dir() / "kilnd.endpoint"
    machine_file = machine_endpoint_file()
    # os.path, not Path: they answer False, not raise, where an ACL denies a
    # look inside. The service's run directory is visible even to accounts
    # that may not read the file in it, which then get a reason, not "missing".
    if not os.path.exists(user_file) and os.path.isdir(machine_file.parent):
        return read_endpoint_file(machine_file)
    return read_endpoint_file(user_file, is_user_default=True)


_served_files_dirs = {}  # (KILN_ENDPOINT, KILN_ENDPOINT_FILE) -> kilnd's served files directory


def served_files_dir():
    """The directory where the default kilnd serves files to its own account,
    named in "<socket or endpoint file>.files" (service/server.cc); None when
    there is none or it cannot be read (looked for again on the next call)."""
    configured = (os.environ.get("KILN_ENDPOINT"), os.environ.get("KILN_ENDPOINT_FILE"))
    found = _served_files_dirs.get(configured)
    if found is not None:
        return found
    endpoint = default_endpoint()
    where = endpoint.endpoint_file
    if where is None and endpoint.target and endpoint.target.startswith("unix:"):
        where = endpoint.target[len("unix:"):]
    if where is None:
        return None
    try:
        found = Path(where + ".files").read_text(encoding="utf-8").strip() or None
    except (OSError, ValueError):
        return None  # no kilnd there yet
    _served_files_dirs[configured] = found
    return found


_files_dirs = {}  # KILN_FILES_DIR -> the directory: asked for on every cache hit


def files_dir():
    """Artifacts handed to Triton as files: short, content-addressed names."""
    configured = os.environ.get("KILN_FILES_DIR")
    found = _files_dirs.get(configured)
    if found is None:
        found = _files_dirs[configured] = Path(configured) if configured else _cache_home() / "kiln" / "files"
    return found
