"""The node agents of a multi-node job, started by the leader: no line in the job script.

A checkpoint pair with ``nodes > 1`` needs one ``supervise node-agent`` on every other node
of the allocation (docs/sync.md, docs/multinode.md). Under Slurm the leader (the main
``supervise``, node 0, in the batch script) starts them itself, before its restore: one
``srun --overlap`` task per node, which shares the nodes with the training's step. It waits
until each agent has restored its node's local side (each prints one ``ready`` line), so the
training never starts on a node whose shards are not back yet; an agent that does not answer
within ``READY_TIMEOUT_S`` is journaled and the run goes on (its part will be missing, never
published partial). The agents end by themselves once the leader's ``end`` is journaled.

At the start of an attempt it also says which nodes of the previous attempt are gone
(``node-lost``): Slurm calls them down or drained, and the checkpoints whose parts only they
could give were never published (docs/multinode.md, the failure table).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import anyio
from anyio.abc import TaskStatus

from supervisor.config import Config
from supervisor.journal import Emit

log = logging.getLogger("supervise")

READY_TIMEOUT_S = 60.0
READY_LINE = "supervise-node-agent"  # "<READY_LINE> ready K" / "… leader 0" / "… duplicate K" on stdout
GONE_STATES = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER_DOWN", "FUTURE", "UNKNOWN")


def agent_argv(cfg: Config, python: str = sys.executable) -> list[str]:
    """The agents' command: the leader's own configuration, as a node agent takes it (the
    environment, ``SUPERVISE_*`` included, reaches them through srun)."""
    assert cfg.run_dir is not None
    argv = [python, "-m", "supervisor", "node-agent", "--run-dir", str(cfg.run_dir),
            "--sync-every", f"{cfg.sync_every:g}s", "--sync-backend", cfg.sync_backend]
    if cfg.config_file is not None:
        return [*argv, "--config", str(cfg.config_file)]
    pairs = [p for p in cfg.sync if p.kind == "checkpoint" and p.nodes > 1]
    for p in pairs:
        argv += ["--checkpoints", str(p.src), str(p.dst)]
    first = pairs[0]
    argv += ["--nodes", str(first.nodes), "--settle", f"{first.settle:g}s", "--profile", first.profile]
    if first.restore:
        argv.append("--restore")
    for m in first.markers:
        argv += ["--marker", m]
    return argv


class Fleet:
    """Starts, awaits and watches the node agents of one attempt."""

    def __init__(self, argv: list[str], nodes: tuple[str, ...], emit: Emit, env: dict[str, str],
                 ready_timeout: float = READY_TIMEOUT_S) -> None:
        self.argv, self.nodes, self.emit, self.env = argv, nodes, emit, env
        self.ready_timeout = ready_timeout
        self.ready: dict[int, float] = {}
        self.proc: subprocess.Popen[str] | None = None

    @classmethod
    def from_plan(cls, plan: Any, emit: Emit) -> Fleet | None:
        """A fleet where one is needed: a Slurm job of several nodes with a per-node pair."""
        cfg: Config = plan.cfg
        if plan.job.scheduler != "slurm" or plan.job.num_nodes < 2:
            return None
        if not any(p.kind == "checkpoint" and p.nodes > 1 for p in cfg.sync):
            return None
        if plan.env.get("SUPERVISE_NODE_AGENTS", "").lower() in ("0", "off", "false", "no"):
            return None
        return cls(agent_argv(cfg), plan.job.nodes, emit, dict(plan.env))

    def srun_argv(self) -> list[str]:
        n = len(self.nodes)
        return ["srun", "--overlap", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
                "--job-name=supervise-node-agents", *self.argv]

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the agents; ``started`` once every node other than the leader's is ready
        (or the wait ran out); then follow srun until it ends or the run does."""
        t0 = time.monotonic()
        argv = self.srun_argv()
        env = self.env
        try:
            self.proc = await anyio.to_thread.run_sync(lambda: subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True))  # our session: not the training tree (Child.tree)
        except OSError as e:
            self.emit("node-agents", started=False, error=str(e), nodes=list(self.nodes))
            task_status.started()
            return
        want = set(range(1, len(self.nodes)))
        lines: anyio.abc.ObjectReceiveStream[str]
        send, lines = anyio.create_memory_object_stream[str](64)
        proc = self.proc

        def read() -> None:
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    anyio.from_thread.run(send.send, line)
            finally:
                anyio.from_thread.run_sync(send.close)

        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: anyio.to_thread.run_sync(read, abandon_on_cancel=True))
            started = False
            with anyio.move_on_after(self.ready_timeout):
                async for line in lines:
                    self._heard(line, t0)
                    if want <= set(self.ready):
                        break
            missing = sorted(want - set(self.ready))
            self.emit("node-agents", started=True, nodes=list(self.nodes), pid=proc.pid, argv=argv,
                      ready=sorted(self.ready), missing=missing, seconds=round(time.monotonic() - t0, 3))
            if missing:
                log.warning("node agents not ready after %.0fs on node(s) %s; their parts may be missing",
                            time.monotonic() - t0, ", ".join(str(k) for k in missing))
            else:
                log.info("node agents ready on %d node(s) in %.2fs", len(want), time.monotonic() - t0)
            task_status.started()
            started = True
            async for line in lines:
                self._heard(line, t0)
            status = await anyio.to_thread.run_sync(proc.wait)
            if started:  # before the leader's end: a node died, or srun could not reach one
                log.warning("the node agents' srun ended with status %d before the run did", status)
            tg.cancel_scope.cancel()

    def _heard(self, line: str, t0: float) -> None:
        words = line.split()
        if len(words) >= 3 and words[0] == READY_LINE and words[2].isdigit():
            self.ready.setdefault(int(words[2]), round(time.monotonic() - t0, 3))


def lost_nodes(previous: list[dict[str, Any]], now: tuple[str, ...], persistent: list[Path],
               node_state: Callable[[str], tuple[str, str] | None]) -> list[dict[str, Any]]:
    """The nodes of the previous attempt that this one lacks and Slurm calls gone, each with
    the checkpoints whose parts from it are missing on persistent storage (never published)."""
    start = next((e for e in reversed(previous) if e.get("kind") == "start"), None)
    if start is None or not start.get("nodes"):
        return []
    before = [str(n) for n in start["nodes"]]
    out = []
    for index, host in enumerate(before):
        if host in now:
            continue
        state = node_state(host)
        if state is None or not any(s in state[0].upper() for s in GONE_STATES):
            continue
        lost = []
        for dst in persistent:
            parts = dst / ".supervise-parts"
            try:
                names = sorted(os.listdir(parts))
            except OSError:
                continue
            for name in names:
                if (dst / name).exists() or not (parts / name).is_dir():
                    continue
                if not (parts / name / f"node-{index}.json").exists():
                    lost.append(f"{dst.name}/{name}" if len(persistent) > 1 else name)
        out.append({"node": host, "index": index, "in_attempt": start.get("attempt"), "state": state[0],
                    "reason": state[1], "lost": lost})
    return out


def slurm_node_state(host: str) -> tuple[str, str] | None:
    """(State, Reason) of a node from ``scontrol show node``; None when it cannot tell."""
    try:
        out = subprocess.run(["scontrol", "-o", "show", "node", host], capture_output=True, text=True,
                             timeout=10, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = dict(w.split("=", 1) for w in out.split() if "=" in w)
    if "State" not in fields:
        return None
    reason = out.split("Reason=", 1)[1].split(" [", 1)[0].strip() if "Reason=" in out else ""
    return fields["State"], reason


async def journal_lost_nodes(plan: Any, emit: Emit) -> None:
    """``node-lost`` for each node of the previous attempt that is gone (Slurm jobs only)."""
    if plan.job.scheduler != "slurm" or not any(p.kind == "checkpoint" and p.nodes > 1 for p in plan.cfg.sync):
        return
    dsts = [p.dst for p in plan.cfg.sync if p.kind == "checkpoint" and p.nodes > 1]
    for lost in await anyio.to_thread.run_sync(lost_nodes, plan.previous_events, plan.job.nodes, dsts, slurm_node_state):
        emit("node-lost", **lost)
        log.warning("node %s of attempt %s is gone (Slurm: %s%s)%s", lost["node"], lost["in_attempt"], lost["state"],
                    f", {lost['reason']}" if lost["reason"] else "",
                    f": {', '.join(lost['lost'])} only partly saved, never published" if lost["lost"] else "")


async def start(plan: Any, tg: Any, guarded: Callable[..., Any], emit: Emit) -> None:
    """The agent's one call, before its restore: say which nodes are gone, then start the
    node agents and wait until they are ready (each bounded; never fatal)."""
    try:
        await journal_lost_nodes(plan, emit)
    except Exception as e:  # noqa: BLE001 - a report line, never a reason to stop
        log.warning("could not tell which nodes are gone: %s", e)
    if plan.job.num_nodes > 1:  # this host's files from another node's role are no part of node 0's
        from supervisor.sync import role_before, set_aside_other_role

        before = next((e for e in reversed(plan.previous_events) if e.get("kind") == "start"), None)
        set_aside_other_role(list(plan.cfg.sync), role_before(before, os.uname().nodename), 0, emit)
    fleet = Fleet.from_plan(plan, emit)
    if fleet is not None:
        await tg.start(guarded("node-agents", fleet.run))
