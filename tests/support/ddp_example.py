"""examples/ddp_train.py run to completion under a launcher (torchrun, mpiexec, python), and its
digests (tests/examples, tests/slurm/test_seed_long.py)."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.supervise import clean_env

TRAIN = ROOT / "examples" / "ddp_train.py"
INSPECT = ROOT / "examples" / "inspect_run.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
DIGEST = re.compile(r"final weights sha256 ([0-9a-f]{64})")


def launch_env(**extra: str) -> dict[str, str]:
    """``clean_env`` without an outer launcher's rank variables either, one thread per rank."""
    env = {k: v for k, v in clean_env().items()
           if not k.startswith(("OMPI_COMM_WORLD", "PMI_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def launcher(kind: str) -> list[str]:
    if kind == "torchrun":
        return [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(TRAIN)]
    if kind == "mpiexec":
        mpiexec = shutil.which("mpiexec")
        assert mpiexec
        return [mpiexec, "--oversubscribe", "-n", "2", "-x", "MASTER_PORT", "-x", "MASTER_ADDR",
                "-x", "OMP_NUM_THREADS", sys.executable, str(TRAIN)]
    if kind == "python":
        return [sys.executable, str(TRAIN)]
    raise ValueError(kind)


def train(kind: str, work: Path, *args: str, env: dict[str, str] | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the example to completion with checkpoints in work/ckpt and logs in work/logs."""
    argv = [*launcher(kind), "--ckpt-dir", str(work / "ckpt"), "--log-dir", str(work / "logs"), *args]
    e = launch_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(),
                  OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **(env or {}))
    return subprocess.run(argv, env=e, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=work)


def digest_of(out: str) -> str:
    found = DIGEST.findall(out)
    assert found, f"no 'final weights sha256' line in:\n{out[-3000:]}"
    return found[-1]


def checkpoint_digest(step_dir: Path) -> str:
    out = subprocess.run([sys.executable, str(INSPECT), "digest", str(step_dir)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return out.split()[0]
