"""kiln-triton's wheels as scripts/build-wheels makes them, for the tests of
what they carry (tests/python/test_wheels.py) and of installing them
(tests/wine/test_wheel.py)."""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build_wheels(out):
    """{"any" | "manylinux" | "win_amd64": the wheel's path} in `out`."""
    made = subprocess.run([str(REPO / "scripts" / "build-wheels"), str(out)], capture_output=True, text=True,
                          timeout=1800)
    assert made.returncode == 0, made.stderr[-4000:]
    wheels = {}
    for line in made.stdout.splitlines():
        path = Path(line)
        assert path.parent == Path(out) and path.exists(), made.stdout
        tag = path.name[:-len(".whl")].split("-")[-1]
        wheels["manylinux" if tag.startswith("manylinux") else tag] = path
    return wheels
