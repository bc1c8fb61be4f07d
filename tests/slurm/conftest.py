"""The ``slurm`` fixture: a throwaway single-node Slurm 22.05 for the whole test session.

``scripts/slurm-up.sh`` installs (apt-get) and starts munged, slurmctld and slurmd under a
temp dir; ``scripts/slurm-down.sh`` stops them at the end. Tests that cannot get a cluster
(not root, no apt, install or start failed) are skipped with the reason, so the suite passes
on a bare machine. Helpers poll with generous bounds; nothing sleeps and hopes.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pytest

from supervisor.journal import read_journal
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
UP = REPO / "scripts" / "slurm-up.sh"
DOWN = REPO / "scripts" / "slurm-down.sh"
# Job states in which a job is still in the queue (squeue lists it).
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
          "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}


class Slurm:
    """A running local cluster and the few operations tests need."""

    def __init__(self, root: Path, conf: Path) -> None:
        self.root = root
        self.conf = conf
        self.env = {**os.environ, "SLURM_CONF": str(conf)}
        self.kill_wait = 5.0  # slurm-up.sh writes KillWait=5

    # -- commands
    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster (argv, no shell)."""
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def submit(self, script: str | Path, *sbatch_args: str, cwd: Path | None = None,
               env: dict[str, str] | None = None) -> str:
        """sbatch a script (its text, or a path) and return the job id."""
        if isinstance(script, str) and not script.startswith("/") and "\n" in script:
            fd, name = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.root)
            with os.fdopen(fd, "w") as f:
                f.write(script)
            path = Path(name)
        else:
            path = Path(script)
        proc = subprocess.run(["sbatch", "--parsable", *sbatch_args, str(path)],
                              env={**self.env, **(env or {})}, capture_output=True, text=True,
                              timeout=60, cwd=cwd or self.root, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise AssertionError(f"sbatch failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def cancel(self, jobid: str, *args: str) -> None:
        self.run("scancel", *args, jobid)

    def release(self, jobid: str, timeout: float = 60.0) -> None:
        """Skip the requeued job's BeginTime (end + 120 s): start it as soon as it can.

        Repeated until the job leaves PENDING: squeue can show PENDING while the requeue is
        still completing, and the requeue's own BeginTime then overwrites an early update.
        Not within the second of the requeue: slurmd compares credential times to the second
        and kills a relaunch in that same second ("Job credential revoked", state FAILED).
        """
        next_second = math.floor(time.time()) + 1.05
        while time.time() < next_second:  # a clock boundary, not a guess: at most ~1 s
            time.sleep(0.05)

        def started() -> bool:
            self.run("scontrol", "update", f"JobId={jobid}", "StartTime=now", check=False)
            return self.wait_for_quietly(lambda: self.state(jobid) != "PENDING", 2.0)
        self.wait_for(started, timeout, lambda: f"job {jobid} still {self.state(jobid)} after StartTime=now")

    # -- state
    def show(self, jobid: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict; {} once the controller forgot the job."""
        proc = self.run("scontrol", "show", "job", "-o", jobid, check=False)
        if proc.returncode != 0:
            return {}
        return dict(re.findall(r"(\S+?)=(\S*)", proc.stdout))

    def sacct(self, jobid: str) -> dict[str, str]:
        """The job's ``sacct -c`` (jobcomp/filetxt) row, {} when it has none yet."""
        fields = "JobID,JobName,State,ExitCode,Start,End,NodeList"
        proc = self.run("sacct", "-c", "-j", jobid, "--parsable2", "--noheader", "-o", fields, check=False)
        rows = [dict(zip(fields.split(","), ln.split("|"))) for ln in proc.stdout.splitlines() if ln]
        rows = [r for r in rows if r.get("JobID") == jobid]
        return rows[-1] if rows else {}

    def state(self, jobid: str) -> str | None:
        """JobState from scontrol, else from sacct -c; None when neither knows the job."""
        st = self.show(jobid).get("JobState")
        if st:
            return st
        st = self.sacct(jobid).get("State")
        return st.split()[0] if st else None

    def wait_state(self, jobid: str, states: str | Iterable[str], timeout: float = 120.0) -> str:
        """Poll until the job is in one of ``states``; fail with the last state seen."""
        want = {states} if isinstance(states, str) else set(states)
        return self.wait_for(lambda: (s := self.state(jobid)) in want and s, timeout,
                             lambda: f"job {jobid} not in {sorted(want)}; last {self.state(jobid)}")

    def wait_gone(self, jobid: str, timeout: float = 180.0) -> str:
        """Poll until the job left the queue (a final state); returns that state."""
        def done() -> str | None:
            s = self.state(jobid)
            return s if s is not None and s not in ACTIVE else None
        return self.wait_for(done, timeout, lambda: f"job {jobid} still {self.state(jobid)}")

    @staticmethod
    def wait_for_quietly(pred: Callable[[], object], timeout: float, every: float = 0.1) -> bool:
        """Poll ``pred`` for up to ``timeout`` seconds; whether it came true."""
        try:
            wait_for(pred, timeout, interval=every)
        except AssertionError:
            return False
        return True

    @staticmethod
    def wait_for(pred: Callable[[], object], timeout: float, why: Callable[[], str] | str = "condition",
                 every: float = 0.2):
        """Poll ``pred`` until it returns something truthy; fail after ``timeout`` seconds."""
        return wait_for(pred, timeout, why, interval=every)


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    """A local Slurm cluster for the session; skipped with the reason when none can start."""
    root = Path(tempfile.mkdtemp(prefix="supervise-slurm-"))
    try:
        proc = subprocess.run(["bash", str(UP), str(root)], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        subprocess.run(["bash", str(DOWN), str(root)], capture_output=True, timeout=120)
        pytest.skip(f"cannot start a local Slurm: {exc}")
    m = re.search(r"^export SLURM_CONF=(.+)$", proc.stdout, re.M)
    if proc.returncode != 0 or not m:
        subprocess.run(["bash", str(DOWN), str(root)], capture_output=True, timeout=120)
        tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
        pytest.skip(f"cannot start a local Slurm (slurm-up.sh exit {proc.returncode}): {tail}")
    try:
        yield Slurm(root, Path(m.group(1)))
    finally:
        subprocess.run(["bash", str(DOWN), str(root)], capture_output=True, timeout=120)
        if not os.environ.get("SUPERVISE_KEEP_SLURM"):  # set it to keep the daemons' logs
            shutil.rmtree(root, ignore_errors=True)


# ----------------------------------------------------------------------------- run-directory helpers

def journal_events(run_dir: Path) -> list[dict]:
    """events.jsonl as dicts; a torn last line (a SIGKILLed writer) is left out."""
    return read_journal(run_dir).events


def model_digest(step_dir: Path) -> str:
    """sha256 over a checkpoint's model state_dict, as examples/ddp_train.py prints it."""
    torch = pytest.importorskip("torch")
    state = torch.load(step_dir / "model.pt", map_location="cpu", weights_only=False)["model"]
    h = hashlib.sha256()
    for name, t in state.items():
        h.update(name.encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()
