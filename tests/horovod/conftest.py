"""What the horovodrun tests need: the Horovod that scripts/build-horovod.sh built, and which
controllers it has. A skip here names Horovod, so under .ci/run (REQUIRE_ALL_COMPONENTS=1)
it fails instead: setup builds Horovod there."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

HOROVODRUN = Path(sys.executable).parent / "horovodrun"


@functools.cache
def built_controllers() -> tuple[set[str], str]:
    """({'gloo', 'mpi'} or a part of it, why not) from `horovodrun --check-build`."""
    if not HOROVODRUN.exists():
        return set(), "horovodrun is not installed (bash scripts/build-horovod.sh)"
    proc = subprocess.run([str(HOROVODRUN), "--check-build"], capture_output=True, text=True, timeout=120)
    text = proc.stdout.split("Available Controllers:")[-1].split("Available Tensor Operations:")[0]
    found = {name.lower() for name in ("MPI", "Gloo") if f"[X] {name}" in text}
    if "[X] PyTorch" not in proc.stdout:
        return set(), "horovod was built without its PyTorch extension (bash scripts/build-horovod.sh)"
    return found, ""


@pytest.fixture(scope="session")
def horovod_controllers() -> set[str]:
    found, why = built_controllers()
    if not found:
        pytest.skip(why or "horovod has neither the Gloo nor the MPI controller")
    return found


@pytest.fixture(params=["gloo", "mpi"])
def mode(request: pytest.FixtureRequest, horovod_controllers: set[str]) -> str:
    """horovodrun --gloo and horovodrun --mpi (OpenMPI's mpirun below a /bin/sh)."""
    if request.param not in horovod_controllers:
        pytest.skip(f"horovod was built without the {request.param} controller (bash scripts/build-horovod.sh)")
    return request.param
