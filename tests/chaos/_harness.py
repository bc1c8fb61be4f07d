"""Seeded chaos trials: a seed → a plan (which fault, at what moment) → a real run → invariants.

Everything is real: the ``supervise`` CLI as a subprocess, a training child
(``tests/chaos/_trainer.py``) that writes multi-file checkpoints with their marker last,
rsync or the Python copier, tmpfs mounts made read-only or full, SIGKILL and friends. Every
random choice comes from ``random.Random(seed)``; moments are defined by what the trial can
observe (the trainer's k-th checkpoint, the journal's state) plus a seeded delay, and every
wait is a poll with a generous bound. After the run the invariants are checked:

1. the persistent side holds complete checkpoints only (every shard whole, marker present,
   ``latest`` naming a complete one, no staging debris after a clean end); every checkpoint
   the journal says was published is there; every complete local checkpoint is there or,
   only after a SIGKILLed supervisor, missing;
2. no process of the trial (found by a marker in its environment) is left running;
3. the exit status is the expected one, and the journal's ``end`` says the same;
4. ``events.jsonl`` reads with ``read_journal``: whole, or with a torn last line only when
   the supervisor was SIGKILLed, and then the next attempt (run by the trial, as a requeue
   would) appends whole lines after it.

``run_trial(seed)`` returns a ``Result`` whose ``problems`` is empty when all held.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from supervisor.journal import read_journal
from supervisor.policy import owed
from tests.support.checkpoints import problems as ckpt_problems
from tests.support.wait import wait_for

STAGING_PREFIX = ".supervise-staging-"  # what the mirror names its staging entries on the destination
MANIFESTS_DIR = ".supervise"  # the content manifests of the published versions (issue 43): not staging

ROOT = Path(__file__).resolve().parents[2]
FAKE_NVML = Path(__file__).resolve().parent / "_fakenvml"
PY = sys.executable

FAULTS = ("kill-supervisor", "kill-child", "kill-copier", "signal", "read-only", "full", "nvml")
MOUNT_FAULTS = frozenset({"read-only", "full"})
ENDINGS = ("exit", "crash", "TERM", "INT", "USR2")
CRASH_STATUS = 3
# Why the run ended, by how it was ended (docs/journal.md, stop reasons).
REASONS = {"exit": "child-exit", "crash": "child-failed", "TERM": "preempted", "INT": "cancelled",
           "USR2": "deadline", "kill-child": "child-failed", "HUP": "child-failed"}
STOP_SIGNALS = ("TERM", "INT", "USR2")
UNFINISHED_STATUS, NOT_DURABLE_STATUS = 75, 74  # supervise's own (supervisor/policy.py, docs/slurm.md)
# A stop signal taken before any child exists (during the restore, or the instant between the
# signal intake and the spawn) ends the run with status 1, Agent._finish's fallback, not 128+N.

EXIT_BOUND = 60.0  # from the ending to supervise's exit (grace 5 s, checkpoint timeout 20 s)
ORPHAN_BOUND = 15.0
KEEPER_BOUND = 10.0  # after a SIGKILL of supervise, its keeper ends every process of the trial within this (issue 42)
STEP_BOUND = 30.0  # any one wait for the trial's own progress


def can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


# ---------------------------------------------------------------------------------- the plan


@dataclass
class Plan:
    seed: int
    fault: str
    backend: str = "rsync"
    files: int = 3
    size: int = 64 << 10
    every: int = 4
    step_time: float = 0.05
    write_time: float = 0.0
    at_ckpt: int = 1          # the fault comes once the trainer completed this many checkpoints (0: once ready)
    delay: float = 0.0        # … and this many seconds later
    ending: str = "exit"      # how the run is ended after the fault, unless the fault ends it ("fault")
    signal: str | None = None       # fault "signal": which one
    early: float | None = None      # fault "signal": at this many seconds after start, ready or not
    during_restore: bool = False    # fault "signal": while the supervisor restores a big checkpoint
    then: str | None = None         # a second signal to the supervisor (KILL: SIGKILL) during the stop
    then_delay: float = 0.0
    together: bool = False          # fault "signal" USR1: the ending's stop signal follows it at once
    hold: float = 0.0         # read-only / full: seconds until the destination comes back
    through_end: bool = False  # read-only / full: … only after supervise has exited
    victim: int = 0           # kill-copier: which of the copier's processes (by pid order, modulo)
    nvml: dict | None = None  # fake GPUs (FakeGpu fields) and init_error
    gpu_every: str = "0"
    sync_every: str = "10m"
    tmpfs_mb: int = 512

    def describe(self) -> str:
        defaults = Plan(seed=self.seed, fault=self.fault)
        d = {k: v for k, v in asdict(self).items()
             if k in ("backend", "ending") or (v not in (None, False) and v != getattr(defaults, k))}
        return f"seed={self.seed} fault={self.fault} " + " ".join(f"{k}={json.dumps(v, separators=(',', ':')) if not isinstance(v, str) else v}"
                                                     for k, v in d.items() if k != "fault")

    @property
    def supervisor_killed(self) -> bool:
        return self.fault == "kill-supervisor" or self.then == "KILL"


def make_plan(seed: int, *, mounts: bool = True) -> Plan:
    """The seed's plan. Without ``mounts`` (not root) the mount faults are not drawn."""
    rng = random.Random(seed)
    fault = rng.choice([f for f in FAULTS if mounts or f not in MOUNT_FAULTS])
    p = Plan(seed=seed, fault=fault)
    p.backend = rng.choice(["rsync", "python"])
    p.files = rng.randint(2, 5)
    p.size = rng.choice([16 << 10, 64 << 10, 256 << 10, 1 << 20])
    p.every = rng.randint(3, 6)
    p.write_time = rng.choice([0.0, 0.0, 0.05, 0.2])
    p.at_ckpt = rng.randint(0, 4)
    p.delay = round(rng.uniform(0, p.every * p.step_time + p.write_time), 3)
    p.ending = rng.choice(ENDINGS)
    p.sync_every = rng.choice(["10m", "10m", "1s"])
    if fault == "kill-supervisor":
        p.ending = "fault"
        if rng.random() < 0.35:  # SIGKILL while the stop sequence runs
            p.ending = rng.choice(STOP_SIGNALS)
            p.then, p.then_delay = "KILL", round(rng.uniform(0, 0.6), 3)
    elif fault == "kill-child":
        p.ending = "fault"
    elif fault == "kill-copier":
        p.backend = "rsync" if rng.random() < 0.75 else "python"
        p.files = rng.randint(3, 6)
        p.size = rng.choice([1 << 20, 2 << 20, 4 << 20])
        p.victim = rng.randint(0, 5)
    elif fault == "signal":
        p.signal = rng.choice(["TERM", "INT", "USR2", "USR1", "HUP"])
        r = rng.random()
        if r < 0.15:
            p.early = round(rng.uniform(0.0, 0.8), 3)
        elif r < 0.3 and p.signal in STOP_SIGNALS:
            p.during_restore = True  # a restore big enough to be caught in the act
            p.files, p.size = 16, 8 << 20
        if p.signal in STOP_SIGNALS:
            p.ending = "fault"
            if rng.random() < 0.4:
                p.then = rng.choice(["TERM", "INT", "USR1", "USR2"])
                p.then_delay = round(rng.uniform(0, 0.5), 3)
        # HUP is passed on and kills the training (it does not catch it): 129. When it comes
        # before there is a child it is dropped, and the plan's ending ends the run.
        if p.signal == "USR1" and p.ending in STOP_SIGNALS and p.early is None:
            p.together = rng.random() < 0.3
    elif fault in MOUNT_FAULTS:
        p.hold = round(rng.uniform(0.3, 2.5), 3)
        p.through_end = rng.random() < 0.3
        if fault == "full":
            p.tmpfs_mb = 64
            p.size = min(p.size, 256 << 10)
    elif fault == "nvml":
        p.gpu_every = rng.choice(["0.1", "0.2", "0.5"])
        p.nvml = _nvml_spec(rng)
    return p


NVML_METRICS = ["util", "memory", "power", "energy", "temperature", "clocks", "clock_events", "processes",
                "ecc", "remapped_rows", "xid", "name", "mig"]
NVML_CODES = [3, 4, 13, 999, 10]  # NotSupported, NoPermission, FunctionNotFound, Unknown, Timeout


def _nvml_spec(rng: random.Random) -> dict:
    gpus = []
    for _ in range(rng.randint(1, 4)):
        g: dict[str, Any] = {}
        bad = rng.sample(NVML_METRICS, rng.randint(0, 4))
        if bad:
            g["errors"] = {m: rng.choice(NVML_CODES) for m in bad}
        if rng.random() < 0.3:
            g["lost_after"] = round(rng.uniform(0.1, 3.0), 3)
        if rng.random() < 0.3:
            g["xids"] = [[round(rng.uniform(0.1, 2.0), 3), rng.choice([13, 31, 48, 63, 79])]]
        if rng.random() < 0.25:
            g["slow"] = {rng.choice(["util", "memory", "power", "processes", "ecc"]): round(rng.uniform(0.3, 4.0), 3)}
        gpus.append(g)
    init_error = rng.choice([None] * 8 + [9, 12, 999])
    return {"gpus": gpus, "init_error": init_error}


# ---------------------------------------------------------------------------------- /proc


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    return bool(stat) and stat.rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")


def marked(marker: str) -> dict[int, str]:
    """Live processes whose environment carries this trial's marker: pid → command line."""
    needle = f"CHAOS_TRIAL={marker}".encode()
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        env = _read(f"/proc/{name}/environ")
        if needle in env.split(b"\0") and _alive(int(name)):
            out[int(name)] = _read(f"/proc/{name}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
    return out


def copiers(marker: str) -> list[int]:
    """This trial's copier processes (rsync and its forks, or the Python copier), by pid."""
    out = []
    for pid, cmd in marked(marker).items():
        comm = _read(f"/proc/{pid}/comm").strip()
        if comm == b"rsync" or "_pycopy.py" in cmd:
            out.append(pid)
    return sorted(out)


def caught(pid: int, *sigs: int) -> bool:
    """Does ``pid`` have a handler for every one of ``sigs`` (SigCgt)?"""
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith(b"SigCgt:"):
            mask = int(line.split()[1], 16)
            return all(mask & (1 << (s - 1)) for s in sigs)
    return False


# ---------------------------------------------------------------------------------- the trial


class TrialError(Exception):
    """The trial could not go on (a bound ran out); a problem, with what was seen."""


def sig(name: str) -> signal.Signals:
    return signal.Signals["SIG" + name]


def shell_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class Result:
    plan: Plan
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    status: int | None = None
    seconds: float = 0.0
    where: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        verdict = "ok  " if self.ok else "FAIL"
        extra = f" [{'; '.join(self.notes)}]" if self.notes else ""
        return f"{verdict} {self.seconds:5.1f}s status={self.status} {self.plan.describe()}{extra}"

    def explain(self) -> str:
        lines = [self.line(), f"replay: python -m tests.chaos --seed {self.plan.seed} --trials 1"]
        lines += [f"  problem: {p}" for p in self.problems]
        if self.where is not None:
            lines.append(f"  trial directory: {self.where}")
        return "\n".join(lines)


class Trial:
    def __init__(self, plan: Plan, where: Path, *, mounts: bool) -> None:
        self.plan = plan
        self.where = where
        self.mounts = mounts
        self.marker = f"{plan.seed}-{uuid.uuid4().hex[:12]}"
        self.local = where / "local"
        self.run_dir = where / "run"
        self.ready = where / "trainer.ready"
        self.until = where / "trainer.until"
        self.mnt: Path | None = None
        self.dst = where / "persistent"
        self.result = Result(plan, where=where)
        self.proc: subprocess.Popen | None = None
        self.sent: list[str] = []  # what the trial did, in order, for the record
        self.ready_at_signal: bool | None = None
        self.killed = False  # the supervisor died of a SIGKILL the trial sent (not only planned)
        self.hup_forwarded = False

    # -- set-up -----------------------------------------------------------------------

    def setup(self) -> None:
        self.where.mkdir(parents=True, exist_ok=True)
        if self.mounts:
            self.mnt = self.where / "mnt"
            self.mnt.mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.plan.tmpfs_mb}m", "tmpfs", str(self.mnt)],
                           check=True, capture_output=True)
            self.dst = self.mnt / "ckpt"
        self.dst.mkdir()
        if self.plan.during_restore:  # a big checkpoint for the supervisor to restore first
            from tests.support.checkpoints import write_checkpoint

            write_checkpoint(self.dst, "step_000100", style="dcp", shards=self.plan.files, size=self.plan.size)
            (self.dst / "latest").write_text("step_000100")
        restore = "true" if self.plan.during_restore else "false"
        (self.where / "supervise.toml").write_text(
            f'[[sync]]\nname = "ckpt"\nkind = "checkpoint"\nfrom = "{self.local}"\nto = "{self.dst}"\n'
            f"restore = {restore}\n")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SUPERVISE_", "SLURM_", "PBS_", "CUDA_VISIBLE_DEVICES", "CHAOS_"))}
        env["CHAOS_TRIAL"] = self.marker
        path = [str(ROOT)]
        if self.plan.nvml is not None:
            path.insert(0, str(FAKE_NVML))
            env["CHAOS_FAKE_NVML"] = json.dumps(self.plan.nvml)
        env["PYTHONPATH"] = os.pathsep.join(path)
        return env

    def argv(self, exit_status: int) -> list[str]:
        p = self.plan
        return [PY, "-m", "supervisor", "--config", str(self.where / "supervise.toml"), "--run-dir", str(self.run_dir),
                "--grace", "5s", "--checkpoint-timeout", "3s" if p.through_end else "20s", "--sync-backend", p.backend,
                "--sync-every", p.sync_every, "--gpu-every", p.gpu_every,
                "--gpu-backend", "nvml" if p.nvml is not None else "none", "--",
                PY, "-m", "tests.chaos._trainer", str(self.local), "--every", str(p.every), "--files", str(p.files),
                "--size", str(p.size), "--step-time", str(p.step_time), "--write-time", str(p.write_time),
                "--ready", str(self.ready), "--until", str(self.until), "--exit-status", str(exit_status)]

    def start(self, name: str = "supervise") -> subprocess.Popen:
        exit_status = CRASH_STATUS if self.plan.ending == "crash" else 0
        out = open(self.where / f"{name}.out", "w")
        err = open(self.where / f"{name}.err", "w")
        with out, err:
            return subprocess.Popen(self.argv(exit_status), env=self.env(), cwd=ROOT, stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL)

    # -- observing ----------------------------------------------------------------------

    def events(self) -> list[dict]:
        return read_journal(self.run_dir).events

    def event(self, kind: str, **match: Any) -> dict | None:
        return next((e for e in self.events() if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())), None)

    def local_complete(self) -> list[str]:
        try:
            return sorted(d.name for d in self.local.iterdir() if d.name.startswith("step_") and (d / ".metadata").exists())
        except FileNotFoundError:
            return []

    def exited(self) -> bool:
        assert self.proc is not None
        return self.proc.poll() is not None

    def wait_moment(self) -> None:
        """Until the trainer has completed ``at_ckpt`` checkpoints (or is ready), then ``delay``."""
        p = self.plan
        if p.at_ckpt == 0:
            wait_for(lambda: self.ready.exists() or self.exited(),
                     STEP_BOUND, "the trainer to be ready", interval=0.01, error=TrialError)
        else:
            wait_for(lambda: len(self.local_complete()) >= p.at_ckpt or self.exited(),
                     STEP_BOUND, f"local checkpoint {p.at_ckpt}", interval=0.01, error=TrialError)
        time.sleep(p.delay)

    def child_pid(self) -> int:
        return wait_for(lambda: (self.event("spawn") or {}).get("pid"),
                        STEP_BOUND, "the spawn event", interval=0.01, error=TrialError)

    def send(self, name: str) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig(name))
        self.sent.append(name)

    # -- faults -------------------------------------------------------------------------

    def fault(self) -> None:
        p = self.plan
        if p.fault == "signal" and p.early is not None:
            time.sleep(p.early)
            self.ready_at_signal = self.ready.exists()
            self.send(p.signal)
            self._note_fatal()
            return
        if p.fault == "signal" and p.during_restore:
            wait_for(lambda: self.event("state", to="restoring") or self.exited(),
                     STEP_BOUND, "the restore to begin", interval=0.002, error=TrialError)
            self.ready_at_signal = False
            spawned = self.event("spawn") is not None
            self.send(p.signal)
            if spawned:
                self.result.notes.append("restore was over before the signal")
            return
        self.child_pid()
        self.wait_moment()
        self.ready_at_signal = self.ready.exists()
        if p.fault == "kill-supervisor":
            if p.ending == "fault":
                self.send("KILL")
            return  # else the ending's signal, then KILL (see end())
        if p.fault == "kill-child":
            os.kill(self.child_pid(), signal.SIGKILL)
            self.sent.append("KILL child")
        elif p.fault == "signal":
            self.send(p.signal)
            self._note_fatal()
        elif p.fault == "kill-copier":
            pids = wait_for(lambda: copiers(self.marker) or self.exited(),
                            STEP_BOUND, "a copier at work", interval=0.001, error=TrialError)
            if pids is True:
                raise TrialError("supervise exited before a copier was seen")
            victim = pids[p.victim % len(pids)]
            comm = _read(f"/proc/{victim}/comm").decode().strip()
            try:
                os.kill(victim, signal.SIGKILL)
                self.sent.append(f"KILL {comm} ({p.victim % len(pids) + 1} of {len(pids)})")
            except ProcessLookupError:
                self.result.notes.append("the copier ended before the kill")
        elif p.fault == "read-only":
            assert self.mnt is not None
            # A tmpfs with a file open for writing refuses to go read-only (EBUSY): retry.
            wait_for(lambda: self._remount("ro"), STEP_BOUND, "the destination to go read-only", interval=0.005, error=TrialError)
            self.sent.append("ro")
            time.sleep(p.hold)
            if not p.through_end:
                self.mend()
        elif p.fault == "full":
            assert self.mnt is not None
            self._fill(self.mnt / "ballast")
            self.sent.append("full")
            time.sleep(p.hold)
            if not p.through_end:
                self.mend()
        elif p.fault == "nvml":
            time.sleep(1.0)  # let a few ticks go by with the fake GPUs' errors

    def _note_fatal(self) -> None:
        """Wait for the supervisor to take a USR1 or HUP before the ending comes (a USR1 taken at
        the same instant as a stop is its own case: ``then=USR1``, ``usr1_during_stop``). After
        a HUP: did the supervisor pass it on (it kills the training) or drop it?"""
        if self.plan.signal == "USR1" and not self.plan.together:
            wait_for(lambda: self.exited() or self.event("checkpoint-request", why="received SIGUSR1")
                     or self.event("signal", signal="SIGUSR1"), STEP_BOUND, "the USR1 in the journal",
                     interval=0.01, error=TrialError)
        if self.plan.signal != "HUP":
            return
        took = wait_for(lambda: self.exited() or self.event("signal", signal="SIGHUP"),
                        STEP_BOUND, "the HUP in the journal", interval=0.01, error=TrialError)
        self.hup_forwarded = took is not True and took.get("action") == "forwarded"

    def mend(self) -> None:
        """The destination comes back: read-write again, or room again."""
        assert self.mnt is not None
        if self.plan.fault == "read-only":
            self._remount("rw", check=True)
            self.sent.append("rw")
        else:
            (self.mnt / "ballast").unlink()
            self.sent.append("room")

    def _remount(self, opts: str, check: bool = False) -> bool:
        r = subprocess.run(["mount", "-o", f"remount,{opts}", str(self.mnt)], capture_output=True, text=True)
        if check and r.returncode:
            raise TrialError(f"remount {opts}: {r.stderr.strip()}")
        return r.returncode == 0

    @staticmethod
    def _fill(path: Path) -> None:
        block = b"\0" * (1 << 20)
        with open(path, "wb", buffering=0) as f:
            while True:
                try:
                    f.write(block)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
        # Fill the last crumbs too, so even a small shard finds no room.
        try:
            with open(path, "ab", buffering=0) as f:
                while f.write(b"\0" * 4096):
                    pass
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise

    def end(self) -> None:
        """End the run the plan's way (unless the fault already did), and wait for the exit."""
        p = self.plan
        assert self.proc is not None
        if self.hup_forwarded:
            pass  # the training dies of it; the supervisor ends the run
        elif p.ending in ("exit", "crash") and not self.exited():
            if p.fault in MOUNT_FAULTS or p.fault == "kill-copier":
                self._one_more_checkpoint()
            self.until.write_text("end")
            self.sent.append(f"until ({p.ending})")
        elif p.ending in STOP_SIGNALS:
            if p.fault in MOUNT_FAULTS or p.fault == "kill-copier":
                self._one_more_checkpoint()
            self.send(p.ending)
        if p.then is not None:
            time.sleep(p.then_delay)
            self.send(p.then)
        try:
            self.proc.wait(EXIT_BOUND)
        except subprocess.TimeoutExpired:
            raise TrialError(f"supervise did not exit within {EXIT_BOUND:g}s of the ending") from None

    def _one_more_checkpoint(self) -> None:
        """After a destination fault, let the training write on, so recovery is tested too."""
        n = len(self.local_complete())
        wait_for(lambda: len(self.local_complete()) > n or self.exited(),
                 STEP_BOUND, "one more local checkpoint", interval=0.01, error=TrialError)

    # -- invariants ---------------------------------------------------------------------

    def expected_status(self, events: list[dict]) -> tuple[set[int], str | None]:
        """The statuses (shell style) this run may end with, and the journal's end reason."""
        expected, reason = self._expected_status(events)
        # docs/slurm.md, "Exit status of a stop": a stop that leaves the training unfinished and
        # not requeued (the trial never requeues) is 75 where the training said 0; and a run that
        # would look successful with something not durable at the end (end.not_durable) is 74.
        stopped = reason in (REASONS["TERM"], REASONS["INT"], REASONS["USR2"])
        expected = {UNFINISHED_STATUS if s == 0 and stopped else s for s in expected}
        end = next((e for e in events if e["kind"] == "end"), None)
        if end is not None and owed(end.get("not_durable") or []) and not self.killed:
            expected = {NOT_DURABLE_STATUS if s in (0, UNFINISHED_STATUS) else s for s in expected}
        return expected, reason

    def _expected_status(self, events: list[dict]) -> tuple[set[int], str | None]:
        """As the training and the signals have it, before supervise's own statuses (75, 74)."""
        p = self.plan
        if self.killed:
            return {137}, None
        if p.fault == "kill-child":
            return {137}, REASONS["kill-child"]
        if p.fault == "signal":
            n = sig(p.signal).value
            started = any(e["kind"] == "start" for e in events)
            spawned = any(e["kind"] == "spawn" for e in events)
            took = next((e for e in events if e["kind"] == "signal" and e["signal"] == "SIG" + p.signal), None)
            if not started and took is None:  # before the journal: the default action (Python: KeyboardInterrupt)
                return {128 + n} | ({1} if p.signal == "INT" else set()), None
            if p.signal in STOP_SIGNALS:
                reason = REASONS[p.signal]
                if not spawned:
                    return {128 + n}, reason
                if not self.ready_at_signal:
                    # The stop reached a trainer that may not have had its handlers yet:
                    # it saved and exited 0, or died of the signal (INT: KeyboardInterrupt, 1).
                    return {0, 128 + sig("TERM" if p.signal == "USR2" else p.signal).value, 1}, reason
                return {0}, reason
            if p.signal == "HUP" and spawned and took is not None and took.get("action") == "forwarded":
                return {129}, REASONS["HUP"]
        if p.ending == "crash":
            return {CRASH_STATUS}, REASONS["crash"]
        return {0}, REASONS[p.ending]

    def check(self, returncode: int) -> None:
        res = self.result
        status = shell_status(returncode)
        res.status = status
        p = self.plan
        self.killed = p.supervisor_killed and returncode == -signal.SIGKILL
        if p.supervisor_killed and not self.killed:
            res.notes.append("supervise was gone before the SIGKILL")
        journal = read_journal(self.run_dir)
        events = journal.events
        expected, reason = self.expected_status(events)
        problems = res.problems
        if status not in expected:
            problems.append(f"exit status {status}, expected {sorted(expected)} (sent {self.sent})")
        started = [e for e in events if e["kind"] == "start"]
        ends = [e for e in events if e["kind"] == "end"]
        # 4. the journal
        # After a SIGKILL the keeper may have ended supervise's torn last line before its own
        # `keeper-killed`: that fragment is then the one bad line.
        if len(journal.bad_lines) > (1 if self.killed else 0):
            problems.append(f"journal has bad lines: {journal.bad_lines[:3]}")
        if journal.torn_last_line is not None:
            if self.killed:
                res.notes.append("torn last line")
            else:
                problems.append(f"journal's last line is torn without a SIGKILL: {journal.torn_last_line[:80]!r}")
        if started:
            if events[0]["kind"] != "start" or len(started) != 1:
                problems.append(f"journal does not begin with one start: {[e['kind'] for e in events[:3]]}")
            if self.killed:
                if ends:
                    res.notes.append("journal ended before the SIGKILL")
            elif len(ends) != 1 or events[-1]["kind"] != "end":
                problems.append(f"journal does not end with one end: last kinds {[e['kind'] for e in events[-3:]]}")
            else:
                end = ends[0]
                if end["exit_status"] != status:
                    problems.append(f"end.exit_status {end['exit_status']} but supervise exited {status}")
                if reason is not None and end["reason"] != reason:
                    problems.append(f"end.reason {end['reason']!r}, expected {reason!r}")
                exits = [e for e in events if e["kind"] == "child-exit"]
                if exits and exits[-1]["exit_status"] != end.get("launcher_status"):  # supervise's may be 75 or 74
                    problems.append(f"child-exit status {exits[-1]['exit_status']} but end.launcher_status "
                                    f"{end.get('launcher_status')}")
        elif not (p.fault == "signal" and p.early is not None):
            problems.append("no start event in the journal")
        # 1. the persistent side
        self.check_persistent(events, clean_end=not self.killed and bool(ends), broken=p.through_end)
        if p.fault == "kill-copier":
            self.check_copier_fault(events)
        if p.fault == "nvml":
            self.check_nvml(events)
        if p.fault in MOUNT_FAULTS and not any(e["kind"] == "sync-failed" for e in events):
            res.notes.append("no sync failed while the destination was broken")

    def check_persistent(self, events: list[dict], *, clean_end: bool, broken: bool = False) -> None:
        """Invariant 1. ``clean_end``: supervise ended by itself; ``broken``: with the
        destination still read-only or full, so what is missing must be in ``not_durable``."""
        p, problems = self.plan, self.result.problems
        problems += [f"persistent: {x}" for x in ckpt_problems(self.dst, style="dcp", shards=p.files, size=p.size)]
        visible = sorted(n for n in os.listdir(self.dst) if not n.startswith("."))
        published = {e["checkpoint"] for e in events if e["kind"] == "publish" and not e.get("pointer")}
        for name in sorted(published - set(visible)):
            problems.append(f"journal says {name} was published but it is not on persistent storage")
        if not clean_end:
            return
        end = next(e for e in events if e["kind"] == "end")
        # What is not yet durable, less what never was a complete checkpoint: a checkpoint still
        # being written, one the training died in (torn), or a local side that was never
        # created (stopped before the spawn).
        not_durable = [x for x in end.get("not_durable", [])
                       if "incomplete" not in x and "(torn:" not in x and "does not exist" not in x]

        def owned_up(name: str) -> bool:  # end.not_durable names this checkpoint
            return any(f" {name} " in f" {x} " for x in not_durable)

        hidden = sorted(n for n in os.listdir(self.dst) if n.startswith(".") and n != MANIFESTS_DIR)
        if hidden and broken and self.plan.fault == "read-only":
            # A staging directory the copy made before the remount cannot be removed from a
            # read-only filesystem: the journal must own up to it, the next attempt removes it.
            owned = [h for h in hidden if owned_up(h.removeprefix(STAGING_PREFIX))]
            if owned:
                self.result.notes.append(f"staging left on the read-only destination: {owned}")
            hidden = sorted(set(hidden) - set(owned))
        if hidden:
            problems.append(f"staging left on persistent storage after a clean end: {hidden}")
        for name in self.local_complete():
            if name in visible:
                continue
            if not broken:
                problems.append(f"complete local checkpoint {name} is not on persistent storage "
                                f"(not_durable: {end.get('not_durable')})")
            elif not owned_up(name):
                problems.append(f"complete local checkpoint {name} is neither on persistent storage nor in "
                                f"end.not_durable {not_durable}")
        if broken:
            if not not_durable and set(self.local_complete()) - set(visible):
                problems.append("the destination was broken at the end but end.not_durable is empty")
            return
        if not_durable:
            problems.append(f"end.not_durable after the destination came back: {not_durable}")
        local_latest = self._pointer(self.local / "latest")
        if local_latest and local_latest in self.local_complete():
            dst_latest = self._pointer(self.dst / "latest")
            if dst_latest != local_latest:
                problems.append(f"persistent latest -> {dst_latest}, local latest -> {local_latest}")

    @staticmethod
    def _pointer(path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            return None

    def check_copier_fault(self, events: list[dict]) -> None:
        if not any(s.startswith("KILL ") for s in self.sent):
            return
        failed = [e for e in events if e["kind"] == "sync-failed"]
        if not failed:
            # A copier's fork may die after its work is done without failing the copy.
            self.result.notes.append("the killed copier did not fail a pass")
        elif not any("killed" in e.get("error", "") or "exit" in e.get("error", "") for e in failed):
            self.result.notes.append(f"sync-failed: {failed[0].get('error')}")

    def check_nvml(self, events: list[dict]) -> None:
        spec = self.plan.nvml or {}
        kinds = {e["kind"] for e in events}
        if spec.get("init_error") is not None:
            if "gpu-none" not in kinds:
                self.result.problems.append("NVML failed to init but no gpu-none event")
            return
        if "gpu-start" not in kinds and "gpu-none" not in kinds:
            if any("slow" in g for g in spec["gpus"]):  # the open (ECC, names…) was still blocked at the end
                self.result.notes.append("the run ended while the NVML open was still blocked")
            else:
                self.result.problems.append("neither gpu-start nor gpu-none in the journal")
        if "gpu-start" in kinds and "gpu-end" not in kinds and not self.killed:
            self.result.problems.append("gpu-start without gpu-end")
        lost = {e["device"] for e in events if e["kind"] == "gpu-lost"}
        never = {i for i, g in enumerate(spec["gpus"]) if "lost_after" not in g}
        if lost & never:
            self.result.problems.append(f"gpu-lost for devices that never fail: {sorted(lost & never)}")
        csv = self.run_dir / "gpu.csv"
        if csv.exists():
            rows = csv.read_text().splitlines()
            width = len(rows[0].split(","))
            torn = [r for r in rows[1:] if len(r.split(",")) != width]
            if torn:
                self.result.problems.append(f"gpu.csv has rows of the wrong width: {torn[:2]}")

    def no_orphans(self, when: str) -> None:
        try:
            wait_for(lambda: not marked(self.marker),
                     ORPHAN_BOUND, f"no process of the trial left ({when})", interval=0.05, error=TrialError)
        except TrialError:
            left = marked(self.marker)
            self.result.problems.append(f"orphans {when}: {left}")
            self.kill_marked()

    def kill_marked(self) -> dict[int, str]:
        """What the scheduler does when the job's main process dies: kill what is left."""
        left: dict[int, str] = {}
        for _ in range(50):
            now = marked(self.marker)
            if not now:
                break
            left.update(now)
            for pid in now:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        return left

    # -- after a SIGKILLed supervisor: the next attempt ---------------------------------------

    def next_attempt(self) -> None:
        """As a requeue would, once supervise's keeper has ended what the SIGKILL left (no
        scheduler needed: nothing of the trial may be alive ``KEEPER_BOUND`` s later); run
        again into the same run directory."""
        res = self.result
        try:
            wait_for(lambda: not marked(self.marker), KEEPER_BOUND, "the keeper", interval=0.05, error=TrialError)
        except TrialError:
            res.problems.append(f"after the SIGKILL, alive {KEEPER_BOUND:g}s later: {self.kill_marked()}")
        self.attempt2()

    def attempt2(self, *, broken: bool = False) -> None:
        """Run the next attempt into the same run directory and check it; ``broken``: the
        destination may still lack room, so what is missing must be in its ``not_durable``."""
        res = self.result
        self.until.write_text("end")  # the next attempt's training ends at once
        saved, self.plan.ending = self.plan.ending, "exit"
        try:
            proc = self.start("attempt2")
        finally:
            self.plan.ending = saved
        try:
            proc.wait(EXIT_BOUND)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            res.problems.append(f"the next attempt did not exit within {EXIT_BOUND:g}s")
            return
        journal = read_journal(self.run_dir)
        second_end = [e for e in journal.events if e.get("attempt") == 2 and e["kind"] == "end"]
        # 74 when the destination still lacks room: what is missing is named in its not_durable
        ok = {0} | ({NOT_DURABLE_STATUS} if broken and second_end and owed(second_end[-1].get("not_durable") or []) else set())
        if shell_status(proc.returncode) not in ok:
            res.problems.append(f"the next attempt exited {shell_status(proc.returncode)}, expected {sorted(ok)}")
        if journal.torn_last_line is not None:
            res.problems.append("after the next attempt the journal still ends torn")
        if len(journal.bad_lines) > 1:
            res.problems.append(f"after the next attempt: {len(journal.bad_lines)} bad lines (at most 1, the torn one)")
        second = [e for e in journal.events if e.get("attempt") == 2]
        if not second or second[0]["kind"] != "start" or second[-1]["kind"] != "end":
            res.problems.append(f"attempt 2 is not whole: {[e['kind'] for e in second[:1] + second[-1:]]}")
        elif second[-1]["reason"] != "child-exit":
            res.problems.append(f"attempt 2 ended {second[-1]['reason']!r}")
        self.check_persistent(second, clean_end=bool(second) and second[-1]["kind"] == "end", broken=broken)
        self.no_orphans("after the next attempt")

    # -- the whole trial -----------------------------------------------------------------

    def run(self) -> Result:
        res = self.result
        t0 = time.monotonic()
        try:
            self.setup()
            self.proc = self.start()
            try:
                self.fault()
                self.end()
            except TrialError as e:
                res.problems.append(f"{e} (sent {self.sent})")
                self.proc.kill()
                self.proc.wait()
                self.kill_marked()
                return res
            self.check(self.proc.returncode)
            if self.plan.through_end:
                self.mend()
            if self.killed:
                self.next_attempt()
            else:
                self.no_orphans("after supervise exited")
                if self.plan.through_end:  # the requeued attempt, with the destination back
                    self.attempt2(broken=self.plan.fault == "full")
        except Exception as e:  # noqa: BLE001 - a broken trial is a failed trial, with its seed
            res.problems.append(f"trial error: {type(e).__name__}: {e}")
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.kill_marked()
            if self.mnt is not None:
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
            res.seconds = time.monotonic() - t0
            if res.problems:
                for name in ("supervise.err", "attempt2.err"):
                    f = self.where / name
                    if f.exists():
                        tail = f.read_text(errors="replace").splitlines()[-8:]
                        res.problems.append(f"{name} (last lines):\n    " + "\n    ".join(tail))
        return res


def run_plan(plan: Plan, where: Path, *, mounts: bool, keep: bool = False) -> Result:
    """One trial in ``where`` (created; removed after a pass unless ``keep``)."""
    if plan.fault in MOUNT_FAULTS and not mounts:
        raise ValueError(f"{plan.fault} needs mounts (root)")
    result = Trial(plan, where, mounts=mounts).run()
    if result.ok and not keep:
        shutil.rmtree(where, ignore_errors=True)
    return result


def run_trial(seed: int, where: Path, *, mounts: bool | None = None, keep: bool = False) -> Result:
    """The seed's trial; without root, plans are drawn without the mount faults."""
    mounts = can_mount() if mounts is None else mounts
    return run_plan(make_plan(seed, mounts=mounts), where, mounts=mounts, keep=keep)


def usr1_during_stop(where: Path, offset: float) -> Result:
    """USR1 and TERM to supervise at once, ``offset`` s after the trainer's first checkpoint: the
    USR1's "checkpoint now" and the stop sequence's own may be written at the same instant."""
    plan = Plan(seed=-1, fault="signal", backend="python", signal="USR1", ending="TERM", together=True,
                delay=offset, at_ckpt=1)
    return run_plan(plan, where, mounts=False)


def category(plan: Plan) -> str:
    """A short name for what a plan does, e.g. ``kill-supervisor during-stop rsync``."""
    c = [plan.fault]
    if plan.fault == "kill-supervisor":
        c += ["during-stop" if plan.then else "running", plan.backend]
    elif plan.fault == "kill-copier":
        c.append(plan.backend)
    elif plan.fault == "signal":
        c.append(plan.signal or "")
        c += [word for word, on in (("early", plan.early is not None), ("restore", plan.during_restore),
                                    ("then", plan.then is not None), ("together", plan.together)) if on]
    elif plan.fault in MOUNT_FAULTS:
        c.append("through" if plan.through_end else "mended")
    elif plan.fault == "nvml":
        spec = plan.nvml or {"gpus": []}
        if spec.get("init_error") is not None:
            c.append("init")
        elif any("slow" in g for g in spec["gpus"]):
            c.append("slow")
        elif any("lost_after" in g for g in spec["gpus"]):
            c.append("lost")
        else:
            c.append("errors")
    return " ".join(c)
