"""Issue 22 under the test Slurm: which stop signal srun needs (item 4), the report's label of
a scancel (item 8), and the warning lead ``supervise init`` writes for a short job (item 6)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import journal
from tests.support.paths import ROOT
from tests.support.slurm import ACTIVE, SLURM_POLL, Slurm
from tests.support.wait import wait_for

pytestmark = pytest.mark.slurm

# A task that logs each signal (fsynced: SIGKILL may come next) and leaves on TERM or INT.
TASK = textwrap.dedent("""
    import os, signal, sys, time
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    def write(text):
        os.write(fd, f"{time.time():.3f} {text}\\n".encode()); os.fsync(fd)
    def on(signum, frame):
        write(f"signal {signal.Signals(signum).name}")
        if signum in (signal.SIGTERM, signal.SIGINT):
            write("exit"); sys.exit(0)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGCONT):
        signal.signal(s, on)
    write(f"start {os.getpid()}")
    while True:
        time.sleep(0.1)
""")


def _env() -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SLURM_"))}
    return {**keep, "PYTHONPATH": str(ROOT)}


def _finished(slurm: Slurm, job: str, timeout: float = 120) -> str:
    return wait_for(lambda: (s := slurm.show(job).get("JobState")) not in ACTIVE and s, timeout,
                    lambda: f"job {job} still {slurm.show(job).get('JobState')}", interval=SLURM_POLL)


def _srun_job(slurm: Slurm, tmp: Path, *supervise_args: str) -> tuple[str, Path, Path]:
    task, log, run = tmp / "task.py", tmp / "task.log", tmp / "run"
    task.write_text(TASK)
    script = (f"#!/bin/bash\n#SBATCH --time=10:00\n#SBATCH --output={tmp}/job-%j.out\n"
              f"exec {sys.executable} -m supervisor --run-dir {run} --gpu-every 0 --grace 8s {' '.join(supervise_args)} "
              f"-- srun --ntasks=1 {sys.executable} {task} {log}\n")
    job = slurm.submit(script, "--ntasks=1", cwd=tmp, env=_env())
    wait_for(lambda: log.exists() and "start" in log.read_text(), 120, "the srun task to start", interval=SLURM_POLL)
    return job, log, run


def _stop_child(run: Path) -> dict:
    return next(e for e in journal.events(run) if e["kind"] == "stop-step" and e["step"] == "stop-child")


def test_srun_tasks_get_the_stop_term_through_slurm(slurm: Slurm, tmp_path: Path) -> None:
    """The srun profile (docs/launchers.md): the stop TERM goes to the tasks through slurmstepd
    (scancel --signal=TERM JOBID, every step but the batch shell); they leave within the grace,
    srun exits after them: a clean stop, no SIGKILL."""
    job, log, run = _srun_job(slurm, tmp_path)
    slurm.cancel(job, "--signal=TERM", "--batch")  # to supervise alone, as a site's preemption does
    _finished(slurm, job)
    stop = _stop_child(run)
    assert stop["signal"] == "SIGTERM" and stop["steps_signalled"]["ok"], stop
    assert stop["graceful"] and not stop["killed"], (stop, log.read_text())
    text = log.read_text()
    assert "signal SIGTERM" in text and "exit" in text and "SIGINT" not in text, text


def test_term_to_srun_kills_the_tasks(slurm: Slurm, tmp_path: Path) -> None:
    """Why not TERM to srun itself (the profile's before): srun answers it with "forcing job
    termination", and its tasks are SIGKILLed without ever seeing a signal they could save on.
    (INT twice within a second, srun(1)'s abort, passes SIGINT on but SIGKILLs the tasks
    milliseconds later: measured, a task got SIGINT and died before it could log its exit.)"""
    job, log, run = _srun_job(slurm, tmp_path, "--stop-signal", "TERM")
    slurm.cancel(job, "--signal=TERM", "--batch")
    _finished(slurm, job)
    assert _stop_child(run)["signal"] == "SIGTERM"
    text = log.read_text()
    assert "signal" not in text and "exit" not in text, text


def test_one_int_does_not_stop_srun(slurm: Slurm, tmp_path: Path) -> None:
    """Why not INT (the old --help said so): srun takes one SIGINT as "report the tasks' state"
    (twice within a second aborts); the tasks get nothing and the grace ends in SIGKILL of srun."""
    job, log, run = _srun_job(slurm, tmp_path, "--stop-signal", "INT")
    slurm.cancel(job, "--signal=TERM", "--batch")
    _finished(slurm, job)
    stop = _stop_child(run)
    assert stop["signal"] == "SIGINT", stop
    assert "signal SIGINT" not in log.read_text(), log.read_text()
    assert not stop["graceful"] or stop["killed"], stop  # srun outlived the grace


def test_a_scancel_is_labelled_cancelled_in_the_stop_table(slurm: Slurm, tmp_path: Path) -> None:
    run = tmp_path / "run"
    script = (f"#!/bin/bash\n#SBATCH --time=10:00\n#SBATCH --output={tmp_path}/job-%j.out\n"
              f"exec {sys.executable} -m supervisor --run-dir {run} --gpu-every 0 --grace 2s -- sleep 600\n")
    job = slurm.submit(script, "--ntasks=1", cwd=tmp_path, env=_env())
    # Cancelled once supervise has read the job's end: a scancel while that query is in flight
    # moves EndTime to the cancel time, which reads as a time limit reached (ci29b: `deadline`).
    wait_for(lambda: (run / "events.jsonl").exists() and
             {"spawn", "deadline"} <= {e["kind"] for e in journal.events(run)}, 120, "the training to start", interval=SLURM_POLL)
    slurm.cancel(job)
    wait_for(lambda: any(e["kind"] == "end" for e in journal.events(run)), 60, "the end event", interval=SLURM_POLL)
    ends = [e for e in journal.events(run) if e["kind"] == "end"]
    assert [e["reason"] for e in ends] == ["cancelled"], (ends, (tmp_path / f"job-{job}.out").read_text()[-3000:])
    r = subprocess.run([sys.executable, "-m", "supervisor", "report", str(run)], capture_output=True, text=True,
                       timeout=60, env={**_env(), "NO_COLOR": "1"})
    stops = [line for line in r.stdout.splitlines() if line.startswith("  attempt 1 at ")]
    assert stops and ": cancelled (" in stops[0], r.stdout


# ---------------------------------------------------------------- item 6: the warning lead init writes

def ends_text(events: list[dict]) -> str:
    return "; ".join(f"{e['reason']} {e['t'] - events[0]['t']:.1f}s after start" for e in events if e["kind"] == "end")


def _init(tmp: Path, time_limit: str, *command: str) -> str:
    r = subprocess.run([sys.executable, "-m", "supervisor", "init", "--dir", str(tmp), "--scheduler", "slurm",
                        "--launcher", "python", "--gpus", "0", "--time", time_limit, "--name", "short",
                        "--local", str(tmp / "local"), "--persistent", str(tmp / "persistent"), "--", *command],
                       cwd=tmp, env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return (tmp / "short.sbatch").read_text()


@pytest.mark.parametrize(("limit", "lead"), [("2:00", 45), ("10", 150), ("1:00:00", 600), ("12:00:00", 600)])
def test_init_scales_the_warning_lead_to_the_time_limit(tmp_path: Path, limit: str, lead: int) -> None:
    script = _init(tmp_path, limit, "python", "train.py")
    lines = [line for line in script.splitlines() if line.startswith("#SBATCH --signal=")]
    assert len(lines) == 1 and lines[0].startswith(f"#SBATCH --signal=B:USR2@{lead} "), lines
    if lead < 600:
        assert "a quarter of the" in lines[0], lines[0]  # the written comment explains it
    assert subprocess.run(["bash", "-n", str(tmp_path / "short.sbatch")]).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")
def test_a_two_minute_job_gets_its_warning_in_time(slurm: Slurm, tmp_path: Path) -> None:
    """The script init writes for --time 2:00, run as written: Slurm's USR2 reaches supervise
    before the end (it is the batch shell), and the stop ends the attempt before the time limit."""
    _init(tmp_path, "2:00", sys.executable, str(ROOT / "tests" / "helpers" / "trainer.py"),
          "$LOCAL_DIR/checkpoints", "--every", "100")
    job = slurm.submit(tmp_path / "short.sbatch", "--cpus-per-task=1", "--ntasks-per-node=1", "--no-requeue",
                       cwd=tmp_path, env=_env())
    _finished(slurm, job, timeout=400)
    run = tmp_path / "persistent" / f"supervise-{job}"
    events = journal.events(run)
    end_time = slurm.show(job).get("EndTime")
    usr2 = [e for e in events if e["kind"] == "signal" and e["signal"] == "SIGUSR2"]
    start = next(e for e in events if e["kind"] == "start")
    assert usr2, f"no USR2 arrived: {[e['kind'] for e in events]} (end {end_time})"
    came = usr2[0]["t"] - start["t"]
    print(f"USR2 came {came:.1f}s after supervise started, {120 - came:.1f}s before the 2:00 limit; "
          f"end {ends_text(events)}")
    assert came < 120 - 10, "the warning came too late to stop cleanly"
    ends = [e for e in events if e["kind"] == "end"]
    assert ends and ends[0]["reason"] == "deadline", ends
    assert ends[0]["not_durable"] == [], ends[0]
