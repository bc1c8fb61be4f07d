"""``supervise node-agent``: one per node of a multi-node job, mirroring that node's part.

When every node writes its shards of a checkpoint to its own local disk, the main
``supervise`` (the leader, node 0) can only see node 0's. The job script starts one node
agent on every node (``srun --overlap --ntasks-per-node=1 …`` or ``mpiexec --ppn 1 …``); node
K's agent runs the same ``Mirror`` over the per-node checkpoint pairs (``nodes > 1``) with
``node_rank=K``: it stages node K's part of each complete checkpoint on persistent storage and
writes its manifest; the leader publishes once every part is there (docs/sync.md).

The agent journals into ``<run-dir>/nodes/node-K/events.jsonl`` (and ``supervise.log``
beside it), never into the leader's ``events.jsonl``. It runs until the leader's ``end`` is in
``<run-dir>/events.jsonl`` (then one last flush, so a part that lands late still counts for the
next attempt), or until a second TERM/INT; a first one asks for a flush and goes on mirroring,
because the leader's stop sequence may still be waiting for a checkpoint that needs this node.
Node rank 0 is the leader's: an agent started there (a uniform ``srun`` line) exits at once.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import anyio

from supervisor import childenv
from supervisor.conduct.fleet import CHOICE_VAR, READY_TIMEOUT_S, SAY_VAR, read_choice
from supervisor.config import Config, agent_view, pair_view
from supervisor.errors import ConfigError
from supervisor.job import detect_job
from supervisor.jobprocs import JobProcesses
from supervisor.journal import EVENTS_FILE, Emit, Journal, JournalTail, next_attempt, node_dir
from supervisor.sync import Mirror

log = logging.getLogger("supervise")

# Where a launcher tells a process its place, in the order they are trusted. With one task per
# node (srun --ntasks-per-node=1, mpiexec --ppn 1) a task's rank is its node's index.
RANK_VARIABLES = (childenv.NODE_RANK, "SLURM_NODEID", "PMIX_RANK", "PMI_RANK", "PALS_RANKID",
                  "OMPI_COMM_WORLD_RANK")
FINAL_FLUSH_S = 60.0
LOCK_FILE = "agent.lock"
CHOICE_POLL_S = 0.1  # while the leader chooses what every node restores
LEADER_POLL_S = 0.2  # the leader's journal: its last flush's request waits on our answer
TRAINING_POLL_S = 1.0  # how often the agent looks for the job's processes on its node (_follow_training)


def node_rank(given: str | None, env: Mapping[str, str]) -> int:
    """``--node-rank``, else the launcher's variables; ConfigError when nothing says."""
    source, raw = "--node-rank", given
    if raw is None:
        for var in RANK_VARIABLES:
            if env.get(var, "").strip():
                source, raw = f"environment {var}", env[var].strip()
                break
    if raw is None:
        raise ConfigError("node_rank", None, "missing: give --node-rank K (or start the agent with "
                          "srun --ntasks-per-node=1 / mpiexec --ppn 1, which set it)")
    if not raw.isdigit():
        raise ConfigError("node_rank", raw, "expected a whole number, 0 or more", source)
    return int(raw)


async def _start_samplers(tg: anyio.abc.TaskGroup, cfg: Config, where: Path, emit: Emit,
                          env: Mapping[str, str]) -> None:
    """This node's GPUs and host, sampled as the leader samples its own, into this node's
    directory (``nodes/node-K/gpu.csv``, ``host.csv``; their events in its journal). The
    training's processes here are not the agent's children: the host sampler records the
    node (memory), not a process tree."""
    from functools import partial

    from supervisor.gpu import GpuSampler
    from supervisor.host import HostSampler
    from supervisor.conduct.parts import guarded

    gpu = GpuSampler(run_dir=where, emit=emit, every=cfg.gpu_every, backend=cfg.gpu_backend, env=env,
                     dmon_log=cfg.dmon_log)
    host = HostSampler(run_dir=where, emit=emit, every=cfg.gpu_every)
    await tg.start(partial(guarded, "gpu", partial(gpu.run, tree_pids=set), emit))
    await tg.start(partial(guarded, "host", partial(host.run, tree_pids=set), emit))


async def _follow_training(training: JobProcesses, mirror: Mirror, emit: Emit, rank: int) -> None:
    """The job's processes on this node, looked for every ``TRAINING_POLL_S``: once found and
    then all gone, the training here has exited, and nothing can change its files any more
    (``node-training``); found again (the leader restarted it in place), it runs again."""
    running = False
    while True:
        pids = await anyio.to_thread.run_sync(training)
        if bool(pids) != running:
            running = bool(pids)
            if running:
                mirror.training_resumed()
            else:
                mirror.training_exited()
                mirror.request("training-exited")  # what waited for quiet time is judged now
            emit("node-training", node=rank, state="running" if running else "exited", processes=len(pids))
            log.info("node %d: the training's processes here %s", rank,
                     f"found ({len(pids)})" if running else "are gone: it has exited")
        await anyio.sleep(TRAINING_POLL_S)


def ranks_here(training: JobProcesses) -> tuple[set[int], set[int]]:
    """(the training's ranks on this node, the job's processes here): what the leader's stop
    signal is for (PBS gives it only to the first node's processes). The job's processes are
    found from the system (``JobProcesses``: this job's id in /proc/PID/environ, this uid, not
    the agent nor its ancestors or descendants); of those, the ranks are the topmost that are
    no launcher helper or wrapper (orted, a shell, ``env``) and carry a rank variable (MPI's,
    torch's), as the leader finds its own (``LauncherProfile.ranks``): a rank's data loader
    workers are below it and get nothing from us, a torchrun is the top and forwards it. With
    no rank variable to be seen, the topmost processes that are no wrapper."""
    from supervisor import proctree
    from supervisor.launchers import _RANK_VARS_MPI, _RANK_VARS_TORCH, _env_key, _is_wrapper

    job = training()
    uid = os.getuid()
    here = _uts("self")

    def mine(pid: int) -> bool:
        """This uid's, and on this node: in this UTS namespace (one machine's processes share
        one; the nodes of a test cluster are namespaces of one machine that share its pids)."""
        try:
            return os.stat(f"/proc/{pid}").st_uid == uid and (here is None or _uts(str(pid)) == here)
        except OSError:
            return False

    job = {p for p in job if mine(p)}
    parent = {p.pid: p.ppid for p in proctree.all_processes()}
    real = {p for p in job if not _is_wrapper(p)}
    keyed = {p for p in real if _env_key(p, _RANK_VARS_MPI + _RANK_VARS_TORCH)}

    def tops(among: set[int]) -> set[int]:
        out = set()
        for pid in among:
            up = parent.get(pid, 0)
            while up > 1 and up not in among:
                up = parent.get(up, 0)
            if up not in among:
                out.add(pid)
        return out

    return (tops(keyed) if keyed else tops(real)), job


def _uts(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return None


def signal_ranks(training: JobProcesses | None, name: str) -> dict[str, Any]:
    """Send the leader's stop signal ``name`` to the training's ranks on this node, once."""
    if training is None:
        return {"pids": [], "error": "not in a job: the training's processes cannot be told apart"}
    try:
        sig = signal.Signals[name]
    except KeyError:
        return {"pids": [], "error": f"unknown signal {name!r}"}
    from supervisor.launchers import _cmdline

    ranks, job = ranks_here(training)
    sent, failed, what = [], {}, {}
    for pid in sorted(ranks):
        what[str(pid)] = " ".join(_cmdline(pid))[:200]
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except OSError as e:
            failed[str(pid)] = e.strerror or str(e)
    others = {str(p): " ".join(_cmdline(p))[:120] for p in sorted(job - ranks)}
    return {"pids": sent, "failed": failed, "commands": what, "not_signalled": others}


def _say(what: str, rank: int, more: str = "") -> None:
    """One line for the leader that started the agents (``fleet.READY_LINE``): on stdout (srun
    brings it back), and appended to ``$SUPERVISE_NODE_SAY/node-K`` when the leader named that
    directory (a PBS TM task's stdout goes to the job's output file, not to the leader)."""
    line = f"supervise-node-agent {what} {rank} {socket.gethostname()} {more}".rstrip()
    try:
        print(line, flush=True)
    except (OSError, ValueError):
        pass  # nobody reads it (an agent started by the job script with its stdout closed)
    where = os.environ.get(SAY_VAR)
    if where:
        try:
            with open(Path(where) / f"node-{rank}", "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as e:
            log.warning("could not tell the leader %r (%s): %s", what, where, e)


async def _restore(mirror: Any, env: Mapping[str, str], rank: int) -> None:
    """Started by the leader: offer this node's unpublished whole versions, say so, wait for
    the leader's choice and restore exactly that (every node the same version). Started by
    the job script (no choice file named): the newest published version, as the leader's
    own restore picks it."""
    path = env.get(CHOICE_VAR)
    if not path:
        await mirror.restore()
        return
    await mirror.offer()
    _say("offered", rank)
    choice = None
    with anyio.move_on_after(2 * READY_TIMEOUT_S):
        while (choice := await anyio.to_thread.run_sync(read_choice, Path(path))) is None:
            await anyio.sleep(CHOICE_POLL_S)
    if choice is None:
        log.warning("no choice from the leader in %.0fs (%s): restoring the newest published version",
                    2 * READY_TIMEOUT_S, path)
    await mirror.restore(choice)


def _hold(where: Path) -> int | None:
    """An exclusive lock on the node's journal directory: a second agent for the same node
    (the job script's own ``srun … node-agent`` line beside the leader's) gets None."""
    fd = os.open(where / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        pass  # a filesystem without flock (Lustre mounted without it): no guard, not a refusal
    return fd


def _previous_start(path: Path) -> dict | None:
    """The leader's ``start`` of the attempt before its newest (the newest is this attempt's:
    the leader journals it before it starts the agents)."""
    starts = []
    try:
        with open(path, "rb") as f:
            for raw in f:
                if b'"kind":"start"' in raw:
                    try:
                        starts.append(json.loads(raw))
                    except ValueError:
                        pass
    except OSError:
        return None
    return starts[-2] if len(starts) >= 2 else None


async def run_node_agent(cfg: Config, rank: int, env: Mapping[str, str] | None = None,
                         parts_poll: float = 1.0) -> int:
    """Mirror this node's parts until the leader ends (or a second stop signal); exit status."""
    from supervisor import __version__, logs

    env = dict(os.environ if env is None else env)
    assert cfg.run_dir is not None
    job_nodes = detect_job(env).num_nodes  # nodes = "auto": this job's (as the leader's plan resolves it)
    pairs = [q for q in (p.for_job(job_nodes) for p in cfg.sync) if q.kind == "checkpoint" and q.nodes > 1]
    if rank == 0:
        log.info("node rank 0 is the leader's: the main supervise mirrors this node's part; nothing to do")
        _say("leader", rank)
        return 0
    if not pairs:
        raise ConfigError("nodes", 1, "no per-node checkpoint pair: give --nodes N with --checkpoints, "
                          "or nodes = N in a [[sync]] table")
    mirror = Mirror(pairs, emit=lambda *a, **k: {}, sync_every=cfg.sync_every, backend=cfg.sync_backend,
                    nice=cfg.sync_nice, ionice=cfg.sync_ionice, streams=cfg.sync_streams, node_rank=rank,
                    parts_poll=parts_poll)
    warnings = mirror.check()  # ConfigError before anything is written
    where = node_dir(cfg.run_dir, rank)
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError("run_dir", str(where), f"cannot be created: {e.strerror}") from None
    lock = _hold(where)
    if lock is None:
        log.info("another node agent for node %d is running (%s): nothing to do", rank, where / LOCK_FILE)
        _say("duplicate", rank)
        return 0
    logs.add_file(where, cfg.verbosity)
    for w in warnings:
        log.warning("%s", w)
    journal = Journal(where, next_attempt(where, env))
    training = JobProcesses.from_env(env)  # None outside a job: no writer can be seen, quiet time decides
    mirror = Mirror(pairs, emit=journal.emit, sync_every=cfg.sync_every, backend=cfg.sync_backend,
                    nice=cfg.sync_nice, ionice=cfg.sync_ionice, streams=cfg.sync_streams, node_rank=rank,
                    parts_poll=parts_poll, writers=training)
    journal.emit("node-start", durable=True, version=__version__, node=rank, nodes=max(p.nodes for p in pairs),
                 host=socket.gethostname(), pid=os.getpid(), argv=sys.argv, backend=mirror.backend_name,
                 pairs=[pair_view(p) for p in pairs], settings={k: v for k, v in agent_view(cfg).items() if k != "sync"},
                 writers=training.describe() if training is not None else None)
    log.info("node agent %d of %d on %s, journal %s", rank, max(p.nodes for p in pairs), socket.gethostname(), where)
    t0 = time.monotonic()
    leader = JournalTail(cfg.run_dir / EVENTS_FILE)
    reason, detail = "leader-ended", ""
    try:
        await mirror.prepare(previous_start=_previous_start(cfg.run_dir / EVENTS_FILE), host=socket.gethostname())
        await _restore(mirror, env, rank)
        holds = await anyio.to_thread.run_sync(mirror.holds)
        async with anyio.create_task_group() as tg:
            await tg.start(mirror.run)
            # the leader that started us (supervisor/conduct/fleet.py) compares what every node
            # holds, then spawns the training
            _say("ready", rank, json.dumps(holds, separators=(",", ":")))
            if cfg.gpu_every > 0:
                await _start_samplers(tg, cfg, where, journal.emit, env)
            if training is not None:
                tg.start_soon(_follow_training, training, mirror, journal.emit, rank)
            stop = anyio.Event()
            why: list[tuple[str, str]] = []

            async def signals() -> None:
                seen = 0
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as received:
                    async for sig in received:
                        seen += 1
                        name = signal.Signals(sig).name
                        if seen == 1 and sig != signal.SIGHUP:
                            journal.emit("signal", signal=name, action="flush",
                                         why="going on until the leader ends; a second one stops the agent")
                            mirror.request(f"signal:{name}")
                            continue
                        if sig == signal.SIGHUP:
                            mirror.request("signal:SIGHUP")
                            continue
                        journal.emit("signal", signal=name, action="stop")
                        why.append(("signal", name))
                        stop.set()

            async def leader_words() -> None:
                """The leader's journal: its last flush asks for ours (answered in this
                node's journal, ``node-flush`` with its ``request``); its ``end`` ends us."""
                while True:
                    for ev in await anyio.to_thread.run_sync(leader.appended):
                        if ev.get("kind") == "nodes-flush":
                            await answer(ev)
                        elif ev.get("kind") == "nodes-signal" and rank in (ev.get("nodes") or []):
                            done = await anyio.to_thread.run_sync(signal_ranks, training, str(ev.get("signal")))
                            journal.emit("node-signal", request=ev.get("request"), signal=ev.get("signal"), node=rank,
                                         durable=True, **done)
                            log.info("node %d: the leader's %s sent to %s", rank, ev.get("signal"), done["pids"] or "nobody")
                        elif ev.get("kind") == "end":
                            why.append(("leader-ended", f"leader attempt {ev.get('attempt')}: {ev.get('reason')}"))
                            stop.set()
                            return
                    await anyio.sleep(LEADER_POLL_S)

            async def answer(ev: dict) -> None:
                if ev.get("exited"):
                    mirror.training_exited()  # every rank is gone: nothing here waits for quiescence
                result = await mirror.flush("leader")
                journal.emit("node-flush", request=ev.get("request"), ok=result["ok"], seconds=result["seconds"],
                             pairs=result["pairs"], not_durable=[f"node {rank}: {line}" for line in mirror.pending()],
                             durable=True)

            tg.start_soon(signals)
            tg.start_soon(leader_words)
            await stop.wait()
            reason, detail = why[0]
            with anyio.move_on_after(FINAL_FLUSH_S):
                result = await mirror.flush(reason)
                journal.emit("node-flush", ok=result["ok"], seconds=result["seconds"], pairs=result["pairs"])
            tg.cancel_scope.cancel()
    except Exception as e:  # noqa: BLE001 - journaled; the leader decides what it means
        reason, detail = "error", f"{type(e).__name__}: {e}"
        journal.emit("error", error=detail)
    journal.emit("node-end", node=rank, reason=reason, detail=detail, seconds=round(time.monotonic() - t0, 3),
                 not_durable=mirror.pending())
    journal.close()
    os.close(lock)
    return 0 if reason != "error" else 1
