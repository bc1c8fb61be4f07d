"""Lightning's own requeue and supervise's, under the real Slurm (issue 42, item 7).

Two jobs side by side on the test cluster, each ``exec supervise --requeue … -- srun python``
a Lightning training written as Lightning's documentation has it (``lightning_requeue.py``:
``Trainer`` defaults, ``ModelCheckpoint(save_last=True)`` every 50 steps,
``trainer.fit(model, ckpt_path="last")``), each attempt on a fresh node-local directory:

* **Lightning's defaults and its idiom** ``#SBATCH --signal=USR1@60``: Slurm's USR1 reaches the
  task (not supervise); Lightning's ``SLURMEnvironment(auto_requeue=True)`` saves
  ``hpc_ckpt_1.ckpt`` into ``default_root_dir`` and runs ``scontrol requeue`` itself, 60–120 s
  before the end. supervise takes the requeue's TERM for a preemption, sees the scheduler
  requeued the job and does not requeue it again (one requeue: ``Restarts=1``), but the HPC
  checkpoint lies outside the mirrored directory, is never published, and the next attempt
  resumes from the older ``last.ckpt``. supervise now says so at the start of the run (the
  plan's warning, also ``supervise check``), with what to set.
* **What the warning says**: ``SLURMEnvironment(auto_requeue=False)`` and ``--signal=B:USR2@60``:
  no warning; supervise stops the run at end − lead (``deadline``), the stop is clean and
  supervise's ``scontrol requeue`` is the only one; the next attempt resumes from the last
  checkpoint published.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from tests.support.journal import events
from tests.support.slurm import Slurm, attempts_of
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
WARNING = "Lightning under srun requeues the job itself on SIGUSR1"

JOB = """#!/bin/bash
#SBATCH --time=3
#SBATCH --signal={signal}
#SBATCH --requeue
#SBATCH --open-mode=append
echo "attempt ${{SLURM_RESTART_COUNT:-0}} on $SLURM_JOB_NODELIST"
L={d}/local-${{SLURM_RESTART_COUNT:-0}}
mkdir -p $L/checkpoints
cd $L
export PYTHONPATH={repo} OMP_NUM_THREADS=1 STEP_SLEEP=0.2
exec {python} -m supervisor --checkpoints $L/checkpoints {d}/persist --restore --settle 1s \\
  --requeue --max-requeues 2 --run-dir {d}/run -- srun {python} {train} $L 100000
"""


def _submit(slurm: Slurm, d: Path, train: str, sig: str) -> str:
    d.mkdir()
    script = JOB.format(signal=sig, d=d, repo=REPO, python=sys.executable, train=HERE / train)
    return slurm.submit(script, "-o", str(d / "out.txt"))


def _second_start(slurm: Slurm, job: str, d: Path, t0: float) -> tuple[str, str]:
    """Attempt 1's output, and attempt 2's once it printed where it started (released early)."""
    def requeued() -> bool:
        return slurm.show(job).get("Restarts") == "1" and slurm.state(job) == "PENDING"
    wait_for(requeued, 360, lambda: f"job {job} not requeued: {slurm.show(job).get('JobState')}; "
             + (d / "out.txt").read_text()[-3000:], interval=1.0)
    print(f"lightning-requeue: {time.monotonic() - t0:.0f}s {d.name} requeued", flush=True)
    slurm.release(job)
    wait_for(lambda: 2 in (a := attempts_of((d / "out.txt").read_text())) and "start step=" in a[2], 240,
             lambda: (d / "out.txt").read_text()[-3000:], interval=1.0)
    slurm.cancel(job)
    text = attempts_of((d / "out.txt").read_text())
    return text[1], text[2]


def _start(text: str) -> tuple[int, str]:
    m = re.search(r"^start step=(\d+) from=(\S+)", text, re.M)
    assert m, text[-3000:]
    return int(m.group(1)), m.group(2)


def _newest_published(ev: list[dict], attempt: int) -> int:
    steps = [int(e["checkpoint"].split("=")[1].split(".")[0]) for e in ev if e.get("kind") == "publish"
             and e["attempt"] == attempt and str(e.get("checkpoint", "")).startswith("step=")]
    assert steps, [e for e in ev if e.get("kind") == "publish"]
    return max(steps)


def test_lightning_auto_requeue_is_named_and_supervise_requeues_once(slurm: Slurm, tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    torch = pytest.importorskip("torch")
    t0 = time.monotonic()
    defaults = _submit(slurm, tmp_path / "defaults", "lightning_requeue.py", "USR1@60")
    fixed = _submit(slurm, tmp_path / "fixed", "lightning_requeue_off.py", "B:USR2@60")

    # Lightning's defaults: Lightning requeued the job, once, and its checkpoint is lost
    first, second = _second_start(slurm, defaults, tmp_path / "defaults", t0)
    d = tmp_path / "defaults"
    assert WARNING in first and "SLURMEnvironment(auto_requeue=False)" in first, first[-3000:]
    assert "requeing job" in first and "Requeued SLURM job" in first, first[-3000:]  # Lightning's own log lines
    ev = events(d / "run" / "events.jsonl")
    (reason,) = [e for e in ev if e.get("kind") == "reason" and e["attempt"] == 1]
    assert reason["requeued_by_scheduler"] is True and reason["restarts"] == 1, reason
    (step,) = [e for e in ev if e.get("kind") == "stop-step" and e["step"] == "requeue" and e["attempt"] == 1]
    assert step.get("skipped") == "the scheduler already requeued the job", step
    hpc = d / "local-0" / "hpc_ckpt_1.ckpt"
    assert hpc.exists() and not (d / "persist" / hpc.name).exists(), sorted(p.name for p in (d / "persist").iterdir())
    hpc_step = torch.load(hpc, map_location="cpu", weights_only=False)["global_step"]
    start, source = _start(second)
    assert source == "last.ckpt" and start == _newest_published(ev, 1), (start, source)
    # the steps after the last periodic save are trained again (unless Lightning's exit at the next
    # batch fell on a periodic save, one step after its HPC save)
    assert hpc_step > start or (start - hpc_step == 1 and start % 50 == 0), (hpc_step, start)
    print(f"lightning-requeue: {time.monotonic() - t0:.0f}s defaults: Lightning requeued, hpc_ckpt_1.ckpt at step "
          f"{hpc_step} unpublished, attempt 2 starts at {start} from {source}", flush=True)

    # as the warning says: supervise alone stops and requeues
    first, second = _second_start(slurm, fixed, tmp_path / "fixed", t0)
    d = tmp_path / "fixed"
    assert WARNING not in first and "requeing job" not in first, first[-3000:]
    ev = events(d / "run" / "events.jsonl")
    (end,) = [e for e in ev if e.get("kind") == "end" and e["attempt"] == 1]
    assert end["reason"] == "deadline" and end["stopped_cleanly"] is True and end["not_durable"] == [], end
    (step,) = [e for e in ev if e.get("kind") == "stop-step" and e["step"] == "requeue" and e["attempt"] == 1]
    assert step.get("requeued") is True, step
    assert not (d / "local-0" / "hpc_ckpt_1.ckpt").exists()
    start, source = _start(second)
    assert source == "last.ckpt" and start == _newest_published(ev, 1), (start, source)
    print(f"lightning-requeue: {time.monotonic() - t0:.0f}s fixed: supervise requeued once, attempt 2 starts at "
          f"{start} from {source}", flush=True)
