"""The run's state: what the conductor and the stop sequence share, and nothing else.

``RunState`` holds the facts of one attempt that more than one part reads: the plan, the
journal, the parts (child, mirror, notifier, GPU sampler), the trigger, and the job's clock
(``end``, the fitted ``lead``, ``kill_wait``, the last SIGCONT). The conductor (``agent.py``)
and the watches write it; the stop sequence (``stopping.py``) reads it and hands back its
outcome as a ``StopResult`` rather than writing the conductor. Time facts are derived here
from ``policy``'s pure functions and the clock, in one place, so a stop step never calls
back up into the conductor (docs/design.md, "Where each rule lives").
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from supervisor import policy
from supervisor.conduct.health import Faults
from supervisor.policy import Trigger

if TYPE_CHECKING:
    from supervisor.config import Config
    from supervisor.conduct.dispositions import Dispositions
    from supervisor.journal import Journal
    from supervisor.plan import Plan
    from supervisor.ports import ChildPort, MirrorPort, NotifierPort, SamplerPort


class ProgressGaps:
    """The gaps between successive progress marks of this attempt, and the longest gaps of
    earlier ones (their ``stop`` events' ``longest_gap_s``): what the hang bound learns from."""

    def __init__(self, earlier_events: Iterable[Mapping[str, Any]] = ()) -> None:
        self.earlier = [float(e["longest_gap_s"]) for e in earlier_events
                        if e.get("kind") == "stop" and isinstance(e.get("longest_gap_s"), (int, float))]
        self.gaps: list[float] = []
        self._last: float | None = None
        self._changes = 0

    def see(self, mark: float) -> None:
        """A newest progress mark; the first change (start-up to the first progress) is no gap."""
        if self._last is not None and mark > self._last:
            self._changes += 1
            if self._changes > 1:
                self.gaps.append(mark - self._last)
        if self._last is None or mark > self._last:
            self._last = mark

    @property
    def longest(self) -> float | None:
        return round(max(self.gaps), 3) if self.gaps else None


@dataclass
class RunState:
    """One attempt's shared state. ``lead`` starts as the plan's and is fitted to the
    allocation once the end is known (``watches.deadline_watch``); ``kill_wait`` starts as
    the scheduler's default and is read from it at start (``watches.learn_kill_wait``)."""

    plan: Plan
    journal: Journal
    dispositions: Dispositions
    mirror: MirrorPort | None = None   # supervisor.sync.Mirror, when there are pairs
    notifier: NotifierPort | None = None  # supervisor.notify.Notifier, when there are URLs
    gpu: SamplerPort | None = None     # supervisor.gpu.GpuSampler, when sampling
    child: ChildPort | None = None
    agents: Any = None                 # conduct.fleet.Fleet: a multi-node job's node agents
    trigger: Trigger | None = None     # what asked for the stop; the first one wins
    end: float | None = None           # unix seconds when the job ends, when known
    lead: float = field(init=False)
    kill_wait: float | None = field(init=False)
    last_cont: float | None = None     # when SIGCONT came (slurmstepd sends it with the TERM)
    exit_status: int | None = None     # the launcher's own, when known before the stop (spawn failed)
    restarts: int = 0
    restored_from: Path | None = None
    lost: dict[str, Any] = field(default_factory=dict)  # host → (state, reason, first evidence): nodes that died
    faults: Faults = field(init=False)
    gaps: ProgressGaps = field(init=False)

    def __post_init__(self) -> None:
        self.lead = self.plan.lead
        self.kill_wait = self.plan.job.sched.default_kill_wait
        self.faults = Faults(self.journal.emit)  # GPU faults that make this node suspect (conduct/health.py)
        self.gaps = ProgressGaps(self.plan.previous_events)  # the hang bound learns from them

    @property
    def cfg(self) -> Config:
        return self.plan.cfg

    def tree_pids(self) -> set[int]:
        return self.child.tree() if self.child is not None else set()

    def pending(self) -> list[str]:
        """What is not durable, one line each: the mirror's, then what the node agents said at
        the last flush (and the nodes that did not answer it)."""
        return ((self.mirror.pending() if self.mirror is not None else [])
                + (self.agents.pending if self.agents is not None else []))

    def child_running(self) -> bool:
        return self.child is not None and self.child.returncode is None

    def stop_signal(self) -> signal.Signals:
        """What stops the training politely now (policy.stop_signal_for): the stop, the
        emergency stop and a restart's cleanup all ask here."""
        launcher, t = self.plan.launcher, self.trigger
        return policy.stop_signal_for(configured=self.cfg.stop_signal, launcher_signal=launcher.stop_signal,
                                      plain=launcher.name in ("python", "generic"), trigger_signal=t.signal if t else None)

    def signalled_all(self) -> bool:
        """Did the scheduler send the stop signal to every process of the job itself?"""
        t = self.trigger
        return self.plan.job.sched.signalled_all(t.signal if t else None, t.at if t else None, self.last_cont)

    def kill(self) -> float | None:
        """Unix seconds of the hard kill, when known."""
        t = self.trigger
        followed = self.signalled_all() or self.plan.job.sched.kill_follows(t.signal if t else None)
        return policy.hard_kill(end=self.end, kill=policy.killed_at(
            self.trigger, scheduler_signalled_all=followed, kill_wait=self.kill_wait,
            now=time.time(), mono=time.monotonic()))

    def time_left(self) -> float:
        """Seconds the remaining steps may take before the job is killed (inf if never)."""
        kill = self.kill()
        t = self.trigger
        return policy.time_left(end=self.end, kill=kill if kill != self.end else None, lead=self.lead,
                                kill_wait=self.kill_wait, now=time.time(),
                                signalled_for=time.monotonic() - t.at if t and policy.has_stop_budget(t) else None)


@dataclass
class StopResult:
    """What the stop sequence found out: the conductor's end event and exit status read it."""

    trigger: Trigger                   # refined by the scheduler's view (a TERM: preempted, or the time limit)
    exit_status: int | None            # the launcher's own
    stopped_cleanly: bool = False
    no_progress: bool = False
    requeued_by_scheduler: bool = False
    replace: tuple[str, ...] = ()      # dead nodes the next attempt replaces with spares, inside the allocation
    requeued: bool = False             # supervise's requeue step put the job back in the queue

    def status(self, stopped_status: int | str | None, *, not_durable: bool = False,
               not_durable_status: int | None = None) -> int:
        """The exit status (policy.exit_status); the launcher's own stays in the journal."""
        return policy.exit_status(self.exit_status, self.trigger, stopped_cleanly=self.stopped_cleanly,
                                  stopped_status=stopped_status, requeued=self.requeued or self.requeued_by_scheduler,
                                  no_progress=self.no_progress, not_durable=not_durable,
                                  not_durable_status=not_durable_status)
