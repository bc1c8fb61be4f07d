"""examples/ddp_train.py: an interrupted-and-resumed run ends bit-identical to an uninterrupted one.

Real runs: 2-rank torchrun (and mpiexec) with gloo on the CPU, a few seconds each. The
uninterrupted reference is computed once per module and shared.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support.ddp_example import TRAIN, checkpoint_digest, digest_of, free_port, launch_env, train  # noqa: E402
from tests.support.supervise import killed_on_exit  # noqa: E402
from tests.support.wait import wait_for  # noqa: E402

pytestmark = pytest.mark.torch

STEPS = "30"
COMMON = ("--steps", STEPS, "--ckpt-every", "10")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The uninterrupted 2-rank torchrun run: (final digest, its work dir)."""
    work = tmp_path_factory.mktemp("reference")
    proc = train("torchrun", work, *COMMON)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return digest_of(proc.stdout), work


def _state_bytes(step_dir: Path) -> dict[str, bytes]:
    import torch
    state = torch.load(step_dir / "model.pt", map_location="cpu", weights_only=False)
    return {k: v.contiguous().numpy().tobytes() for k, v in state["model"].items()}


def test_checkpoint_layout_marker_last_and_pointer(reference: tuple[str, Path]) -> None:
    digest, work = reference
    ckpt = work / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step_10", "step_20", "step_30"]
    assert (ckpt / "latest").read_text() == "step_30"
    for d in ckpt.glob("step_*"):
        names = {p.name for p in d.iterdir()}
        assert names == {".metadata", "model.pt", "__0_0.pt", "__1_0.pt"}, names
        meta = json.loads((d / ".metadata").read_text())
        assert meta["step"] == int(d.name.split("_")[1]) and meta["world_size"] == 2
        # The marker is written after every shard (so supervise never publishes a torn one).
        marker = (d / ".metadata").stat().st_mtime_ns
        assert all((d / f).stat().st_mtime_ns <= marker for f in meta["files"])
    # The checkpoint's weights are the ones the run reported.
    assert checkpoint_digest(ckpt / "step_30") == digest
    # rank 0's scalar log has one row per step after its header.
    rows = (work / "logs" / "scalars.csv").read_text().splitlines()
    assert rows[0] == "step,loss,wall_time" and [r.split(",")[0] for r in rows[1:]] == [str(i) for i in range(1, 31)]


def test_stop_and_resume_is_bit_identical(reference: tuple[str, Path], tmp_path: Path) -> None:
    digest, ref_work = reference
    first = train("torchrun", tmp_path, *COMMON, "--stop-at-step", "17")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "stop requested: saved step 17, exiting 0" in first.stdout
    assert (tmp_path / "ckpt" / "latest").read_text() == "step_17"
    assert digest_of(first.stdout) != digest  # the digest does tell weights apart

    second = train("torchrun", tmp_path, *COMMON)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from step 17" in second.stdout and "newest complete local checkpoint" in second.stdout
    assert "training steps 18..30" in second.stdout
    assert digest_of(second.stdout) == digest
    assert _state_bytes(tmp_path / "ckpt" / "step_30") == _state_bytes(ref_work / "ckpt" / "step_30")


def test_resume_from_supervise_restored_from(reference: tuple[str, Path], tmp_path: Path) -> None:
    """$SUPERVISE_RESTORED_FROM wins over the local directory (here: empty)."""
    digest, _ = reference
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = train("torchrun", tmp_path / "a", *COMMON, "--stop-at-step", "13")
    assert first.returncode == 0, first.stderr[-3000:]
    second = train("torchrun", tmp_path / "b", *COMMON,
                   env={"SUPERVISE_RESTORED_FROM": str(tmp_path / "a" / "ckpt" / "step_13")})
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from step 13" in second.stdout and "restored by supervise" in second.stdout
    assert digest_of(second.stdout) == digest


def test_a_half_written_checkpoint_is_not_resumed_from(reference: tuple[str, Path], tmp_path: Path) -> None:
    """Without its marker a step directory is ignored: the run resumes from the one before."""
    digest, ref_work = reference
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copytree(ref_work / "ckpt" / "step_10", ckpt / "step_10")
    shutil.copytree(ref_work / "ckpt" / "step_20", ckpt / "step_20")
    (ckpt / "step_20" / ".metadata").unlink()
    proc = train("torchrun", tmp_path, *COMMON)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from step 10" in proc.stdout
    assert digest_of(proc.stdout) == digest


def test_sigterm_saves_exits_0_and_resumes(tmp_path: Path) -> None:
    """A real SIGTERM at an arbitrary step (one process, no launcher): save, exit 0, resume."""
    args = ("--steps", "60", "--ckpt-every", "10")
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    ref = train("python", ref_dir, *args)
    assert ref.returncode == 0, ref.stderr[-3000:]

    work = tmp_path / "run"
    work.mkdir()
    env = launch_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    p = subprocess.Popen([sys.executable, str(TRAIN), "--ckpt-dir", str(work / "ckpt"), "--log-dir",
                          str(work / "logs"), *args, "--step-sleep", "0.05"],
                         env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with killed_on_exit(p):
        wait_for(lambda: (work / "ckpt" / "step_10" / ".metadata").exists() or p.poll() is not None,
                 timeout=90, what="the first checkpoint")
        assert p.poll() is None, "the run ended before it could be stopped"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err[-3000:]
    stopped = int(out.split("stop requested: saved step ")[1].split(",")[0])
    assert 10 <= stopped < 60
    assert (work / "ckpt" / "latest").read_text() == f"step_{stopped}"

    resumed = train("python", work, *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {stopped}" in resumed.stdout
    assert digest_of(resumed.stdout) == digest_of(ref.stdout)


@pytest.mark.mpi
def test_mpiexec_runs_the_same_training(reference: tuple[str, Path], tmp_path: Path) -> None:
    """Under OpenMPI's mpiexec (OMPI_COMM_WORLD_* ranks), stop and resume give the same weights."""
    if shutil.which("mpiexec") is None:
        pytest.skip("mpiexec (OpenMPI) is not installed")
    digest, _ = reference
    first = train("mpiexec", tmp_path, *COMMON, "--stop-at-step", "21")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "on 2 rank(s)" in first.stdout
    second = train("mpiexec", tmp_path, *COMMON)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from step 21" in second.stdout, second.stdout
    assert digest_of(second.stdout) == digest
