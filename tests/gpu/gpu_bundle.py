"""What every GPU script does first with the bundle scripts/make-gpu-bundle made."""

import glob
import subprocess
import sys


def install_client(bundle):
    """Installs the bundle's Kiln client wheel for this Python, the one the
    script's timed processes run: without it their "kiln" runs would be stock."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
                    *glob.glob(str(bundle / "*.whl"))], check=True)
