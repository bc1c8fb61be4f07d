"""The ``slurm`` fixture: a throwaway single-node Slurm 22.05 for the whole test session
(``Slurm``, tests/support/slurm.py). Tests that cannot get a cluster (not root, no apt,
install or start failed) are skipped with the reason, so the suite passes on a bare machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.slurm import DOWN, UP, Slurm


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    """A local Slurm cluster for the session; skipped with the reason when none can start."""
    root = Path(tempfile.mkdtemp(prefix="supervise-slurm-"))
    try:
        proc = subprocess.run(["bash", str(UP), str(root)], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        subprocess.run(["bash", str(DOWN), str(root)], capture_output=True, timeout=120)
        pytest.skip(f"cannot start a local Slurm: {exc}")
    m = re.search(r"^export SLURM_CONF=(.+)$", proc.stdout, re.M)
    if proc.returncode != 0 or not m:
        subprocess.run(["bash", str(DOWN), str(root)], capture_output=True, timeout=120)
        tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
        pytest.skip(f"cannot start a local Slurm (slurm-up.sh exit {proc.returncode}): {tail}")
    try:
        yield Slurm(root, Path(m.group(1)))
    finally:
        subprocess.run(["bash", str(DOWN), str(root)], capture_output=True, timeout=120)
        if not os.environ.get("SUPERVISE_KEEP_SLURM"):  # set it to keep the daemons' logs
            shutil.rmtree(root, ignore_errors=True)
