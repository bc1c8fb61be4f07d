"""scripts/slurm-horovodrun.sbatch, the seed's Ibex job script rewritten around `exec supervise`,
under the real local Slurm with the real Horovod.

Submitted as it is (its `#!/bin/bash --login`, its preset configs/ibex.toml, `horovodrun -np
$SLURM_NTASKS python …` with no controller flag, so the build's default: MPI here), sized down
on sbatch's command line, with the hardware lines this cluster lacks dropped and the training
(examples/hvd_train.py, the template's default) shortened through the script's arguments. A
preemption (TERM to the batch shell, which *is* supervise) mid-run: checkpoint, flush, stop,
`scontrol requeue`; the second attempt restores the newest persistent checkpoint, resumes, and
ends with the final weights of a run that was never interrupted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import journal
from tests.support.horovod import HOROVODRUN, built_controllers
from tests.support.slurm import ACTIVE, SLURM_POLL, Slurm, local_copy, model_digest
from tests.support.wait import wait_for

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "hvd_train.py"
STEPS = 60
TRAINING_ARGS = ("--steps", str(STEPS), "--ckpt-every", "10")
DIGEST = re.compile(r"final weights sha256 ([0-9a-f]{64})")


@pytest.fixture(scope="module")
def horovod() -> None:
    found, why = built_controllers()
    if not found:
        pytest.skip(why or "horovod has no controller")


def uninterrupted_digest(work: Path) -> str:
    """The same training with plain horovodrun, no Slurm, no supervise, no interruption."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run([str(HOROVODRUN), "-np", "2", "-H", "localhost:2", sys.executable, str(TRAIN),
                           "--write-checkpoints-to", str(work / "checkpoints"),
                           "--tensorboard-logging-dir", str(work / "tensorboard"), *TRAINING_ARGS],
                          env=env, cwd=work, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (digest,) = DIGEST.findall(proc.stdout)
    return digest


def test_horovodrun_template_preempted_requeued_and_resumed(slurm: Slurm, horovod: None, tmp_path: Path) -> None:
    script = tmp_path / "slurm-horovodrun.sbatch"
    script.write_text(local_copy("slurm-horovodrun.sbatch"))
    out = tmp_path / "hvd.out"
    persistent, local = tmp_path / "persistent", tmp_path / "local"
    env = {**slurm.env, "REPO": str(REPO), "VENV": str(Path(sys.executable).parent.parent),
           "PERSISTENT_DIR": str(persistent), "LOCAL_DIR": str(local), "OMP_NUM_THREADS": "1"}
    submit = subprocess.run(
        ["sbatch", "--parsable", "--job-name=hvd", "--ntasks=2", "--tasks-per-node=2", "--cpus-per-task=1",
         f"--output={out}", f"--error={out}", str(script), *TRAINING_ARGS, "--step-sleep", "0.1"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip().split(";")[0]

    def output() -> str:
        return out.read_text()[-4000:] if out.exists() else "(no output yet)"

    ckpt = persistent / "checkpoints"
    wait_for(lambda: (ckpt / "step_10" / ".metadata").exists() or slurm.state(job) not in ("PENDING", "RUNNING"),
             240, lambda: f"no step_10 on the persistent side; job {slurm.state(job)}\n{output()}", interval=SLURM_POLL)
    assert slurm.state(job) == "RUNNING", output()
    slurm.cancel(job, "--signal=TERM", "--batch")       # what a site's preemption does to the batch shell
    wait_for(lambda: slurm.show(job).get("Restarts") == "1" and slurm.state(job) == "PENDING", 120,
             lambda: f"job {job} not requeued: {slurm.state(job)}\n{output()}", interval=SLURM_POLL)
    slurm.release(job)
    reference = uninterrupted_digest(tmp_path)             # while the cluster starts attempt 2
    state = wait_for(lambda: (s := slurm.show(job).get("JobState")) not in ACTIVE and s, 240,
                     lambda: f"job {job} still {slurm.show(job).get('JobState')}\n{output()}", interval=SLURM_POLL)
    assert state == "COMPLETED", f"{state}\n{output()}"

    ev = journal.events(persistent / f"supervise-{job}")
    starts = [e for e in ev if e["kind"] == "start"]
    assert [e["launcher"] for e in starts] == ["horovodrun", "horovodrun"], starts  # no --gloo/--mpi: cautious
    stops = [(e["attempt"], e["reason"]) for e in ev if e["kind"] == "stop"]
    assert stops == [(1, "preempted"), (2, "child-exit")], stops
    steps1 = {e["step"]: e for e in ev if e["kind"] == "stop-step" and e["attempt"] == 1}
    assert steps1["checkpoint"]["outcome"] == "published", steps1["checkpoint"]
    assert steps1["requeue"].get("requeued") is True, steps1["requeue"]
    # The stop went to the ranks (profile `horovodrun`), which saved and left: nothing was killed.
    assert steps1["stop-child"]["route"] == "ranks" and not steps1["stop-child"]["killed"], steps1["stop-child"]
    assert not any(e["kind"] == "orphans-killed" for e in ev), [e for e in ev if e["kind"] == "orphans-killed"]
    ends = [(e["attempt"], e["reason"], e["exit_status"]) for e in ev if e["kind"] == "end"]
    assert [a for a, *_ in ends] == [1, 2] and ends[-1] == (2, "child-exit", 0), ends
    restored = [e["checkpoint"] for e in ev if e["kind"] == "restore" and e["attempt"] == 2]
    assert restored and restored[0].startswith("step_") and int(restored[0].split("_")[1]) < STEPS, restored
    text = out.read_text()
    assert re.search(rf"resumed from step {restored[0].split('_')[1]} \(.*restored by supervise\)", text), output()
    assert text.count("starting from scratch") == 1          # --open-mode=append: both attempts in one file
    assert (ckpt / "latest").read_text() == f"step_{STEPS}"
    assert (ckpt / f"step_{STEPS}" / ".metadata").is_file()
    assert model_digest(ckpt / f"step_{STEPS}") == reference
    assert (persistent / "tensorboard" / "scalars.csv").is_file()  # the logs pair of the preset
