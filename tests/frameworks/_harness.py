"""Drive the real ``supervise`` around a real framework trainer, with a reader polling the
persistent side. Shared by tests/frameworks and bench/frameworks.py.

One ``Case`` is one way a library checkpoints (HF ``Trainer``, Lightning with a ``last.ckpt``
copy or link, ``torch.save`` in place or through ``os.replace``, DCP, Accelerate). A ``Run``
is one scratch area: the node-local directory the trainer writes, the persistent directory,
the run directory, and one ``attempt`` after another (a requeue), each a ``supervise``
process whose output goes to files.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TRAINERS = HERE / "trainers"
sys.path.insert(0, str(HERE))
from checkers import durable_steps, load_all  # noqa: E402

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class Case:
    id: str
    profile: str  # what supervise should detect, and the checker that loads it
    trainer: str  # script in trainers/
    args: tuple[str, ...] = ()
    subdir: str = ""  # the pair's LOCAL below the trainer's --out (Accelerate: checkpoints/)
    needs: str = "torch"  # the library the case imports
    flags: tuple[str, ...] = ()  # what the user tells supervise (only where no profile knows the layout)

    def missing(self) -> str | None:
        """Why this case cannot run here, or None."""
        if importlib.util.find_spec(self.needs) is None:
            return f"{self.needs} is not installed (scripts/setup.sh installs it)"
        return None


CASES = {c.id: c for c in (
    Case("hf", "hf-trainer", "hf_train.py", needs="transformers"),
    Case("lightning-copy", "lightning", "lightning_train.py", ("--save-last", "true"), needs="lightning"),
    Case("lightning-link", "lightning", "lightning_train.py", ("--save-last", "link"), needs="lightning"),
    Case("torch-save-inplace", "torch-save", "torchsave_train.py", ("--mode", "inplace")),
    Case("torch-save-replace", "torch-save", "torchsave_train.py", ("--mode", "replace")),
    Case("dcp", "dcp", "dcp_train.py"),
    Case("accelerate", "accelerate", "accelerate_train.py", subdir="checkpoints", needs="accelerate"),
    # layouts of libraries not installed (trainers/layout_train.py)
    Case("deepspeed-layout", "deepspeed", "layout_train.py", ("--layout", "deepspeed")),
    Case("megatron-layout", "megatron", "layout_train.py", ("--layout", "megatron")),
    Case("orbax-layout", "orbax", "layout_train.py", ("--layout", "orbax")),
    Case("generic-marker", "generic", "layout_train.py", ("--layout", "generic"), flags=("--marker", "DONE")),
)}


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return out


@dataclass
class Poller:
    """tests/frameworks/poller.py as a process: every sighting of the persistent side."""

    proc: subprocess.Popen
    out: Path

    @classmethod
    def start(cls, profile: str, directory: Path, out: Path) -> "Poller":
        directory.mkdir(parents=True, exist_ok=True)
        with open(out.with_suffix(".err"), "w") as err:
            proc = subprocess.Popen([sys.executable, str(HERE / "poller.py"), profile, str(directory), str(out)],
                                    stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, **OFFLINE})
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", "the poller did not start"
        return cls(proc, out)

    def sightings(self) -> list[dict[str, Any]]:
        return read_lines(self.out)

    def torn(self) -> list[dict[str, Any]]:
        return [s for s in self.sightings() if not s["ok"]]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Attempt:
    n: int
    proc: subprocess.Popen
    progress: Path
    started: float
    rc: int | None = None

    def lines(self, ev: str | None = None) -> list[dict[str, Any]]:
        return [x for x in read_lines(self.progress) if ev is None or x["ev"] == ev]

    def saved(self) -> list[int]:
        return [x["step"] for x in self.lines("saved")]

    def start_step(self) -> dict[str, Any] | None:
        got = self.lines("start")
        return got[0] if got else None


@dataclass
class Run:
    """One scratch area and the attempts made in it."""

    case: Case
    root: Path
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def out(self) -> Path:
        return self.root / "node-local" / "out"

    @property
    def local(self) -> Path:
        return self.out / self.case.subdir if self.case.subdir else self.out

    @property
    def persistent(self) -> Path:
        return self.root / "persistent"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    def argv(self, n: int, *, steps: int, save_every: int, step_sleep: float = 0.0, save_pause: float = 0.0,
             restore: bool = True, settle: str | None = None, flags: tuple[str, ...] = (),
             trainer_args: tuple[str, ...] = ()) -> list[str]:
        sup = [sys.executable, "-m", "supervisor", "--run-dir", str(self.run_dir), "--gpu-every", "0",
               "--checkpoint-timeout", "20s", "--checkpoints", str(self.local), str(self.persistent)]
        if restore:
            sup.append("--restore")
        if settle is not None:
            sup += ["--settle", settle]
        train = [sys.executable, str(TRAINERS / self.case.trainer), "--out", str(self.out),
                 "--progress", str(self.root / f"progress-{n}.jsonl"), "--steps", str(steps),
                 "--save-every", str(save_every), "--step-sleep", str(step_sleep), "--save-pause", str(save_pause),
                 *self.case.args, *trainer_args]
        return [*sup, *self.case.flags, *flags, "--", *train]

    def start(self, **kw: Any) -> Attempt:
        n = len(self.attempts) + 1
        self.root.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SLURM_", "PBS_"))}
        env.update(OFFLINE)
        env["PYTHONPATH"] = str(ROOT)
        with open(self.root / f"supervise-{n}.out", "w") as out, open(self.root / f"supervise-{n}.err", "w") as err:
            proc = subprocess.Popen(self.argv(n, **kw), stdout=out, stderr=err, env=env, cwd=self.root,
                                    start_new_session=True)
        a = Attempt(n, proc, self.root / f"progress-{n}.jsonl", time.monotonic())
        self.attempts.append(a)
        return a

    def wait(self, a: Attempt, timeout: float = 120) -> int:
        try:
            a.rc = a.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(a.proc.pid, signal.SIGKILL)
            a.proc.wait()
            raise AssertionError(f"supervise attempt {a.n} did not finish in {timeout}s:\n{self.stderr(a)}") from None
        return a.rc

    def run(self, timeout: float = 120, **kw: Any) -> Attempt:
        a = self.start(**kw)
        self.wait(a, timeout)
        return a

    def preempt(self, a: Attempt, *, at_step: int, timeout: float = 60) -> None:
        """SIGTERM to supervise once the trainer has reached ``at_step`` (between two saves,
        as a preemption lands at no particular moment), then wait for it to finish."""
        deadline = time.monotonic() + timeout
        while max([x["step"] for x in a.lines("step")], default=-1) < at_step:
            if a.proc.poll() is not None:
                raise AssertionError(f"supervise ended before step {at_step}:\n{self.stderr(a)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no step {at_step} in {timeout}s:\n{self.stderr(a)}")
            time.sleep(0.02)
        a.proc.send_signal(signal.SIGTERM)
        self.wait(a, timeout)

    def wipe_local(self) -> None:
        """The next attempt lands on another node: an empty node-local disk."""
        shutil.rmtree(self.root / "node-local", ignore_errors=True)

    def stderr(self, a: Attempt) -> str:
        return (self.root / f"supervise-{a.n}.err").read_text()[-4000:]

    def events(self, a: Attempt | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        evs = read_lines(self.run_dir / "events.jsonl")
        return [e for e in evs if (a is None or e.get("attempt") == a.n) and (kind is None or e["kind"] == kind)]

    def end(self, a: Attempt) -> dict[str, Any]:
        (end,) = self.events(a, "end")
        return end

    def durable(self) -> list[int]:
        return durable_steps(self.case.profile, self.persistent)

    def loaded(self) -> dict[str, int | str]:
        return load_all(self.case.profile, self.persistent)
