"""Plan, then conduct: everything a run needs, built and validated before anything starts.

``make_plan`` turns the Config and the environment into the job, the launcher profile,
the signals, the mirror (its pairs checked, each with its profile), the notifier's URLs
and the time budget. Every failure here is a ``ConfigError``: exit 2, one line, no process
started. ``supervise check`` prints the same plan (``describe``); the conductor
(``agent.Agent``) only runs it.

One Config, one ``make_plan``, on every node of a multi-node job: ``node_rank=K`` (K > 0)
builds node K's plan from the same configuration the leader runs by, for its node agent
(``conduct/agent.Agent`` with ``conduct/node.NodeRole``): the per-node checkpoint pairs only, its journal under
``RUN/nodes/node-K/`` and its attempt there, and the leader's previous ``start`` (which node
this host was then).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

from supervisor import __version__, childenv, deadline, launchers, nodeset
from supervisor._units import format_duration
from supervisor.config import Config, SyncPair, agent_view, pair_view, public_view
from supervisor.autorequeue import lightning_clash
from supervisor.errors import ConfigError
from supervisor.sched import ENV_PREFIXES, Job, detect_job, restart_count
from supervisor.journal import next_attempt, node_dir, read_journal, redact_argv, redact_env
from supervisor.ports import MirrorPort

if TYPE_CHECKING:
    from supervisor.sync import Mirror

_T = TypeVar("_T")
SCHEDULER_ENV_PREFIXES = (*ENV_PREFIXES, "SUPERVISE_", "CUDA_VISIBLE_DEVICES", "OMPI_COMM_WORLD", "PMI_", "CS_")


@dataclass
class Plan:
    cfg: Config
    env: dict[str, str]
    job: Job
    launcher: launchers.LauncherProfile
    checkpoint_signal: signal.Signals
    attempt: int
    previous_events: list[dict[str, Any]]
    lead: float                       # warn this long before the job's end (before fitting to the job)
    request_path: Path
    mirror: MirrorPort | None = None  # supervisor.sync.Mirror, when there are pairs
    notify_urls: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    lead_basis: deadline.Lead | None = None  # what ``auto`` learned it from; None when --warn-before is set
    node_rank: int = 0                # 0: the leader (supervise itself); K > 0: node K's agent
    previous_start: dict[str, Any] | None = None  # the leader's ``start`` of the attempt before this one

    @property
    def run_dir(self) -> Path:
        """The run directory: the leader's, for every node."""
        assert self.cfg.run_dir is not None
        return self.cfg.run_dir

    @property
    def journal_dir(self) -> Path:
        """Where this role journals: the run directory (the leader), ``RUN/nodes/node-K/`` (node K)."""
        return node_dir(self.run_dir, self.node_rank) if self.node_rank else self.run_dir

    @property
    def command(self) -> tuple[str, ...]:
        """The command as this attempt runs it: on its nodes, when spares are kept aside (``nodeset.on_nodes``)."""
        j = self.job
        ours = (j.nodefile, str(nodeset.nodefile_path(self.run_dir, j.nodes))) if j.nodefile and j.allocation else None
        return nodeset.on_nodes(self.cfg.command, j.nodes, j.all_nodes, nodefile=ours)

    @property
    def nodes(self) -> int:
        """How many nodes write parts of this run's checkpoints (1: no per-node pair)."""
        return max((p.nodes for p in per_node_pairs(self.cfg.sync)), default=1)


def per_node_pairs(pairs: Sequence[SyncPair]) -> tuple[SyncPair, ...]:
    """The checkpoint pairs every node writes its own part of (``nodes > 1``, resolved): all
    that a node agent mirrors, and what makes a job need node agents at all."""
    return tuple(p for p in pairs if p.kind == "checkpoint" and p.nodes > 1)


def make_plan(cfg: Config, env: Mapping[str, str] | None = None, node_rank: int | None = None, *,
              parts_poll: float = 1.0, lost: tuple[str, ...] = ()) -> Plan:
    """Build and validate the run; ConfigError for anything that would stop it. ``node_rank``
    None or 0: the leader's plan; K > 0: node K's agent's (``_node_plan``). ``parts_poll``:
    how often a per-node pair looks for the other nodes' parts (a test's knob). ``lost``: the
    allocation's nodes that died in an earlier attempt of this allocation (spares replace them)."""
    env = dict(os.environ if env is None else env)
    job = detect_job(env)
    if node_rank:
        return _node_plan(cfg, env, job, node_rank, parts_poll)
    runs = job.sched.restart_count_now(job)  # PBS counts reruns only in qstat -f (run_count), not the environment
    if runs is not None:
        job = replace(job, restart_count=runs)
    if (cfg.spare_nodes or lost) and job.sched.is_batch:
        job, env = _with_spares(cfg, job, env, lost)
    cfg = _for_job(cfg, job)
    assert cfg.run_dir is not None
    run_dir = cfg.run_dir
    previous, attempt = _on_disk(run_dir, lambda: (read_journal(run_dir).events,
                                                   next_attempt(run_dir, max(job.restart_count, restart_count(env))))
                                 if run_dir.exists() else ([], 1))
    plan = _plan(cfg, env, job, previous, attempt, previous_start=_start_before(previous, written=0))
    clash = lightning_clash(cfg.command, env, cfg.requeue)
    if clash:
        plan.warnings.append(clash)
    if cfg.sync:
        mirror = _mirror(cfg, 0, parts_poll, previous)
        plan.warnings += mirror.check(probe=not lost)  # a spare's attempt: this process probed the store already
        plan.mirror = mirror
    if cfg.notify:
        from supervisor.notify import resolve_urls

        try:
            plan.notify_urls = resolve_urls(cfg.notify)
        except ValueError as e:
            raise ConfigError("notify", "(hidden)", str(e), "--notify") from None
    return plan


def _node_plan(cfg: Config, env: dict[str, str], job: Job, rank: int, parts_poll: float) -> Plan:
    """Node K's plan: the per-node checkpoint pairs of the same configuration (ConfigError
    when there is none, or when K is not one of their nodes), journaled under
    ``RUN/nodes/node-K/``. The leader's journal gives the ``start`` of the attempt before this
    one: the leader journals this attempt's ``start`` before it starts its agents."""
    cfg = replace(cfg, sync=per_node_pairs(_for_job(cfg, job).sync))  # nodes = "auto": this job's, as the leader's
    if not cfg.sync:
        raise ConfigError("nodes", 1, "no per-node checkpoint pair: give --nodes N with --checkpoints, "
                          "or nodes = N in a [[sync]] table")
    assert cfg.run_dir is not None
    mirror = _mirror(cfg, rank, parts_poll)
    warnings = mirror.check()
    run_dir = cfg.run_dir
    previous, attempt = _on_disk(run_dir, lambda: (read_journal(run_dir).events,
                                                   next_attempt(node_dir(run_dir, rank), restart_count(env))))  # its own journal
    plan = _plan(cfg, env, job, previous, attempt, previous_start=_start_before(previous, written=1))
    plan.node_rank, plan.mirror = rank, mirror
    plan.warnings += warnings
    return plan


def _with_spares(cfg: Config, job: Job, env: dict[str, str], lost: tuple[str, ...]) -> tuple[Job, dict[str, str]]:
    """The job as this attempt sees it: the nodes it trains on (the allocation less its spares
    and its dead nodes), the whole allocation beside them; its node agents and the training
    learn the nodes from ``childenv.JOB_NODES`` (issue 41)."""
    allocation = job.all_nodes
    if cfg.spare_nodes >= len(allocation):
        raise ConfigError("spare_nodes", cfg.spare_nodes, f"the job has {len(allocation)} node(s) "
                          f"({','.join(allocation) or 'none named'}): at least one must be left to train on")
    nodes = nodeset.attempt_nodes(allocation, spares=cfg.spare_nodes, lost=lost, leader=job.sched.node_name(env))
    if nodes is None:
        raise ConfigError("spare_nodes", cfg.spare_nodes, f"too few nodes left: {', '.join(lost)} died and "
                          f"the allocation has {len(allocation)}")
    env = {**job.sched.on_fewer_nodes(env), childenv.JOB_NODES: ",".join(nodes)}
    return replace(job, allocation=allocation, nodes=nodes, lost=lost), env


def _for_job(cfg: Config, job: Job) -> Config:
    return replace(cfg, sync=tuple(p.for_job(job.num_nodes) for p in cfg.sync))  # nodes = "auto": this job's


def _on_disk(run_dir: Path, read: Callable[[], _T]) -> _T:
    """What the run directory already holds (the journals so far, the attempt numbers)."""
    try:  # a path too long, a file on the way, no permission: exit 2 naming it, nothing started
        return read()
    except OSError as e:
        raise ConfigError("run_dir", str(run_dir), f"cannot be read: {e.strerror or e}") from None


def _start_before(events: list[dict[str, Any]], written: int) -> dict[str, Any] | None:
    """The leader's ``start`` of the attempt before this one; ``written``: how many ``start``
    lines of this attempt the journal already has (the leader's own comes after its plan)."""
    starts = [e for e in events if e.get("kind") == "start"]
    return starts[-1 - written] if len(starts) > written else None


def _plan(cfg: Config, env: dict[str, str], job: Job, previous: list[dict[str, Any]], attempt: int,
          previous_start: dict[str, Any] | None) -> Plan:
    assert cfg.run_dir is not None
    profile = launchers.detect(cfg.command, cfg.launcher)
    basis = deadline.learn(previous) if cfg.warn_before is None else None
    return Plan(cfg=cfg, env=env, job=job, launcher=profile,
                checkpoint_signal=cfg.checkpoint_signal or profile.checkpoint_signal,
                attempt=attempt, previous_events=previous,
                lead=cfg.warn_before if basis is None else basis.seconds, lead_basis=basis,
                request_path=cfg.run_dir / childenv.REQUEST_FILE, warnings=list(cfg.warnings),
                previous_start=previous_start)


def _mirror(cfg: Config, rank: int, parts_poll: float, previous: list[dict[str, Any]] | None = None) -> Mirror:
    """The mirror, built once, before the journal is open: the conductor gives it the journal
    and the training's processes (``Mirror.attach``) when it runs, whichever node it is on."""
    from supervisor.sync import Mirror, published_in

    return Mirror(cfg.sync, emit=lambda kind, **f: f, sync_every=cfg.sync_every, backend=cfg.sync_backend,
                  nice=cfg.sync_nice, ionice=cfg.sync_ionice, writers=set, streams=cfg.sync_streams,
                  node_rank=rank, parts_poll=parts_poll, owner=str(cfg.run_dir),
                  # another run's are never replaced (the leader's own checkpoints; a node publishes none)
                  published_before=published_in(previous) if previous is not None else None)


def describe(plan: Plan) -> list[tuple[str, str, str]]:
    """(status, topic, text) lines: what supervise will do, for `supervise check` and the log."""
    if plan.node_rank:
        return _describe_node(plan)
    cfg, p = plan.cfg, plan.launcher
    stop = cfg.stop_signal.name if cfg.stop_signal else f"{p.stop_signal.name} (per launcher)"
    out = [("ok", "launcher", f"{p.name}: checkpoint {plan.checkpoint_signal.name} via {p.checkpoint_route}, "
                              f"stop {stop} via {p.stop_route}, grace {format_duration(cfg.grace)}"
                              + (f"; {p.note}" if p.note else "")),
           ("ok", "attempt", f"{plan.attempt} in {plan.run_dir}; warns {format_duration(plan.lead)} before the end "
                             f"({'set' if cfg.warn_before is not None else 'learned'})")]
    out += _describe_mirror(plan, "sync")
    if plan.job.allocation:
        j = plan.job
        limit = cfg.max_node_replacements if cfg.max_node_replacements is not None else len(j.spares)
        out.append(("ok", "spares", f"trains on {', '.join(j.nodes)}; spare {', '.join(j.spares) or 'none'}: a node "
                                    f"that dies is replaced inside the allocation ({limit} time(s) at most), then "
                                    f"requeued; {j.sched.node_failure_note}; the launcher runs as: {' '.join(plan.command)}"))
    if plan.notify_urls:
        out.append(("ok", "notify", f"{len(plan.notify_urls)} webhook(s), {cfg.notify_format}"))
    return out


def _describe_node(plan: Plan) -> list[tuple[str, str, str]]:
    """Node K's agent: its journal, its attempt, and its part of every per-node pair."""
    topic = f"node {plan.node_rank}"
    out = [("ok", topic, f"node {plan.node_rank} of {plan.nodes} (its node agent): journal {plan.journal_dir}, "
                         f"attempt {plan.attempt}; stages its part of every checkpoint of "
                         f"{', '.join(p.name for p in plan.cfg.sync)}, published once every node's part is there")]
    return out + _describe_mirror(plan, topic)


def _describe_mirror(plan: Plan, topic: str) -> list[tuple[str, str, str]]:
    cfg, mirror = plan.cfg, plan.mirror
    if mirror is None:
        return []
    return [*((status, topic, text) for status, text in mirror.describe()),
            ("ok", topic, f"backend {mirror.backend_name} (sync_backend = {cfg.sync_backend}), "
                          f"{cfg.sync_streams} copy stream{'s' if cfg.sync_streams > 1 else ''} (sync_streams)")]


def start_fields(plan: Plan) -> dict[str, Any]:
    """The ``start`` event: who, where, what, and the whole configuration (secrets hidden)."""
    j, cfg = plan.job, plan.cfg
    return {"version": __version__, "argv": redact_argv(sys.argv), "command": list(cfg.command), "cwd": os.getcwd(),
            "host": os.uname().nodename, "user": _user(), "pid": os.getpid(),
            "python": ".".join(map(str, sys.version_info[:3])), "scheduler": j.scheduler, "job_id": j.job_id,
            "job_name": j.job_name, "restart_count": j.restart_count, "nodes": list(j.nodes),
            **({"spares": list(j.spares), "lost": list(j.lost)} if j.allocation else {}),
            "launcher": plan.launcher.name, "checkpoint_signal": plan.checkpoint_signal.name,
            "config": public_view(cfg), "scheduler_env": redact_env(plan.env, SCHEDULER_ENV_PREFIXES)}


def node_start_fields(plan: Plan, writers: str | None) -> dict[str, Any]:
    """Node K's ``node-start`` event: who, where, and what it runs by (its per-node pairs
    whole, the leader's mirroring and sampling settings); ``writers``: how it finds the
    training's processes on its node (``JobProcesses.describe``), None in no job."""
    return {"version": __version__, "node": plan.node_rank, "nodes": plan.nodes, "host": socket.gethostname(),
            "pid": os.getpid(), "argv": sys.argv, "backend": plan.mirror.backend_name if plan.mirror else None,
            "pairs": [pair_view(p) for p in plan.cfg.sync],
            "settings": {k: v for k, v in agent_view(plan.cfg).items() if k != "sync"}, "writers": writers}


def job_label(plan: Plan) -> str:
    """How notifications name the job."""
    j = plan.job
    if j.job_id:
        return f"{j.scheduler} job {j.job_id}" + (f" ({j.job_name})" if j.job_name else "")
    return f"{os.uname().nodename}:{plan.run_dir.name}"


def _user() -> str:
    name = os.environ.get("USER") or os.environ.get("LOGNAME")
    if name:
        return name
    import pwd  # only when the environment does not say

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
