"""The exit status of a run that did not simply finish (issue 42), through the real ``supervise``:
a stop that leaves the training unfinished and not requeued is not 0 (``--dependency=afterok``
must not start the next stage on it), a requeued one is (what the requeue needs), and a run
that ends with something not on persistent storage says so. docs/slurm.md, "Exit status"."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support.checkpoints import hung_checkpoint

from tests.support.journal import events
from tests.support.paths import HELPERS
from tests.support.supervise import run_supervise

TRAINER = [sys.executable, str(HELPERS / "trainer.py")]
UNFINISHED, NOT_DURABLE = 75, 74
# A training that takes TERM as "save if you can, then exit 0", and never saves.
EXITS_0_ON_TERM = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
                   "[time.sleep(0.1) for _ in range(600)]")


def _end(run: Path) -> dict:
    (end,) = events(run, "end")
    return end


def test_a_deadline_stop_the_training_answered_with_0_is_not_0(tmp_path: Path) -> None:
    """No checkpoint pair, so the stop cannot be clean; the training exits 0 on TERM: the job would
    have been COMPLETED with the training unfinished."""
    run = tmp_path / "run"
    r = run_supervise("--run-dir", str(run), "--time-limit", "4s", "--warn-before", "2s", "--grace", "5s",
                      "--gpu-every", "0", "--", sys.executable, "-c", EXITS_0_ON_TERM, timeout=60)
    end = _end(run)
    assert (end["reason"], end["launcher_status"], end["stopped_cleanly"]) == ("deadline", 0, False), end
    assert r.returncode == end["exit_status"] == UNFINISHED, r.stderr
    # stopped_status set keeps the old behaviour: the training's own status
    r = run_supervise("--run-dir", str(tmp_path / "run2"), "--time-limit", "4s", "--warn-before", "2s",
                      "--grace", "5s", "--gpu-every", "0", "--stopped-status", "0", "--",
                      sys.executable, "-c", EXITS_0_ON_TERM, timeout=60)
    assert r.returncode == 0, r.stderr


SCONTROL = """#!/bin/sh
echo "$*" >> {calls}
case "$*" in
  *"show config"*) echo "KillWait                = 5 sec" ;;
  *"show job"*) echo "JobId=77 JobName=t UserId=root(0) JobState=RUNNING Reason=None Requeue=1 Restarts=0 \
BatchFlag=1 RunTime=00:00:02 TimeLimit=01:00:00 StartTime=2026-11-22T22:26:10 EndTime=2099-11-22T23:26:10 \
PreemptTime=None" ;;
  *requeue*) exit {requeue_rc} ;;
  *) exit 1 ;;
esac
"""


@pytest.mark.parametrize(("requeue_rc", "expected"), [(0, 0), (1, UNFINISHED)])
def test_a_clean_stop_that_is_requeued_exits_0_and_one_whose_requeue_failed_does_not(
        tmp_path: Path, requeue_rc: int, expected: int) -> None:
    """Slurm's tools stand in (scontrol requeue answers ``requeue_rc``): a requeued attempt
    keeps exiting 0 (sacct: PENDING 0:0, then the next attempt); a refused requeue leaves the
    training unfinished, so not 0."""
    bindir, run, local, persist = tmp_path / "bin", tmp_path / "run", tmp_path / "local", tmp_path / "persist"
    bindir.mkdir()
    for name, body in (("scontrol", SCONTROL.format(calls=tmp_path / "calls", requeue_rc=requeue_rc)),
                       ("squeue", "#!/bin/sh\nexit 1\n")):
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--time-limit", "6s",
                      "--warn-before", "3s", "--grace", "5s", "--gpu-every", "0", "--requeue", "--",
                      *TRAINER, str(local), "--stopped-status", "1",
                      env={"SLURM_JOB_ID": "77", "PATH": f"{bindir}:{os.environ['PATH']}"}, timeout=120)
    end = _end(run)
    assert end["stopped_cleanly"] is True and end["launcher_status"] == 1, end
    assert "requeue 77" in (tmp_path / "calls").read_text()
    assert r.returncode == end["exit_status"] == expected, r.stderr


@pytest.mark.parametrize(("flags", "expected"), [((), NOT_DURABLE), (("--not-durable-status", "child"), 0),
                                                 (("--not-durable-status", "9"), 9)])
def test_a_run_that_ends_with_a_checkpoint_not_durable_is_not_0(tmp_path: Path, flags: tuple, expected: int) -> None:
    """The training exits 0, but a checkpoint could not be copied (a shard the Python copier
    blocks on for good: a FIFO, killed after the stall bound): ``end.not_durable`` names it."""
    run, local = tmp_path / "run", tmp_path / "local"
    hung_checkpoint(local)
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), str(tmp_path / "persistent"),
                      "--sync-backend", "python", "--gpu-every", "0", *flags, "--",
                      sys.executable, "-c", "import time; time.sleep(2)",
                      env={"SUPERVISE_COPIER_STALL": "1"}, timeout=90)
    end = _end(run)
    assert end["reason"] == "child-exit" and end["launcher_status"] == 0, end
    assert any("step_000001" in line for line in end["not_durable"]), end
    assert r.returncode == end["exit_status"] == expected, r.stderr
