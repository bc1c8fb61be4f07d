"""A PBS job running supervise around the stand-in training ``tests/helpers/trainer.py``, as the
PBS tests submit it (test_signals, test_requeue): submitted by the job user, the checkpoint pair
from a node-local directory fresh for each run (``local-$PBS_JOBCOOKIE``) to the shared
``persist``, and what the run left behind."""

from __future__ import annotations

import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.launchers import catches
from tests.support.paths import ROOT
from tests.support.pbs import PbsCluster
from tests.support.runs import RunJournal
from tests.support.wait import wait_for

PY = sys.executable
TRAINER = ROOT / "tests" / "helpers" / "trainer.py"
KILL_DELAY = 5  # the queue's kill_delay in these tests (MoM's KILL came 5.0 s after its TERM, measured)
OUTPUT_LINE = re.compile(r"^(resumed|checkpoint|stopped|done|crash) (\d+)$")


@dataclass
class Supervised(RunJournal):
    """One PBS job running supervise around the trainer, and what it left behind."""

    pbs: PbsCluster
    d: Path
    jobid: str = ""
    marks: dict[str, float] = field(default_factory=dict)  # test-side wall-clock times

    @property
    def run(self) -> Path:
        return self.d / "run"

    @property
    def persist(self) -> Path:
        return self.d / "persist"

    def output(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in (self.d / "out.txt", self.d / "train.log") if p.exists())

    def tail(self, n: int = 40) -> str:
        log = self.run / "supervise.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return (f"supervise.log (tail):\n{chr(10).join(text.splitlines()[-n:])}\n"
                f"job output (tail):\n{chr(10).join(self.output().splitlines()[-n:])}")

    def trainer(self, what: str) -> list[int]:
        return [int(m.group(2)) for line in self.output().splitlines()
                if (m := OUTPUT_LINE.match(line)) and m.group(1) == what]

    def wait_event(self, kind: str, timeout: float = 60, **match: object) -> dict:
        def found() -> dict | None:
            return next((e for e in self.events(kind) if all(e.get(k) == v for k, v in match.items())), None)
        return wait_for(found, timeout, lambda: f"a {kind} event {match} in {self.run}\n{self.tail()}")

    def wait_running_trainer(self, timeout: float = 90) -> int:
        """Until the training runs and catches USR1 (supervisor.training's handler): its pid."""
        spawn = self.wait_event("spawn", timeout)
        wait_for(lambda: catches(spawn["pid"], signal.SIGUSR1), 30,
                 lambda: f"the trainer's USR1 handler (pid {spawn['pid']})\n{self.tail()}")
        return spawn["pid"]

    def finish(self, timeout: float = 120) -> dict:
        """Until PBS has finished the job: its ``qstat -x -f`` attributes."""
        return self.pbs.wait_state(self.jobid, "F", timeout=timeout)


def submit(pbs: PbsCluster, name: str, *, walltime: str, config: str = "", trainer: tuple[str, ...] = (),
           qsub: tuple[str, ...] = (), script: bool = False, train_log: bool = False) -> Supervised:
    """Submit supervise around the trainer as the job user: an executable job (supervise the
    session leader) or, with ``script``, a job script that ``exec``s it (the login shell leads).
    ``train_log``: the trainer writes to ``train.log`` (a rerun discards the first run's ``.o``)."""
    d = pbs.workdir(name)
    job = Supervised(pbs, d)
    (d / "supervise.toml").write_text(f"""run_dir = "{d}/run"
{config}
[[sync]]
name = "ckpt"
from = "{d}/local-${{PBS_JOBCOOKIE}}"
to = "{d}/persist"
restore = true
""")
    pbs.own(d / "supervise.toml")
    # The training's command is a shell's: the cookie (new on each run) names its local directory.
    train = f'exec {PY} {TRAINER} {d}/local-"$PBS_JOBCOOKIE" {" ".join(trainer)}'
    if train_log:
        train += f" >> {d}/train.log 2>&1"
    line = pbs.supervise_line().split()
    line[0] = shutil.which(line[0]) or line[0]  # pbs_mom execs an executable job's program by its path
    supervise = [*line, "--config", str(d / "supervise.toml"), "--gpu-every", "0",
                 "--sync-every", "1m", "--", "/bin/sh", "-c", train]
    args = ["-N", name[:15], "-l", f"walltime={walltime}", "-j", "oe", "-o", str(d / "out.txt"), *qsub]
    job.marks["submitted"] = time.time()
    if script:
        quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in supervise)
        job.jobid = pbs.qsub(d, *args, script=f"#!/bin/bash\nexec {quoted}\n")
    else:
        job.jobid = pbs.qsub(d, *args, "--", *supervise)
    return job


def complete_checkpoints(persist: Path) -> list[int]:
    """Steps on the persistent side, each checked whole; ``latest`` names the newest."""
    steps = []
    for c in sorted(persist.glob("step_*")):
        step = int(c.name.split("_")[1])
        assert sorted(p.name for p in c.iterdir()) == [".metadata", "shard_0.bin", "shard_1.bin"], c
        assert (c / ".metadata").read_text() == str(step)
        for shard in ("shard_0.bin", "shard_1.bin"):
            assert (c / shard).read_bytes() == step.to_bytes(8, "little") * 512, f"{c}/{shard} torn"
        steps.append(step)
    if steps:
        assert (persist / "latest").read_text() == f"step_{max(steps):06d}"
    return steps
