"""What Slurm 22.05 really delivers to a job whose script ``exec``s one Python process.

These are the facts supervise is built on (docs/slurm.md); each test fails if Slurm behaves
otherwise. The process under test is ``siglog.py``: it stands where supervise stands (it *is*
the batch process after ``exec``) and starts a child in its own session, where supervise
starts the training. One job per scenario, shared by the tests that read its log.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.slurm import SLURM_POLL, Slurm
from tests.support.wait import wait_for

pytestmark = pytest.mark.slurm
SIGLOG = Path(__file__).with_name("siglog.py")


@dataclass(frozen=True)
class Line:
    t: float
    role: str
    what: str
    rest: str


class Run:
    """One job's siglog: what arrived where, and when each role was last alive."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def lines(self) -> list[Line]:
        out = []
        if self.log.exists():
            for raw in self.log.read_text().splitlines():
                t, role, what, *rest = raw.split(" ", 3) + [""]
                out.append(Line(float(t), role, what, rest[0] if rest else ""))
        return out

    def signals(self, role: str) -> list[tuple[float, str]]:
        return [(ln.t, ln.rest) for ln in self.lines() if ln.role == role and ln.what == "signal"]

    def names(self, role: str) -> list[str]:
        return [name for _, name in self.signals(role)]

    def first(self, role: str, name: str) -> float:
        times = [t for t, n in self.signals(role) if n == name]
        assert times, f"{role} never got {name}; log:\n{self.log.read_text()}"
        return times[0]

    def has(self, role: str, name: str) -> bool:
        return name in self.names(role)

    def starts(self) -> list[Line]:
        return [ln for ln in self.lines() if ln.what == "start"]

    def last_alive(self, role: str) -> float:
        return float(Path(f"{self.log}.{role}.alive").read_text().split()[0])


def job_script(log: Path, *flags: str, sbatch: tuple[str, ...] = ()) -> str:
    head = "".join(f"#SBATCH {a}\n" for a in sbatch)
    return f"#!/bin/bash\n{head}exec {sys.executable} {SIGLOG} {log} {' '.join(flags)}\n"


def wait_started(slurm: Slurm, run: Run, n: int = 2, timeout: float = 90) -> None:
    wait_for(lambda: len(run.starts()) >= n, timeout, lambda: f"{n} starts in {run.log}", interval=SLURM_POLL)


# ------------------------------------------------------------------------- scancel scenario

@dataclass
class Scancel:
    run: Run
    jobid: str
    state_after_batch_signals: str | None
    full_sent_at: float
    plain_sent_at: float
    final_state: str
    output: str


@pytest.fixture(scope="module")
def scancel_run(slurm: Slurm, tmp_path_factory: pytest.TempPathFactory) -> Scancel:
    """USR1 --batch, TERM --batch, USR2 (no flag), HUP --batch as a fence, then plain scancel."""
    import time

    d = tmp_path_factory.mktemp("scancel")
    run = Run(d / "sig.log")
    jobid = slurm.submit(job_script(run.log, "--child"), "-o", str(d / "out.txt"))
    wait_started(slurm, run)
    slurm.cancel(jobid, "--signal=USR1", "--batch")
    wait_for(lambda: run.has("batch", "SIGUSR1"), 30, "USR1 at the batch process", interval=SLURM_POLL)
    slurm.cancel(jobid, "--signal=TERM", "--batch")
    wait_for(lambda: run.has("batch", "SIGTERM"), 30, "TERM at the batch process", interval=SLURM_POLL)
    slurm.cancel(jobid, "--signal=USR2")
    # Slurm handles one job's signal requests in order: once HUP (sent after USR2) arrived,
    # USR2 has had its chance.
    slurm.cancel(jobid, "--signal=HUP", "--batch")
    wait_for(lambda: run.has("batch", "SIGHUP"), 30, "HUP at the batch process", interval=SLURM_POLL)
    state = slurm.state(jobid)
    full_sent = time.time()
    slurm.cancel(jobid, "--signal=ALRM", "--full")
    wait_for(lambda: run.has("batch", "SIGALRM"), 30, "ALRM at the batch process", interval=SLURM_POLL)
    slurm.cancel(jobid, "--signal=QUIT", "--batch")  # a fence after --full, as HUP above
    wait_for(lambda: run.has("batch", "SIGQUIT"), 30, "QUIT at the batch process", interval=SLURM_POLL)
    sent = time.time()
    slurm.cancel(jobid)
    final = slurm.wait_gone(jobid, timeout=120)
    wait_for(lambda: (d / "out.txt").exists(), 10, "job output", interval=SLURM_POLL)
    return Scancel(run, jobid, state, full_sent, sent, final, (d / "out.txt").read_text())


def test_batch_flag_signals_reach_only_the_batch_process(scancel_run: Scancel) -> None:
    run = scancel_run.run
    before_plain = [n for t, n in run.signals("child") if t < scancel_run.plain_sent_at]
    assert before_plain == [], "scancel --batch must not reach the child (own session)"
    assert {"SIGUSR1", "SIGTERM", "SIGHUP"} <= set(run.names("batch"))


def test_full_flag_misses_a_child_in_its_own_session(scancel_run: Scancel) -> None:
    """--full signals the batch script's process group (and steps), not a setsid child:
    supervise must forward "checkpoint now" to the training itself."""
    run = scancel_run.run
    assert run.has("batch", "SIGALRM")
    assert [n for t, n in run.signals("child") if t < scancel_run.plain_sent_at] == []


def test_signal_without_batch_reaches_nobody_when_there_are_no_steps(scancel_run: Scancel) -> None:
    run = scancel_run.run
    assert not run.has("batch", "SIGUSR2") and not run.has("child", "SIGUSR2")


def test_batch_term_does_not_end_the_job_but_logs_cancelled(scancel_run: Scancel) -> None:
    # The process ignored TERM, so the job ran on; slurmstepd still wrote "CANCELLED".
    assert scancel_run.state_after_batch_signals == "RUNNING"
    assert "CANCELLED AT" in scancel_run.output


def test_plain_scancel_terms_every_process_then_kills_after_killwait(slurm: Slurm, scancel_run: Scancel) -> None:
    run = scancel_run.run
    for role in ("batch", "child"):
        late = [n for t, n in run.signals(role) if t >= scancel_run.plain_sent_at - 0.5]
        assert "SIGCONT" in late and "SIGTERM" in late, f"{role} got {late}"
        term = max(t for t, n in run.signals(role) if n == "SIGTERM")
        killed_after = run.last_alive(role) - term
        assert slurm.kill_wait - 1.5 <= killed_after <= slurm.kill_wait + 3, (role, killed_after)
    assert scancel_run.final_state == "CANCELLED"


# ------------------------------------------------------------------------- requeue scenario

@pytest.fixture(scope="module")
def requeue_run(slurm: Slurm, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """First run requeues itself with the scheduler's requeue (supervisor.sched); the second run exits 0."""
    d = tmp_path_factory.mktemp("requeue")
    run = Run(d / "sig.log")
    out = d / "out.txt"
    jobid = slurm.submit(job_script(run.log, "--child", "--requeue-self", "--exit-after-start"),
                         "--requeue", "--open-mode=append", "-o", str(out), "--time=10")
    wait_for(lambda: any(ln.what == "requeue" for ln in run.lines()), 90, "the self-requeue", interval=SLURM_POLL)
    pending = slurm.wait_state(jobid, "PENDING", timeout=60)
    info = slurm.show(jobid)
    import time
    now = time.time()
    slurm.release(jobid)
    final = slurm.wait_gone(jobid, timeout=120)
    return {"run": run, "jobid": jobid, "pending": pending, "info": info, "now": now,
            "final": final, "output": out.read_text(), "final_info": slurm.show(jobid)}


def test_requeue_terms_every_process_and_restarts_with_count(slurm: Slurm, requeue_run: dict) -> None:
    run: Run = requeue_run["run"]
    req = [ln for ln in run.lines() if ln.what == "requeue"]
    assert req and req[0].rest.startswith("True"), req
    first_batch_pid = run.starts()[0].rest.split()[0]
    for role in ("batch", "child"):
        assert run.has(role, "SIGTERM"), f"{role}: {run.names(role)}"
        assert run.first(role, "SIGTERM") >= req[0].t - 1
    restarts = [ln.rest.split("restart=")[1] for ln in run.starts()]
    assert restarts[:2] == ["-", "-"] and "1" in restarts, restarts
    assert run.starts()[-1].rest.split()[0] != first_batch_pid
    assert requeue_run["final"] == "COMPLETED"
    assert requeue_run["final_info"].get("Restarts") == "1"


def test_requeued_job_waits_for_begin_time_unless_released(requeue_run: dict) -> None:
    from supervisor.sched._slurm_output import parse_slurm_time

    info = requeue_run["info"]
    assert requeue_run["pending"] == "PENDING" and info.get("Reason") == "BeginTime", info
    eligible = parse_slurm_time(info["EligibleTime"])
    assert eligible is not None and 90 <= eligible - requeue_run["now"] <= 130


def test_open_mode_append_keeps_the_first_runs_output(requeue_run: dict) -> None:
    assert "DUE TO JOB REQUEUE" in requeue_run["output"]


# ------------------------------------------------------------------------- time limit

@pytest.mark.slow
def test_time_limit_warns_batch_only_then_terms_all_then_kills(slurm: Slurm, tmp_path: Path) -> None:
    """--time=1 --signal=B:USR1@30: USR1 (batch only) 30–95 s before the end, TERM to all
    at the end (up to one ~30 s scheduler pass late), SIGKILL KillWait after, TIMEOUT."""
    from supervisor.sched._slurm_output import parse_slurm_time

    run = Run(tmp_path / "sig.log")
    jobid = slurm.submit(job_script(run.log, "--child"), "--time=1", "--signal=B:USR1@30",
                         "-o", str(tmp_path / "out.txt"))
    wait_started(slurm, run)
    start = parse_slurm_time(slurm.show(jobid)["StartTime"])
    assert start is not None
    end = start + 60
    assert slurm.wait_gone(jobid, timeout=240) == "TIMEOUT"
    usr1 = run.first("batch", "SIGUSR1")
    assert 30 - 1 <= end - usr1 <= 30 + 65, end - usr1
    assert not run.has("child", "SIGUSR1")
    for role in ("batch", "child"):
        term = run.first(role, "SIGTERM")
        assert end - 1 <= term <= end + 65, (role, term - end)
        assert slurm.kill_wait - 1.5 <= run.last_alive(role) - term <= slurm.kill_wait + 3


# ------------------------------------------------------------------------- normal end

def test_slurm_leaves_a_detached_child_running_when_the_batch_process_exits(slurm: Slurm, tmp_path: Path) -> None:
    """With proctrack/linuxproc a child in its own session outlives a job whose batch process
    exited: Slurm does not clean up after us (proctrack/cgroup sites SIGKILL the cgroup), so
    supervise itself must leave no orphans (invariant 7)."""
    import os
    import signal

    run = Run(tmp_path / "sig.log")
    script = (f"#!/bin/bash\n{sys.executable} {SIGLOG} {run.log} --child &\n"
              f"until [ \"$(grep -c ' start ' {run.log} 2>/dev/null)\" -ge 2 ] 2>/dev/null; do sleep 0.1; done\n"
              "kill -9 $!\n")
    jobid = slurm.submit(script, "-o", str(tmp_path / "out.txt"))
    assert slurm.wait_gone(jobid, timeout=120) == "COMPLETED"
    child = [ln for ln in run.starts() if ln.role == "child"]
    assert child, run.log.read_text()
    pid = int(child[0].rest.split()[0].removeprefix("pid="))
    try:
        # Alive well after the job ended: its heartbeat keeps moving.
        first = run.last_alive("child")
        wait_for(lambda: run.last_alive("child") > first + 0.5, 10, "the orphan's heartbeat", interval=SLURM_POLL)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
