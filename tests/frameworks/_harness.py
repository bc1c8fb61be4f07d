"""Drive the real ``supervise`` around a real framework trainer, with a reader polling the
persistent side. Shared by tests/frameworks and bench/frameworks.py.

One ``Case`` is one way a library checkpoints (HF ``Trainer``, Lightning with a ``last.ckpt``
copy or link, ``torch.save`` in place or through ``os.replace``, DCP, Accelerate). A ``Run``
is one scratch area: the node-local directory the trainer writes, the persistent directory,
the run directory, and one ``attempt`` after another (a requeue), each a ``supervise``
process whose output goes to files.
"""

from __future__ import annotations

import hashlib
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
    ranks: int = 1  # more than one: the trainer runs under torchrun (gloo on the CPU)
    checker: str = ""  # checkers.CHECKERS' loader for this layout, when not the profile's own

    @property
    def loader(self) -> str:
        return self.checker or self.profile

    def missing(self) -> str | None:
        """Why this case cannot run here, or None."""
        try:
            found = importlib.util.find_spec(self.needs)
        except ModuleNotFoundError:  # orbax.checkpoint without orbax
            found = None
        if found is None:
            return f"{self.needs} is not installed (scripts/setup.sh installs it)"
        return None

    def launch(self) -> list[str]:
        """How the trainer is started: python, or torchrun with this many ranks."""
        if self.ranks > 1:
            return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={self.ranks}"]
        return [sys.executable]


def ds_extensions(prefix: str = sys.prefix) -> str:
    """Where DeepSpeed's JIT-built comm op lives. DeepSpeed builds one op at its first
    ``init_distributed`` (about 35 s, minutes on a busy machine); scripts/build-deepspeed-ops.sh
    builds it once here, and every run reuses it. One directory per environment path: the
    build's flags name the venv's include paths, and another path would rebuild it (and a
    build killed half-way leaves a lock that makes every later load wait forever)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return os.environ["TORCH_EXTENSIONS_DIR"]
    key = hashlib.sha1(os.path.abspath(prefix).encode()).hexdigest()[:10]
    return os.path.join(os.path.expanduser("~/.cache/supervise/torch_extensions"), key)


DS_EXTENSIONS = ds_extensions()


CASES = {c.id: c for c in (
    Case("hf", "hf-trainer", "hf_train.py", needs="transformers"),
    Case("lightning-copy", "lightning", "lightning_train.py", ("--save-last", "true"), needs="lightning"),
    Case("lightning-link", "lightning", "lightning_train.py", ("--save-last", "link"), needs="lightning"),
    Case("torch-save-inplace", "torch-save", "torchsave_train.py", ("--mode", "inplace")),
    Case("torch-save-replace", "torch-save", "torchsave_train.py", ("--mode", "replace")),
    Case("dcp", "dcp", "dcp_train.py"),
    Case("accelerate", "accelerate", "accelerate_train.py", subdir="checkpoints", needs="accelerate"),
    # DeepSpeed, 2 ranks: ZeRO 0 (rank 0 writes the checkpoint; its pause delays `latest`) and
    # ZeRO 1 (every rank a shard; the pause makes rank 1 late, after rank 0's `latest`)
    Case("deepspeed-zero0", "deepspeed", "deepspeed_train.py", ("--zero", "0", "--late-rank", "0"), needs="deepspeed",
         ranks=2),
    Case("deepspeed-zero1", "deepspeed", "deepspeed_train.py", ("--zero", "1"), needs="deepspeed", ranks=2),
    Case("orbax", "orbax", "orbax_train.py", needs="orbax.checkpoint"),
    # layouts of libraries not installed (trainers/layout_train.py)
    Case("deepspeed-layout", "deepspeed", "layout_train.py", ("--layout", "deepspeed"), checker="deepspeed-layout"),
    Case("megatron-layout", "megatron", "layout_train.py", ("--layout", "megatron")),
    Case("orbax-layout", "orbax", "layout_train.py", ("--layout", "orbax"), checker="orbax-layout"),
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


def _descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


@dataclass
class Poller:
    """tests/frameworks/poller.py as a process: every sighting of the persistent side."""

    proc: subprocess.Popen
    out: Path

    @classmethod
    def start(cls, checker: str, directory: Path | str, out: Path, *, also: tuple[Path, ...] = (),
              weights: bool = False, env: dict[str, str] | None = None) -> "Poller":
        """Watch ``directory``, or a bucket (``s3://BUCKET/PREFIX``, reached with ``env``'s AWS_*
        variables), and ``also`` more directories; ``weights``: a digest of each sighting's weights."""
        extra = [*(a for d in also for a in ("--also", str(d))), *(["--weights"] if weights else [])]
        if isinstance(directory, Path):
            directory.mkdir(parents=True, exist_ok=True)
        else:
            extra += ["--scratch", str(out.with_suffix(".scratch"))]
        with open(out.with_suffix(".err"), "w") as err:
            proc = subprocess.Popen([sys.executable, str(HERE / "poller.py"), checker, str(directory), str(out), *extra],
                                    stdout=subprocess.PIPE, stderr=err, text=True,
                                    env={**os.environ, **OFFLINE, **(env or {})})
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
    to: str = ""  # the persistent side when it is not ``persistent`` below: a bucket, s3://BUCKET/PREFIX
    env: dict[str, str] = field(default_factory=dict)  # more environment for supervise (the store's AWS_*)
    _replays: list[subprocess.Popen] = field(default_factory=list)

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
               "--checkpoint-timeout", "20s", "--checkpoints", str(self.local), self.to or str(self.persistent)]
        if restore:
            sup.append("--restore")
        if settle is not None:
            sup += ["--settle", settle]
        train = self.train_argv(self.out, self.root / f"progress-{n}.jsonl", steps=steps, save_every=save_every,
                                step_sleep=step_sleep, save_pause=save_pause, trainer_args=trainer_args)
        return [*sup, *self.case.flags, *flags, "--", *train]

    def train_argv(self, out: Path, progress: Path, *, steps: int, save_every: int, step_sleep: float = 0.0,
                   save_pause: float = 0.0, trainer_args: tuple[str, ...] = ()) -> list[str]:
        """The trainer's own command line (what follows ``--``)."""
        return [*self.case.launch(), str(TRAINERS / self.case.trainer), "--out", str(out), "--progress", str(progress),
                "--steps", str(steps), "--save-every", str(save_every), "--step-sleep", str(step_sleep),
                "--save-pause", str(save_pause), *self.case.args, *trainer_args]

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SLURM_", "PBS_"))}
        env.update(OFFLINE)
        env["PYTHONPATH"] = str(ROOT)
        env["TORCH_EXTENSIONS_DIR"] = DS_EXTENSIONS
        env.update(self.env)
        return env

    @property
    def replay_out(self) -> Path:
        return self.root / "replay" / "out"

    @property
    def replay_local(self) -> Path:
        """Where the replay's checkpoints are (its ``local``)."""
        return self.replay_out / self.case.subdir if self.case.subdir else self.replay_out

    def replay(self, *, steps: int, save_every: int, trainer_args: tuple[str, ...] = ()) -> subprocess.Popen:
        """The same training without ``supervise`` and never stopped, on a disk of its own: what
        an interrupted and resumed run must end equal to. Its progress goes to ``progress-replay.jsonl``."""
        self.replay_out.mkdir(parents=True, exist_ok=True)
        argv = self.train_argv(self.replay_out, self.root / "progress-replay.jsonl", steps=steps, save_every=save_every,
                               trainer_args=trainer_args)
        with open(self.root / "replay.err", "w") as err:
            proc = subprocess.Popen(argv, stdout=err, stderr=subprocess.STDOUT, env=self.environ(), cwd=self.root,
                                    start_new_session=True)
        self._replays.append(proc)
        return proc

    def start(self, **kw: Any) -> Attempt:
        n = len(self.attempts) + 1
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"supervise-{n}.out", "w") as out, open(self.root / f"supervise-{n}.err", "w") as err:
            proc = subprocess.Popen(self.argv(n, **kw), stdout=out, stderr=err, env=self.environ(), cwd=self.root,
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

    def kill_node(self, a: Attempt) -> None:
        """The node dies: supervise and every process of the training stop at once (SIGSTOP
        first, so none goes on writing while the others are killed), with no stop sequence."""
        tree = _descendants(a.proc.pid) | {a.proc.pid}
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in tree:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        a.rc = a.proc.wait(30)

    def close(self) -> None:
        """After the test, pass or fail: no attempt's supervise or training left running (a
        failed wait used to leave torchrun and its ranks behind for the rest of the session)."""
        for a in self.attempts:
            if a.proc.poll() is None:
                self.kill_node(a)
        for p in self._replays:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

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
        return durable_steps(self.case.loader, self.persistent)

    def loaded(self) -> dict[str, int | str]:
        return load_all(self.case.loader, self.persistent)
