"""Build the wheel and install it alone into a fresh virtual environment, as a new user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT


def build_wheel(out: Path) -> Path:
    """``pip wheel --no-deps .`` of this checkout (setuptools from the test environment).

    setuptools stages into ./build/ and would ship a stale file left there by an earlier build.
    """
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("supervise_hpc-*.whl")
    return wheel


def fresh_venv(where: Path, wheel: Path) -> Path:
    """A new venv holding only the wheel and its dependencies; returns its bin/ directory."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    # no PYTHONPATH: with the checkout on it, pip finds the build's supervise_hpc.egg-info there,
    # takes supervise-hpc for installed already and installs nothing (no `supervise` in the venv)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(where / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return where / "bin"
