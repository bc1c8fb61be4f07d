"""The job-script templates under a real (throwaway, single-node) Slurm.

The templates are submitted as they are, shrunk only through their environment variables
(STEPS, CKPT_EVERY, NPROC, …) and sbatch's command line, except for the lines that ask for
hardware this cluster does not have (GPUs, a CPU constraint, a partition), which are dropped.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.support import journal
from tests.support.slurm import ACTIVE, SLURM_POLL, Slurm, local_copy, model_digest
from tests.support.wait import wait_for

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
STEPS = 60


def job_env(tmp: Path, **extra: str) -> dict[str, str]:
    return {"REPO": str(REPO), "PERSISTENT_DIR": str(tmp / "persistent"), "LOCAL_DIR": str(tmp / "local"),
            "STEPS": str(STEPS), "CKPT_EVERY": "10", "NPROC": "2", **extra}


def output(tmp: Path, name: str, job: str) -> str:
    f = tmp / f"{name}-{job}.out"
    return f.read_text() if f.exists() else "(no output file)"


def finished_checkpoint(tmp: Path) -> Path:
    ckpt = tmp / "persistent" / "checkpoints"
    assert (ckpt / "latest").read_text() == f"step_{STEPS}"
    assert (ckpt / f"step_{STEPS}" / ".metadata").is_file()
    return ckpt / f"step_{STEPS}"


@pytest.fixture(scope="module")
def uninterrupted(slurm: Slurm, tmp_path_factory: pytest.TempPathFactory) -> str:
    """slurm-torchrun.sbatch, run to the end: the digest of its final persistent checkpoint."""
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("torchrun")
    job = slurm.submit(local_copy("slurm-torchrun.sbatch"), "--cpus-per-task=2", cwd=tmp, env=job_env(tmp))
    state = slurm.wait_gone(job, timeout=240)
    assert state == "COMPLETED", f"{state}\n{output(tmp, 'ddp-torchrun', job)[-4000:]}"
    final = finished_checkpoint(tmp)
    ends = [e for e in journal.events(tmp / "persistent" / f"supervise-{job}") if e["kind"] == "end"]
    assert [(e["reason"], e["exit_status"]) for e in ends] == [("child-exit", 0)]
    out = output(tmp, "ddp-torchrun", job)
    assert "scheduler" in out and "slurm" in json.dumps(journal.events(tmp / "persistent" / f"supervise-{job}")[0])
    return model_digest(final)


def test_torchrun_template_completes_with_a_complete_persistent_checkpoint(uninterrupted: str) -> None:
    assert re.fullmatch(r"[0-9a-f]{64}", uninterrupted)


def test_srun_template_trains_the_same_weights(slurm: Slurm, uninterrupted: str, tmp_path: Path) -> None:
    job = slurm.submit(local_copy("slurm-srun.sbatch"), "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
                       cwd=tmp_path, env=job_env(tmp_path))
    state = slurm.wait_gone(job, timeout=240)
    assert state == "COMPLETED", f"{state}\n{output(tmp_path, 'ddp-srun', job)[-4000:]}"
    start = journal.events(tmp_path / "persistent" / f"supervise-{job}")[0]
    assert start["kind"] == "start" and start["launcher"] == "srun"
    assert model_digest(finished_checkpoint(tmp_path)) == uninterrupted


def test_torchrun_template_preempted_requeued_and_resumed(slurm: Slurm, uninterrupted: str, tmp_path: Path) -> None:
    """TERM to the batch shell (= supervise): checkpoint, flush, stop, `scontrol requeue`; the
    second run restores the newest persistent checkpoint and ends with the same weights."""
    job = slurm.submit(local_copy("slurm-torchrun.sbatch"), "--cpus-per-task=2", cwd=tmp_path,
                       env=job_env(tmp_path, STEP_SLEEP="0.1"))
    ckpt = tmp_path / "persistent" / "checkpoints"
    wait_for(lambda: (ckpt / "step_20" / ".metadata").exists() or slurm.state(job) not in ("PENDING", "RUNNING"),
             240, lambda: f"no step_20 on the persistent side; job {slurm.state(job)}", interval=SLURM_POLL)
    assert slurm.state(job) == "RUNNING", output(tmp_path, "ddp-torchrun", job)[-4000:]
    slurm.cancel(job, "--signal=TERM", "--batch")
    # supervise requeues the job itself; it comes back PENDING (BeginTime), and we let it start.
    wait_for(lambda: slurm.show(job).get("Restarts") == "1" and slurm.state(job) == "PENDING", 120,
             lambda: f"job {job} not requeued: {slurm.state(job)}\n{output(tmp_path, 'ddp-torchrun', job)[-3000:]}",
             interval=SLURM_POLL)
    slurm.release(job)
    # Poll scontrol only: `sacct -c` holds attempt 1's own row, which is not the job's end.
    state = wait_for(lambda: (s := slurm.show(job).get("JobState")) not in ACTIVE and s, 240,
                     lambda: f"job {job} still {slurm.show(job).get('JobState')}", interval=SLURM_POLL)
    logs = "".join(f.read_text()[-3000:] for f in sorted((slurm.root / "log").glob("slurm*.log")))
    assert state == "COMPLETED", f"{state} {slurm.show(job)}\n{output(tmp_path, 'ddp-torchrun', job)[-3000:]}\n{logs}"

    ev = journal.events(tmp_path / "persistent" / f"supervise-{job}")
    stops = [(e["attempt"], e["reason"]) for e in ev if e["kind"] == "stop"]
    assert stops == [(1, "preempted"), (2, "child-exit")], stops
    steps1 = {e["step"]: e for e in ev if e["kind"] == "stop-step" and e["attempt"] == 1}
    assert steps1["checkpoint"]["outcome"] == "published", steps1["checkpoint"]
    assert steps1["requeue"].get("requeued") is True, steps1["requeue"]
    ends = [(e["attempt"], e["reason"], e["exit_status"]) for e in ev if e["kind"] == "end"]
    assert ends[-1] == (2, "child-exit", 0), ends
    restored = [e["checkpoint"] for e in ev if e["kind"] == "restore" and e["attempt"] == 2]
    assert restored and restored[0].startswith("step_"), restored
    out = output(tmp_path, "ddp-torchrun", job)
    assert f"resumed from step {restored[0].split('_')[1]}" in out
    # --open-mode=append: both attempts are in the one output file.
    assert out.count("starting from scratch") == 1 and "attempt 2" in out
    assert model_digest(finished_checkpoint(tmp_path)) == uninterrupted
    assert [a for a, *_ in ends] == [1, 2], f"every attempt journals its end, the requeued one too: {ends}"


@pytest.mark.parametrize("name", sorted(p.name for p in SCRIPTS.glob("*.sbatch")))
def test_sbatch_accepts_every_directive(slurm: Slurm, name: str, tmp_path: Path) -> None:
    """`sbatch --test-only`: the controller parses each template's #SBATCH lines (sized down)."""
    script = tmp_path / name
    script.write_text(local_copy(name))
    (tmp_path / "results").mkdir()
    proc = slurm.run("sbatch", "--test-only", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1",
                     "--cpus-per-task=1", "--mem=100", f"--chdir={tmp_path}", str(script), check=False)
    assert proc.returncode == 0 and "to start at" in proc.stderr, proc.stderr
    assert shutil.which("sbatch")
