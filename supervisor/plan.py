"""Plan, then conduct: everything a run needs, built and validated before anything starts.

``make_plan`` turns the Config and the environment into the job, the launcher profile,
the signals, the mirror (its pairs checked, each with its profile), the notifier's URLs
and the time budget. Every failure here is a ``ConfigError``: exit 2, one line, no process
started. ``supervise check`` prints the same plan (``describe``); the conductor
(``agent.Agent``) only runs it.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from supervisor import __version__, childenv, deadline, launchers
from supervisor._units import format_duration
from supervisor.config import Config, public_view
from supervisor.errors import ConfigError
from supervisor.sched import Job, detect_job
from supervisor.journal import next_attempt, read_journal, redact_argv, redact_env
from supervisor.conduct.ports import MirrorPort

SCHEDULER_ENV_PREFIXES = ("SLURM_", "PBS_", "SUPERVISE_", "CUDA_VISIBLE_DEVICES", "OMPI_COMM_WORLD", "PMI_", "CS_")


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

    @property
    def run_dir(self) -> Path:
        assert self.cfg.run_dir is not None
        return self.cfg.run_dir


def make_plan(cfg: Config, env: Mapping[str, str] | None = None) -> Plan:
    """Build and validate the run; ConfigError for anything that would stop it."""
    env = dict(os.environ if env is None else env)
    job = detect_job(env)
    runs = job.sched.restart_count_now(job)  # PBS counts reruns only in qstat -f (run_count), not the environment
    if runs is not None:
        job = replace(job, restart_count=runs)
    cfg = replace(cfg, sync=tuple(p.for_job(job.num_nodes) for p in cfg.sync))  # nodes = "auto": this job's
    assert cfg.run_dir is not None
    profile = launchers.detect(cfg.command, cfg.launcher)
    try:  # a path too long, a file on the way, no permission: exit 2 naming it, nothing started
        exists = cfg.run_dir.exists()
        previous = read_journal(cfg.run_dir).events if exists else []
        attempt = next_attempt(cfg.run_dir, env, job.restart_count) if exists else 1
    except OSError as e:
        raise ConfigError("run_dir", str(cfg.run_dir), f"cannot be read: {e.strerror or e}") from None
    basis = deadline.learn(previous) if cfg.warn_before is None else None
    plan = Plan(cfg=cfg, env=env, job=job, launcher=profile,
                checkpoint_signal=cfg.checkpoint_signal or profile.checkpoint_signal,
                attempt=attempt,
                previous_events=previous,
                lead=cfg.warn_before if basis is None else basis.seconds, lead_basis=basis,
                request_path=cfg.run_dir / childenv.REQUEST_FILE, warnings=list(cfg.warnings))
    if cfg.sync:
        from supervisor.sync import Mirror

        # The training's processes are attached when the agent runs (Mirror.attach); they will be seen.
        mirror = Mirror(cfg.sync, emit=lambda kind, **f: f, sync_every=cfg.sync_every,
                        backend=cfg.sync_backend, nice=cfg.sync_nice, ionice=cfg.sync_ionice, writers=set,
                        streams=cfg.sync_streams,
                        published_before=Mirror.published_in(previous))  # another run's are never replaced
        plan.warnings += mirror.check()
        plan.mirror = mirror
    if cfg.notify:
        from supervisor.notify import resolve_urls

        try:
            plan.notify_urls = resolve_urls(cfg.notify)
        except ValueError as e:
            raise ConfigError("notify", "(hidden)", str(e), "--notify") from None
    return plan


def describe(plan: Plan) -> list[tuple[str, str, str]]:
    """(status, topic, text) lines: what supervise will do, for `supervise check` and the log."""
    cfg, p = plan.cfg, plan.launcher
    stop = cfg.stop_signal.name if cfg.stop_signal else f"{p.stop_signal.name} (per launcher)"
    out = [("ok", "launcher", f"{p.name}: checkpoint {plan.checkpoint_signal.name} via {p.checkpoint_route}, "
                              f"stop {stop} via {p.stop_route}, grace {format_duration(cfg.grace)}"
                              + (f"; {p.note}" if p.note else "")),
           ("ok", "attempt", f"{plan.attempt} in {plan.run_dir}; warns {format_duration(plan.lead)} before the end "
                             f"({'set' if cfg.warn_before is not None else 'learned'})")]
    if plan.mirror is not None:
        out += [(status, "sync", text) for status, text in plan.mirror.describe()]
        out.append(("ok", "sync", f"backend {plan.mirror.backend_name} (sync_backend = {cfg.sync_backend}), "
                                  f"{cfg.sync_streams} copy stream{'s' if cfg.sync_streams > 1 else ''} (sync_streams)"))
    if plan.notify_urls:
        out.append(("ok", "notify", f"{len(plan.notify_urls)} webhook(s), {cfg.notify_format}"))
    return out


def start_fields(plan: Plan) -> dict[str, Any]:
    """The ``start`` event: who, where, what, and the whole configuration (secrets hidden)."""
    j, cfg = plan.job, plan.cfg
    return {"version": __version__, "argv": redact_argv(sys.argv), "command": list(cfg.command), "cwd": os.getcwd(),
            "host": os.uname().nodename, "user": _user(), "pid": os.getpid(),
            "python": ".".join(map(str, sys.version_info[:3])), "scheduler": j.scheduler, "job_id": j.job_id,
            "job_name": j.job_name, "restart_count": j.restart_count, "nodes": list(j.nodes),
            "launcher": plan.launcher.name, "checkpoint_signal": plan.checkpoint_signal.name,
            "config": public_view(cfg), "scheduler_env": redact_env(plan.env, SCHEDULER_ENV_PREFIXES)}


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
