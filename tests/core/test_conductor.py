"""The conductor in-process, with a fake child, mirror, notifier and launcher (as torch's
``TestAgent`` drives the elastic agent): every branch of the stop sequence in milliseconds.
The end-to-end tests (test_stop_sequence.py, tests/slurm) keep the real parts honest."""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import anyio
import pytest

from supervisor import policy
from supervisor.conduct.agent import Agent
from supervisor.conduct.leader import LeaderRole
from supervisor.config import build_config
from supervisor.journal import read_journal
from supervisor.plan import make_plan
from supervisor.policy import Reason, Trigger
from supervisor.sched import run_dir_id
from supervisor.conduct.stopping import StopSequence

if TYPE_CHECKING:
    from supervisor.conduct.dispositions import Dispositions
    from supervisor.ports import ChildPort, MirrorPort, NotifierPort, SamplerPort

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeDispositions:
    """The agent's signal dispositions, recorded and left alone: the real ones (ignoring TERM
    once the stop is done) would be inherited by every process a later test starts."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def quiet_stray(self, handled: Any) -> None:
        self.calls.append("quiet-stray")

    def ignore_stop(self) -> None:
        self.calls.append("ignore-stop")


@dataclass
class Targets:
    pids: list[int]
    route: str = "launcher"
    skipped: dict = field(default_factory=dict)
    finish: int | None = None


@dataclass
class FakeLauncher:
    name: str = "torchrun"
    checkpoint_route: str = "ranks"
    stop_route: str = "launcher"
    checkpoint_signal: signal.Signals = signal.SIGUSR1
    stop_signal: signal.Signals = signal.SIGTERM
    note: str = ""
    stop_steps: bool = False

    def child_env(self, grace: float) -> dict[str, str]:
        return {}

    def checkpoint_targets(self, pid: int, sig: signal.Signals) -> Targets:
        return Targets([pid + 1, pid + 2], "ranks")

    def stop_targets(self, pid: int) -> Targets:
        return Targets([pid])

    def find_launcher(self, pid: int) -> int:
        return pid


class FakeChild:
    """A training that answers a checkpoint signal by saving (through the fake mirror) and a
    stop signal by exiting 0; ``on_stop=None`` ignores the stop signal."""

    def __init__(self, mirror: "FakeMirror", *, answers: bool = True, on_stop: int | None = 0, save_takes: float = 0.01,
                 broken: bool = False):
        self.broken = broken
        self.pid, self.pgid = 4242, 4242
        self.returncode: int | None = None
        self.exited = anyio.Event()
        self.mirror, self.answers, self.on_stop, self.save_takes = mirror, answers, on_stop, save_takes
        self.sent: list[tuple[str, str, list[int]]] = []   # (signal, route, pids)
        self.stops: list[dict[str, Any]] = []

    async def wait(self) -> int:
        if self.broken:
            raise RuntimeError("the wait broke")
        await self.exited.wait()
        return self.returncode or 0

    def exit(self, status: int) -> None:
        if self.returncode is None:
            self.returncode = status
            self.exited.set()

    def tree(self) -> set[int]:
        return set() if self.returncode is not None else {self.pid}

    def send_to(self, pids: set[int], sig: int, route: str) -> Any:
        self.sent.append((signal.Signals(sig).name, route, sorted(pids)))
        if sig == signal.SIGUSR1 and self.answers:
            self.mirror.save_later(self.save_takes)
        return type("Delivery", (), {"route": route, "targets": sorted(pids)})()

    def send(self, sig: int, route: str = "launcher") -> Any:
        return self.send_to({self.pid}, sig, route)

    async def stop(self, sig: int, grace: float, *, targets=None, route="launcher", already_signalled=False,
                   finish=None) -> dict:
        self.stops.append({"signal": signal.Signals(sig).name, "grace": grace, "already": already_signalled})
        killed = []
        if not already_signalled and self.on_stop is not None:
            self.exit(self.on_stop)
        elif already_signalled:
            self.exit(0)
        else:
            await anyio.sleep(grace)
            self.exit(128 + 9)
            killed = [self.pid]
        return {"signal": signal.Signals(sig).name, "grace_s": grace, "killed": killed, "sent_to": [self.pid],
                "graceful": not killed}

    async def kill_all(self, bound: float = 10.0) -> list[int]:
        self.exit(137)
        return [self.pid]

    def zombie_orphan_waiting(self) -> bool:
        return False

    def reap_orphans(self) -> list[int]:
        return []


@dataclass(frozen=True)
class FakePublished:
    """A publish as the mirror tells it (``sync.Published``): no identity, saved when it landed."""

    completed_at: float | None
    published_at: float
    ident: tuple[str, int] | None = None

    @property
    def saved_at(self) -> float:
        return self.completed_at if self.completed_at is not None else self.published_at


class FakeMirror:
    """The mirror's contract with the agent (docs/sync.md), nothing copied."""

    def __init__(self, *, earlier: float | None = None) -> None:
        self.published = 0
        self._completed: list[FakePublished] = [FakePublished(earlier, earlier)] if earlier is not None else []
        self._event = anyio.Event()
        self.calls: list[str] = []
        self.exited = False
        self.pairs = ()
        self.backend_name = "fake"
        self.tg: Any = None

    def attach(self, emit, writers=None) -> None:
        self.calls.append("attach")
        self.emit = emit

    async def prepare(self, *, previous_start, host) -> list[str]:
        self.calls.append("prepare")
        return []

    async def restore(self, choice=None):
        self.calls.append("restore")
        return None

    async def serve_peers(self, run_dir, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        self.calls.append("serve_peers")
        task_status.started()

    async def offer(self) -> dict:
        self.calls.append("offer")
        return {}

    async def choose(self, offers=None, without=None) -> dict:
        return {}

    def holds(self) -> dict:
        return {}

    def attach_nodes(self, flush_nodes) -> None:
        self.calls.append("attach-nodes")

    def link(self, tell=None, *, on: bool = False) -> None:
        self.calls.append(f"link:{on}")

    def heard(self, word: str) -> None:
        self.calls.append(f"heard:{word}")

    def share_access(self, run_dir: Path) -> None:
        self.calls.append("share-access")

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        self.calls.append("prepared")
        async with anyio.create_task_group() as tg:
            self.tg = tg
            task_status.started()
            await anyio.sleep_forever()

    def save_later(self, delay: float) -> None:
        async def save() -> None:
            await anyio.sleep(delay)
            self.published += 1
            now = time.time()
            self._completed.append(FakePublished(now, now))
            self.emit("publish", pair="checkpoint", checkpoint=f"step{self.published}")
            self._event.set()
            self._event = anyio.Event()
        self.tg.start_soon(save)

    async def in_progress(self) -> frozenset:
        return frozenset()

    @property
    def publishes(self) -> tuple[FakePublished, ...]:
        return tuple(self._completed)

    async def wait_completed(self, since: float, accept, started=lambda ident: True) -> FakePublished:
        seen = 0
        while True:
            fresh, seen = self._completed[seen:], len(self._completed)
            for d in fresh:
                if accept(d.completed_at, since) and started(d.ident):
                    return d
            await self._event.wait()

    @contextmanager
    def hurry(self, reason: str) -> Iterator[None]:
        self.calls.append(f"request:{reason}")
        yield

    def request(self, reason: str) -> None:
        self.calls.append(f"request:{reason}")

    async def flush(self, reason: str, within: float | None = None) -> dict:
        self.calls.append(f"flush:{reason}")
        return {"reason": reason, "ok": True, "pairs": {}, "pending": []}

    def training_exited(self) -> None:
        self.exited = True
        self.calls.append("training-exited")

    def training_resumed(self) -> None:
        self.exited = False
        self.calls.append("training-resumed")

    def pending(self) -> list[str]:
        return []

    def last_activity(self) -> float | None:
        return None

    def describe(self) -> list[tuple[str, str]]:
        return [("ok", "fake pairs")]


class FakeNotifier:
    def __init__(self) -> None:
        self.posted: list[str] = []

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await anyio.sleep_forever()

    def post(self, event: str, **facts: Any) -> None:
        self.posted.append(event)

    async def drain(self, timeout: float) -> None:
        return None


if TYPE_CHECKING:  # each fake against the port it stands for: mypy (scripts/lint.sh) fails when one drifts
    _child: ChildPort = FakeChild(FakeMirror())
    _mirror: MirrorPort = FakeMirror()
    _notifier: NotifierPort = FakeNotifier()
    _dispositions: Dispositions = FakeDispositions()


def make_agent(tmp_path: Path, *, env: dict[str, str] | None = None, flags: dict[str, str] | None = None,
               child_kw: dict[str, Any] | None = None, mirror: FakeMirror | None = None):
    env = {"PATH": "/usr/bin:/bin", **(env or {})}
    cfg = build_config(flags={"gpu_every": "0", "checkpoint_timeout": "2s", **(flags or {})},
                       flag_pairs=[("checkpoint", str(tmp_path / "l"), str(tmp_path / "p"))],
                       command=("torchrun", "train.py"), env=env, cwd=tmp_path, job_id=run_dir_id(env))
    plan = replace(make_plan(cfg, env), launcher=FakeLauncher())
    plan.mirror = mirror or FakeMirror()
    notifier = FakeNotifier()
    children: list[FakeChild] = []

    async def spawn(command, env):
        children.append(FakeChild(plan.mirror, **(child_kw or {})))
        return children[-1]

    agent = Agent(plan, LeaderRole(plan, spawn=spawn, notifier=notifier, dispositions=FakeDispositions()))
    return agent, children, notifier


async def run_with(agent: Agent[LeaderRole], children: list, action) -> int:
    """Run the agent; once the child is up, ``action(agent, child)``."""
    result: list[int] = []
    async with anyio.create_task_group() as tg:
        async def go() -> None:
            result.append(await agent.run())
        tg.start_soon(go)
        with anyio.fail_after(10):
            while not children:
                await anyio.sleep(0.005)
        await action(agent, children[0])
    return result[0]


def events(agent: Agent[LeaderRole], kind: str) -> list[dict]:
    return [e for e in read_journal(agent.plan.run_dir).events if e["kind"] == kind]


def steps(agent: Agent[LeaderRole]) -> dict[str, dict]:
    return {e["step"]: e for e in events(agent, "stop-step")}


async def test_preemption_takes_the_requested_checkpoint_then_stops_and_tells(tmp_path):
    agent, children, notifier = make_agent(tmp_path)
    status = await run_with(agent, children, lambda a, c: a.deliver(signal.SIGTERM))
    child = children[0]
    assert status == 75  # not requeued: the training is unfinished (docs/slurm.md, "Exit status")
    assert steps(agent)["checkpoint"]["outcome"] == "published"
    assert ("SIGUSR1", "ranks", [4243, 4244]) in child.sent
    assert child.stops[0]["signal"] == "SIGTERM"
    assert events(agent, "end")[0]["reason"] == "preempted"
    assert notifier.posted == ["start", "preempted"]
    mirror = agent.role.run_state.mirror
    assert mirror.calls.index("prepared") < mirror.calls.index("flush:stop")
    assert mirror.calls.index("training-exited") < mirror.calls.index("flush:final")


async def test_signal_dispositions_change_only_through_the_port_it_was_given(tmp_path):
    """A conductor run in someone else's process (this one) leaves its dispositions as they were."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM)}
    agent, children, _ = make_agent(tmp_path)
    await run_with(agent, children, lambda a, c: a.deliver(signal.SIGTERM))
    assert {s: signal.getsignal(s) for s in before} == before
    calls = agent.role.run_state.dispositions.calls
    assert calls[0] == "quiet-stray" and calls[-2:] == ["ignore-stop", "quiet-stray"], calls


async def test_a_stop_signal_that_came_before_the_agent_listened_starts_nothing(tmp_path):
    """The CLI holds a TERM that came during the imports; with no part to start (nothing that
    would yield to the intake task), it is still acted on before the spawn: 128+15."""
    _, children, _ = make_agent(tmp_path)
    plan = make_plan(build_config(flags={"gpu_every": "0"}, command=("torchrun", "train.py"), env={}, cwd=tmp_path), {})
    spawned = []

    async def spawn(command, env):
        spawned.append(command)
        raise AssertionError("spawned after a stop")

    agent = Agent(plan, LeaderRole(plan, spawn=spawn, early=[signal.SIGTERM], dispositions=FakeDispositions()))
    with anyio.fail_after(10):
        assert await agent.run() == 143
    assert not spawned and events(agent, "end")[0]["reason"] in ("preempted", "cancelled")


async def test_the_stop_sequence_runs_on_a_run_state_alone_and_returns_its_result(tmp_path):
    """No conductor: a RunState with a running child, a trigger, and the sequence's answer."""
    agent, _, _ = make_agent(tmp_path)
    run = agent.role.run_state
    run.mirror.tg = None
    async with anyio.create_task_group() as tg:
        await tg.start(run.mirror.run)
        run.mirror.attach(agent.role.journal.emit)
        run.child = FakeChild(run.mirror)
        run.trigger = Trigger(Reason.PREEMPTED, "received SIGTERM", signal.SIGTERM, time.monotonic())
        result = await StopSequence(run)()
        tg.cancel_scope.cancel()
    assert result.trigger.reason == Reason.PREEMPTED and result.exit_status == 0 and result.stopped_cleanly
    assert result.status(0) == 0 and not result.no_progress
    assert run.dispositions.calls == []  # not requeued: the process's dispositions were never asked for


async def test_a_checkpoint_completed_before_the_request_is_not_the_requested_one(tmp_path):
    """The stop's checkpoint step waited for any publish; one finished before the request
    made the journal say the stop checkpoint was durable when it was never taken."""
    agent, children, _ = make_agent(tmp_path, flags={"checkpoint_timeout": "0.3s"},
                                    child_kw={"answers": False}, mirror=FakeMirror(earlier=time.time() - 60))
    await run_with(agent, children, lambda a, c: a.deliver(signal.SIGTERM))
    assert steps(agent)["checkpoint"]["outcome"] == "timeout"


async def test_stop_signal_flag_is_what_the_stop_sequence_sends(tmp_path):
    agent, children, _ = make_agent(tmp_path, flags={"stop_signal": "INT"})
    await run_with(agent, children, lambda a, c: a.deliver(signal.SIGTERM))
    assert [s["signal"] for s in children[0].stops] == ["SIGINT"]


async def test_after_slurms_term_to_every_process_no_checkpoint_signal_and_no_second_term(tmp_path):
    """scancel: SIGCONT then SIGTERM to every process. The training is already saving and
    leaving; a USR1 now could kill a rank past its handler (exit 138)."""
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "1"}
    agent, children, _ = make_agent(tmp_path, env=env)

    async def scancel(a: Agent[LeaderRole], c: FakeChild) -> None:
        await a.deliver(signal.SIGCONT)
        await a.deliver(signal.SIGTERM)
        await anyio.sleep(0.05)
        c.mirror.save_later(0.0)  # the training's own save on TERM

    await run_with(agent, children, scancel)
    child = children[0]
    assert not any(s[0] == "SIGUSR1" for s in child.sent)
    req = events(agent, "checkpoint-request")[0]
    assert req["signal"] is None and "leaving" in req["why_no_signal"]
    assert child.stops[0]["already"] is True


@pytest.mark.parametrize("status, notice, reason", [(0, "finished", "child-exit"), (3, "failed", "child-failed")])
async def test_the_end_is_told(tmp_path, status, notice, reason):
    agent, children, notifier = make_agent(tmp_path)

    async def exit_(a: Agent[LeaderRole], c: FakeChild) -> None:
        c.exit(status)

    assert await run_with(agent, children, exit_) == status
    assert notifier.posted == ["start", notice]
    assert events(agent, "end")[0]["reason"] == reason
    assert steps(agent)["checkpoint"]["skipped"].startswith("not wanted")


async def test_a_part_that_breaks_is_named_not_its_exception_group(tmp_path):
    agent, children, _ = make_agent(tmp_path, child_kw={"broken": True})
    status = await run_with(agent, children, lambda a, c: anyio.sleep(0))
    assert status == 1
    assert events(agent, "error")[0]["error"] == "RuntimeError: the wait broke"
    end = events(agent, "end")[0]
    assert end["reason"] == "supervisor-error" and end["detail"] == "RuntimeError: the wait broke"


# ---- the policy, as pure functions ----------------------------------------------------


def test_grace_is_cut_to_what_is_left_and_to_what_remains_after_the_schedulers_term():
    assert policy.grace_for(30, 100, already_signalled=False, since_trigger=0) == 30
    assert policy.grace_for(30, 10, already_signalled=False, since_trigger=0) == 10
    assert policy.grace_for(30, 0.2, already_signalled=False, since_trigger=0) == 1.0
    assert policy.grace_for(30, 100, already_signalled=True, since_trigger=12) == 18


def test_time_left_is_measured_to_the_kill_that_comes_first():
    assert policy.time_left(end=None, kill=None, lead=60, kill_wait=None, now=0) == float("inf")
    assert policy.time_left(end=1000, kill=None, lead=60, kill_wait=None, now=900) == 95
    assert policy.time_left(end=1000, kill=30, lead=60, kill_wait=30, now=0) == 25


def test_a_term_near_the_end_is_the_deadline_before_it_a_preemption():
    assert policy.classify_signal(signal.SIGTERM, warn_signal=signal.SIGUSR2, end=100, now=95) == Reason.DEADLINE
    assert policy.classify_signal(signal.SIGTERM, warn_signal=signal.SIGUSR2, end=100, now=10) == Reason.PREEMPTED
    assert policy.classify_signal(signal.SIGINT, warn_signal=signal.SIGUSR2, end=None, now=0) == Reason.CANCELLED
    assert policy.classify_signal(signal.SIGUSR2, warn_signal=signal.SIGUSR2, end=None, now=0) == Reason.DEADLINE


def test_requeue_and_exit_status_decisions():
    kw = dict(requeue=True, on_failure=False, queued=True, already=False, restart_count=0, max_requeues=3)
    assert policy.requeue_decision(Reason.PREEMPTED, **kw) == (True, "")
    assert policy.requeue_decision(Reason.CHILD_FAILED, **kw)[0] is False
    assert policy.requeue_decision(Reason.PREEMPTED, **{**kw, "restart_count": 3})[1].startswith("max_requeues")
    assert policy.exit_status(None, Trigger(Reason.CANCELLED, signal=signal.SIGINT)) == 130
    assert policy.is_requested(10.0, 9.99) and not policy.is_requested(9.0, 9.99)
    assert policy.stop_signal_for(configured=None, launcher_signal=signal.SIGINT, plain=False,
                                  trigger_signal=signal.SIGTERM) == signal.SIGINT


# ---- issue 15 ----------------------------------------------------------------------------

SLURM = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "1"}


@pytest.mark.parametrize("stopped_status, expected", [(None, 75), ("0", 0), ("child", 1), ("7", 7)])
async def test_a_clean_stop_says_so_whatever_the_launchers_status(tmp_path, stopped_status, expected):
    """torchrun exits 1 after a TERM even when every rank saved and exited 0: Slurm said FAILED."""
    flags = {} if stopped_status is None else {"stopped_status": stopped_status}
    agent, children, _ = make_agent(tmp_path, flags=flags, child_kw={"on_stop": 1})
    assert await run_with(agent, children, lambda a, c: a.deliver(signal.SIGTERM)) == expected
    end = events(agent, "end")[0]
    assert end["launcher_status"] == 1 and end["stopped_cleanly"] is True and end["exit_status"] == expected


async def test_a_stop_that_needed_sigkill_or_lost_its_checkpoint_is_not_clean(tmp_path):
    agent, children, _ = make_agent(tmp_path, flags={"grace": "0.1s"}, child_kw={"on_stop": None})
    assert await run_with(agent, children, lambda a, c: a.deliver(signal.SIGTERM)) == 137
    assert events(agent, "end")[0]["stopped_cleanly"] is False
    agent, children, _ = make_agent(tmp_path / "b", flags={"checkpoint_timeout": "0.2s"},
                                    child_kw={"answers": False, "on_stop": 1})
    assert await run_with(agent, children, lambda a, c: a.deliver(signal.SIGTERM)) == 1


async def test_an_early_warning_signal_waits_for_end_minus_lead_then_stops_and_checkpoints(tmp_path):
    """#SBATCH --signal=B:USR1@60 on a 2-minute job: Slurm may send it at second 0."""
    agent, children, _ = make_agent(tmp_path, flags={"time_limit": "3s", "warn_before": "1s"})

    async def early_usr1(a: Agent[LeaderRole], c: FakeChild) -> None:
        while a.role.run_state.end is None:
            await anyio.sleep(0.01)
        await a.deliver(signal.SIGUSR1)
        await anyio.sleep(0.3)
        assert a.role.run_state.trigger is None  # deferred, not a checkpoint-and-go-on either
        assert not any(s[0] == "SIGUSR1" for s in c.sent)

    t0 = time.monotonic()
    await run_with(agent, children, early_usr1)
    assert time.monotonic() - t0 >= 1.8
    assert events(agent, "signal")[0]["action"] == "deferred"
    assert events(agent, "stop")[0]["reason"] == "deadline"
    assert steps(agent)["checkpoint"]["outcome"] == "published"


async def test_a_checkpoint_signal_far_from_the_end_is_a_checkpoint_request(tmp_path):
    agent, children, _ = make_agent(tmp_path, flags={"time_limit": "3h"})

    async def usr1(a: Agent[LeaderRole], c: FakeChild) -> None:
        while a.role.run_state.end is None:
            await anyio.sleep(0.01)
        await a.deliver(signal.SIGUSR1)
        assert a.role.run_state.trigger is None
        await a.deliver(signal.SIGINT)

    await run_with(agent, children, usr1)
    assert events(agent, "checkpoint-request")[0]["why"] == "received SIGUSR1"


def test_warning_signals_decided_by_the_schedulers_end():
    kw = dict(warn_signal=signal.SIGUSR2, checkpoint_signal=signal.SIGUSR1, lead=30.0)
    assert policy.signal_action(signal.SIGUSR1, end=None, now=0, **kw) == "checkpoint"
    assert policy.signal_action(signal.SIGUSR1, end=120, now=0, **kw) == "defer"
    assert policy.signal_action(signal.SIGUSR1, end=120, now=95, **kw) == "stop"
    assert policy.signal_action(signal.SIGUSR1, end=86400, now=0, **kw) == "checkpoint"
    assert policy.signal_action(signal.SIGUSR1, end=600, now=0, **kw) == "checkpoint"  # scancel --signal=USR1 mid-job
    assert policy.signal_action(signal.SIGUSR2, end=None, now=0, **kw) == "stop"
    assert policy.signal_action(signal.SIGUSR2, end=86400, now=0, **kw) == "defer"
    assert policy.signal_action(signal.SIGHUP, end=120, now=100, **kw) == "forward"


def test_a_save_that_came_when_the_next_periodic_one_was_due_did_not_answer():
    saves = [100.0, 130.0, 160.0]
    assert policy.answered_request(saves, 170.0, 190.2) is False   # waited 20 s for the save due at 190
    assert policy.answered_request(saves, 170.0, 171.5) is True
    assert policy.answered_request([100.0], 170.0, 190.0) is None   # no rhythm known
    assert policy.answered_request(saves, 200.0, 220.0) is False  # one periodic save skipped


async def test_a_training_that_only_saves_periodically_is_journaled_as_not_answering(tmp_path):
    agent, children, _ = make_agent(tmp_path, flags={"checkpoint_timeout": "5s"}, child_kw={"answers": False})

    async def periodic(a: Agent[LeaderRole], c: FakeChild) -> None:
        while a.role.run_state.mirror.tg is None:
            await anyio.sleep(0.01)
        for pause in (0.5, 0.5, 0.1):
            a.role.run_state.mirror.save_later(0.0)
            await anyio.sleep(pause)
        await a.deliver(signal.SIGTERM)
        await anyio.sleep(0.4)
        a.role.run_state.mirror.save_later(0.0)   # the next periodic save, due 0.5 s after the last

    await run_with(agent, children, periodic)
    cp = steps(agent)["checkpoint"]
    assert cp["outcome"] == "published" and cp["answered"] is False


async def test_an_answered_stop_is_journaled_as_answered(tmp_path):
    agent, children, _ = make_agent(tmp_path)

    async def periodic_then_term(a: Agent[LeaderRole], c: FakeChild) -> None:
        while a.role.run_state.mirror.tg is None:
            await anyio.sleep(0.01)
        for pause in (0.5, 0.5, 0.25):
            a.role.run_state.mirror.save_later(0.0)
            await anyio.sleep(pause)
        await a.deliver(signal.SIGTERM)

    await run_with(agent, children, periodic_then_term)
    assert steps(agent)["checkpoint"]["answered"] is True


def journal_of(tmp_path: Path, attempts: list[bool]) -> None:
    """Earlier attempts in the run directory; True: that attempt published a checkpoint."""
    import json

    run_dir = tmp_path / "supervise-77"
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "events.jsonl", "a") as f:
        for n, progressed in enumerate(attempts, 1):
            f.write(json.dumps({"v": 1, "t": float(n), "attempt": n, "kind": "start"}) + "\n")
            if progressed:
                f.write(json.dumps({"v": 1, "t": float(n), "attempt": n, "kind": "publish", "checkpoint": f"s{n}"}) + "\n")


async def test_a_run_that_cannot_progress_is_not_requeued(tmp_path):
    """Attempt 1 published nothing, this attempt neither (a crash or hang before its next
    checkpoint): a requeue would only spend another allocation."""
    journal_of(tmp_path, [False])
    agent, children, notifier = make_agent(tmp_path, env={**SLURM, "SLURM_RESTART_COUNT": "1"},
                                           flags={"requeue": "true", "checkpoint_timeout": "0.2s"},
                                           child_kw={"answers": False})
    assert agent.plan.attempt == 2
    status = await run_with(agent, children, lambda a, c: a.deliver(signal.SIGTERM))
    assert status == policy.NO_PROGRESS_STATUS
    refused = events(agent, "requeue-refused")[0]
    assert refused["why"] == "no-progress" and refused["attempts"] == 2
    assert steps(agent)["requeue"]["requeued"] is False
    assert "no-progress" in notifier.posted
    assert events(agent, "end")[0]["exit_status"] == 3


def test_progress_over_the_last_k_attempts():
    assert policy.progress_by_attempt([{"attempt": 1, "kind": "start"}, {"attempt": 2, "kind": "start"},
                                       {"attempt": 2, "kind": "publish", "pointer": True}]) == [False, False]
    assert policy.no_progress([True, False, False], 2) and not policy.no_progress([False, True, False], 2)
    assert not policy.no_progress([False], 2) and not policy.no_progress([False, False], 0)


async def test_after_a_gpu_fault_a_crash_is_not_restarted_in_place_but_requeued(tmp_path):
    """The health gate: a new XID means the GPUs, not the code, failed; the same GPUs would fail again."""
    agent, children, _ = make_agent(tmp_path, env=SLURM, flags={"max_restarts": "3", "requeue": "true",
                                                                "restart_backoff": "0.01s"})

    async def xid_then_crash(a: Agent[LeaderRole], c: FakeChild) -> None:
        a.role.run_state.faults.through(a.role.journal.emit)("gpu-xid", durable=True, device=0, uuid="GPU-0", xid=79)
        c.exit(1)

    await run_with(agent, children, xid_then_crash)
    assert len(children) == 1 and not events(agent, "restart")
    assert events(agent, "end")[0]["reason"] == "child-failed"
    requeue = steps(agent)["requeue"]
    assert "requeued" in requeue and "skipped" not in requeue  # tried (no scontrol here), not refused


async def test_without_a_fault_a_crash_is_restarted_in_place(tmp_path):
    agent, children, _ = make_agent(tmp_path, flags={"max_restarts": "1", "restart_backoff": "0.01s"})

    async def crash_twice(a: Agent[LeaderRole], c: FakeChild) -> None:
        a.role.run_state.faults.through(a.role.journal.emit)("gpu-xid", durable=True, device=0, uuid="GPU-0", xid=13)  # an application XID
        c.exit(1)
        with anyio.fail_after(5):
            while len(children) < 2:
                await anyio.sleep(0.01)
        children[1].exit(1)

    await run_with(agent, children, crash_twice)
    assert len(events(agent, "restart")) == 1


def test_which_gpu_events_make_a_node_suspect():
    assert policy.gpu_fault("gpu-xid", {"xid": 79, "device": 2}) == "XID 79 on GPU 2"
    assert policy.gpu_fault("gpu-xid", {"xid": 13, "device": 2}) is None
    assert policy.gpu_fault("gpu-lost", {"device": 1}) == "GPU 1 lost"
    assert policy.exclude_node(Reason.HANG, []) == ["hang"]
    assert policy.exclude_node(Reason.DEADLINE, []) == []
    kw = dict(requeue=True, on_failure=False, queued=True, already=False, restart_count=0, max_requeues=3)
    assert policy.requeue_decision(Reason.CHILD_FAILED, **kw, suspect=True) == (True, "")
    assert policy.requeue_decision(Reason.HANG, **kw) == (True, "")


class HeldGpu:
    """A GPU sampler whose memory stays in use after the crash (a rank stuck in the driver)."""

    def __init__(self, held: int) -> None:
        self.held = held

    def memory_held(self, since: float) -> int:
        return self.held

    def last_busy(self) -> None:
        return None


if TYPE_CHECKING:
    _gpu: SamplerPort = HeldGpu(0)

@pytest.mark.parametrize("held_mib, restarted", [(4096, False), (0, True)])
async def test_the_health_gate_checks_that_the_crashed_trainings_gpu_memory_is_free(tmp_path, held_mib, restarted):
    agent, children, _ = make_agent(tmp_path, env=SLURM, flags={"max_restarts": "1", "requeue": "true",
                                                                "restart_backoff": "0.01s"})
    agent.role.run_state.gpu = HeldGpu(held_mib * 2**20)   # gpu_every is 0 in these tests: the part is not started

    async def crash(a: Agent[LeaderRole], c: FakeChild) -> None:
        c.exit(1)
        with anyio.fail_after(5):
            while len(children) < 2 and a.role.run_state.trigger is None:
                await anyio.sleep(0.01)
        if len(children) == 2:
            children[1].exit(0)

    await run_with(agent, children, crash)
    assert (len(children) == 2) is restarted
    gate = events(agent, "health-gate")
    if restarted:
        assert not gate and events(agent, "end")[0]["reason"] == "child-exit"
    else:
        assert gate[0]["held_mib"] == 4096 and "still in use" in gate[0]["why"]
        assert events(agent, "end")[0]["reason"] == "child-failed"
        assert "skipped" not in steps(agent)["requeue"]  # requeued elsewhere (no scontrol here)
