"""Issue 15 end to end, with the real supervise: a clean stop's exit status, a training that
only saves periodically (journaled and reported), and an early warning signal deferred to
end − lead. The branches are covered in-process by test_conductor.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.journal import events
from tests.support.paths import HELPERS, ROOT
from tests.support.supervise import run_supervise, start_supervise
from tests.support.wait import wait_for

TRAINER = [sys.executable, str(HELPERS / "trainer.py")]


def _step(run_dir: Path, name: str) -> dict:
    return next(e for e in events(run_dir, "stop-step") if e["step"] == name)


@pytest.mark.parametrize("flags, expected", [((), 75), (("--stopped-status", "0"), 0), (("--stopped-status", "child"), 1),
                                             (("--stopped-status", "5"), 5)])
def test_a_clean_stop_exits_with_the_stopped_status_whatever_the_launchers(tmp_path: Path, flags, expected) -> None:
    """The training saved the requested checkpoint and exited 1 after the stop, as torchrun does.
    Not requeued, the training is unfinished: 75 by default (issue 42: 0 made sacct say COMPLETED
    and --dependency=afterok start the next stage); a stopped_status given is used as it is."""
    run, local, persist = tmp_path / "run", tmp_path / "local", tmp_path / "persist"
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--time-limit", "6s",
                      "--warn-before", "3s", "--grace", "5s", "--gpu-every", "0", *flags, "--",
                      *TRAINER, str(local), "--stopped-status", "1", timeout=120)
    assert r.returncode == expected, r.stderr
    end = events(run, "end")[0]
    assert end["stopped_cleanly"] is True and end["launcher_status"] == 1 and end["exit_status"] == expected
    assert _step(run, "checkpoint")["outcome"] == "published"


def test_a_training_that_ignores_requests_is_journaled_reported_and_teaches_no_lead(tmp_path: Path) -> None:
    run, local, persist = tmp_path / "run", tmp_path / "local", tmp_path / "persist"
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--grace", "5s",
                        "--gpu-every", "0", "--", *TRAINER, str(local), "--no-answer", "--every", "20",
                        "--step-time", "0.1")

    def saves() -> int:
        return len([e for e in events(run, "publish") if not e.get("pointer")]) if (run / "events.jsonl").exists() else 0

    wait_for(lambda: saves() >= 3, timeout=60, what="three periodic saves")
    n = saves()
    wait_for(lambda: saves() > n, timeout=30, what="the next periodic save")
    p.send_signal(signal.SIGUSR2)  # right after a save: the next periodic one is a whole period away
    p.communicate(timeout=60)
    assert p.returncode == 75  # stopped, not requeued: unfinished
    cp = _step(run, "checkpoint")
    assert cp["outcome"] == "published" and cp["answered"] is False, cp
    report = subprocess.run([sys.executable, "-m", "supervisor", "report", str(run)], capture_output=True, text=True,
                            cwd=ROOT, timeout=60)
    assert "does not answer checkpoint requests" in report.stdout, report.stdout
    # The next attempt (auto lead) learns nothing from it and keeps the default, fitted to the job.
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--time-limit", "8s",
                      "--grace", "5s", "--gpu-every", "0", "--", *TRAINER, str(local), "--steps", "5", timeout=120)
    assert r.returncode == 0, r.stderr
    deadline = [e for e in events(run, "deadline") if e["attempt"] == 2][0]
    assert deadline["learned"] is False and deadline["bound"] == "first-share" and deadline["lead_s"] == 2.0
    assert "periodic" in deadline["ignored"][0]["why"]


def test_an_early_warning_signal_is_deferred_to_end_minus_lead(tmp_path: Path) -> None:
    """#SBATCH --signal=B:USR1@60 on a short job: the signal may come at second 0."""
    run, local, persist = tmp_path / "run", tmp_path / "local", tmp_path / "persist"
    t0 = time.time()
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--time-limit", "12s",
                        "--warn-before", "4s", "--grace", "5s", "--gpu-every", "0", "--", *TRAINER, str(local))
    wait_for(lambda: events(run, "deadline") and events(run, "spawn"), what="the training to start")
    p.send_signal(signal.SIGUSR1)
    p.communicate(timeout=60)
    assert p.returncode == 75
    assert events(run, "signal")[0]["action"] == "deferred"
    stop = events(run, "stop")[0]
    assert stop["reason"] == "deadline" and stop["t"] - t0 >= 7.0
    assert _step(run, "checkpoint")["outcome"] == "published"


def test_a_run_that_cannot_progress_is_not_requeued_and_says_why(tmp_path: Path) -> None:
    """Two attempts under Slurm (its environment; scontrol is not reached on the refusal) whose
    training never got a checkpoint to persistent storage: the second is not requeued, exits 3,
    notifies ``no-progress``, and the report names the cause."""
    from tests.support.webhook import Server

    run, local, persist = tmp_path / "run", tmp_path / "local", tmp_path / "persist"
    server = Server()
    try:
        def attempt(restart: str | None, *flags: str) -> subprocess.CompletedProcess:
            env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "localhost", "SLURM_NNODES": "1",
                   **({"SLURM_RESTART_COUNT": restart} if restart else {})}
            # the notice is bounded by the time left before the end (drain): the stop (1 s checkpoint
            # wait, 2 s grace) ends about 3 s after the warning, 3 s before the end, however loaded
            p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--time-limit", "10s",
                                "--warn-before", "6s", "--checkpoint-timeout", "1s", "--grace", "2s", "--gpu-every", "0",
                                "--requeue", "--notify", server.url("np"), *flags, "--",
                                *TRAINER, str(local), "--no-answer", "--ignore-stop", env=env)
            out, err = p.communicate(timeout=120)
            return subprocess.CompletedProcess(p.args, p.returncode, out, err)

        first = attempt(None)
        assert first.returncode != 3, first.stderr
        assert not events(run, "requeue-refused")
        second = attempt("1", "--no-progress-attempts", "2")
        assert second.returncode == 3, second.stderr
        refused = events(run, "requeue-refused")[0]
        assert refused["why"] == "no-progress" and refused["attempt"] == 2
        assert any(b"no-progress" in h["body"] for h in server.hits("np"))
        report = subprocess.run([sys.executable, "-m", "supervisor", "report", str(run)], capture_output=True,
                                text=True, cwd=ROOT, timeout=60)
        assert "no new checkpoint reached persistent storage in the last 2 attempts" in report.stdout, report.stdout
    finally:
        server.close()
