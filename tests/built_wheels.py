"""kiln-triton's wheels as scripts/build-wheels makes them, for the tests of
what they carry (tests/python/test_wheels.py) and of installing them
(tests/wine/test_wheel.py). A test run (tests/hermetic.py's KILN_TEST_ROOT)
builds them once for all its suites: they are made from the checkout, which
no test changes."""

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build_wheels(out):
    """{"any" | "manylinux" | "win_amd64": the wheel's path} in `out`."""
    out = Path(out)
    run_root = os.environ.get("KILN_TEST_ROOT")
    if not run_root:
        return _build(out)
    shared = Path(run_root) / "wheels"
    listing = shared / ".built"
    if listing.exists():
        built = {tag: shared / name for tag, name in (line.split(" ", 1) for line in listing.read_text().splitlines())}
    else:
        built = _build(shared)
        listing.write_text("".join(f"{tag} {path.name}\n" for tag, path in built.items()))
    out.mkdir(parents=True, exist_ok=True)
    return {tag: Path(shutil.copy2(path, out / path.name)) for tag, path in built.items()}


def _build(out):
    made = subprocess.run([str(REPO / "scripts" / "build-wheels"), str(out)], capture_output=True, text=True,
                          timeout=1800)
    assert made.returncode == 0, made.stderr[-4000:]
    wheels = {}
    for line in made.stdout.splitlines():
        path = Path(line)
        assert path.parent == out.resolve() and path.exists(), made.stdout
        tag = path.name[:-len(".whl")].split("-")[-1]
        wheels["manylinux" if tag.startswith("manylinux") else tag] = path
    return wheels
