"""Generates the kiln.v1 Python stubs from proto/ into a temp directory and
makes them importable (the Python client package will ship them instead)."""

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def generate():
    out_dir = tempfile.mkdtemp(prefix="kiln-stubs-")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO / 'proto'}",
                    f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", "kiln/v1/kiln.proto"],
                   check=True)
    sys.path.insert(0, out_dir)


generate()
