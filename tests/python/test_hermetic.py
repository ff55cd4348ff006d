"""The run's isolation (tests/hermetic.py): what the client finds by default
lies under the run's own directory, never the account's."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import hermetic
from kiln.service import paths as _paths


def test_the_clients_defaults_lie_in_the_runs_own_home():
    root = Path(os.environ["KILN_TEST_ROOT"])
    assert Path.home().is_relative_to(root)
    endpoint = _paths.default_endpoint()
    assert endpoint.is_user_default and endpoint.target == f"unix:{root / 'run' / 'kiln' / 'kilnd.sock'}"
    assert _paths.machine_socket().is_relative_to(root)
    assert _paths.files_dir().is_relative_to(root)
    assert not any(name.startswith(("KILN", "TRITON_")) for name in os.environ
                   if name not in ("KILN_TEST_ROOT", "KILN_MACHINE_RUNTIME_DIR", "KILN_BUILD_DIR", "KILN_VENV",
                                   "KILN_PYTHON", "KILN_MINGW_BUILD_DIR", "KILN_WINDOWS_BUILD_DIR",
                                   "KILN_WINDOWS_DEPS_CACHE", "KILN_WINDOWS_DEPS_SEED", *hermetic.TEST_SETTINGS))
    assert all(os.environ[name] == value for name, value in hermetic.TEST_SETTINGS.items())


def test_a_harness_stops_what_its_command_left_running_and_keeps_the_home_of_a_failure():
    """A kilnd a test's client started outlives the test; the harness ends it."""
    harness = Path(hermetic.__file__)
    result = subprocess.run([sys.executable, str(harness), "--", "sh", "-c", "sleep 300 & exit 3"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 3
    assert "stopped what the tests left running: " in result.stderr
    kept = Path(result.stderr.split("kept ")[1].split()[0])
    try:
        assert not hermetic.processes_of(kept)
        assert (kept / "home").is_dir()
    finally:
        shutil.rmtree(kept)
