"""The Horovod that scripts/build-horovod.sh built, and which controllers it has."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

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
