"""The sync room: checkpoints and logs from node-local disk to persistent storage.

``Mirror`` is the one thing the agent sees. Checkpoints are published complete or not at
all (staged under ``.supervise-staging-<name>`` on the destination, verified, renamed),
markers and pointer files last; logs grow in place so a TensorBoard reading the persistent
copy sees new points. A checkpoint pair with ``nodes = N`` (every node writes its shards to
its own local disk) publishes a checkpoint only once every node's part is durable: node K's
mirror (``supervise node-agent``, ``node_rank=K``) stages parts, the leader (node 0, the main
``supervise``) assembles them: each pair's engine composes its role (``_roles.py``), and the
mirror asks it, never which kind it is. Rules, event kinds and fields: docs/sync.md.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Sequence

import anyio
from anyio.abc import TaskStatus

from supervisor.config import DEFAULT, SyncPair
from supervisor.errors import ConfigError
from supervisor.journal import Emit
from supervisor.sync import _fsops, _peers
from supervisor.sync._backend import Backend, CopyError, PythonBackend, choose_backend
from supervisor.sync._checks import check_pairs
from supervisor.sync._complete import STAGING_PREFIX
from supervisor.sync._aside import role_before
from supervisor.sync._pair import PairEngine
from supervisor.sync._parts import missing_from
from supervisor.sync._describe import describe
from supervisor.sync._roles import Leader, Node, Role, Single

__all__ = ["Mirror", "published_in"]

log = logging.getLogger("supervise")



@dataclass(frozen=True)
class Published:
    """One checkpoint this mirror published (``Mirror.publishes``): what a stop asks of it.
    ``ident``: its top-level name and inode (None for a per-node pair's assembly, which has no
    one inode); ``completed_at``: its completion evidence (a marker's mtime, a close, the
    latest part's), wall clock, None when unknown; ``published_at``: when it landed."""

    ident: tuple[str, int] | None
    completed_at: float | None
    published_at: float

    @property
    def saved_at(self) -> float:
        """When the training finished saving it: its completion evidence, else its landing
        (the journal's ``publish`` time less its ``lag_s``)."""
        return self.completed_at if self.completed_at is not None else self.published_at


def _role_for(kind: str, nodes: int, node_rank: int, parts_poll: float = 1.0) -> Role:
    """The role of a pair of ``kind`` written by ``nodes`` nodes, on node ``node_rank``,
    whatever its persistent side (the engine's ``storage``, chosen in ``_pair.storage_for``)."""
    if kind != "checkpoint" or nodes <= 1:
        return Single()
    return Leader(parts_poll) if node_rank == 0 else Node(node_rank, parts_poll)


def _logged(emit: Emit) -> Emit:
    """What a person must hear of (a torn checkpoint, a restore refused or failed, a pair
    that relies on quiescence alone) goes to the log as well as the journal."""
    def logged(kind: str, /, **fields: Any) -> Any:
        if kind == "torn":
            log.warning("sync %s: %s is torn (%s); it is never published", fields["pair"], fields["checkpoint"], fields["why"])
        elif kind == "restore-failed":
            log.warning("sync %s: restore failed: %s; starting without it", fields["pair"], fields["error"])
        elif kind == "restore" and fields.get("checkpoint") is None:
            log.warning("sync %s: nothing restored: %s", fields["pair"], fields.get("reason"))
        elif kind == "sync-profile":
            how = ("relies on quiescence alone (settle): set markers, or profile" if fields["quiescence"]
                   else f"complete by evidence (writers {fields['writers']})")
            (log.warning if fields["quiescence"] else log.info)(
                "sync %s: profile %s (from %s); %s", fields["pair"], fields["profile"], fields["evidence"], how)
        return emit(kind, **fields)
    return logged


def published_in(events: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Pair name → checkpoints that ``publish`` events of a journal name (the run
    directory's earlier attempts): what this run may replace on the persistent side."""
    out: dict[str, set[str]] = {}
    for e in events:
        if e.get("kind") == "publish" and isinstance(e.get("pair"), str) and isinstance(e.get("checkpoint"), str):
            out.setdefault(e["pair"], set()).add(e["checkpoint"])
    return out


async def _ready_sides(engines: Sequence[PairEngine], emit: Emit) -> None:
    """Create missing local sides we can; remove our staging leftovers from a killed run."""
    for eng in engines:
        p = eng.pair
        if not await anyio.to_thread.run_sync(p.src.exists):
            try:
                await anyio.to_thread.run_sync(lambda: p.src.mkdir(parents=True, exist_ok=True))
                emit("sync-source", pair=p.name, path=p.src, action="created")
            except OSError as e:
                emit("sync-source", pair=p.name, path=p.src, action="waiting", error=str(e))
        if p.kind != "checkpoint":
            continue
        stale = await anyio.to_thread.run_sync(eng.role.leftovers)
        stale += [s for s in await anyio.to_thread.run_sync(_fsops.stale_staging, p.src)
                  if s.name.startswith(STAGING_PREFIX)]
        for s in stale:
            await anyio.to_thread.run_sync(_fsops.remove_ours, s)
        if stale:
            emit("sync-cleanup", pair=p.name, removed=[str(s) for s in stale])


class Mirror:
    """Mirrors every sync pair until cancelled; the agent asks it for restores and flushes.

    ``node_rank`` is this node's place in a multi-node job: 0 (the default) is the leader,
    which mirrors every pair and assembles the parts of per-node pairs (``nodes > 1``); a node
    agent (K > 0) mirrors only the per-node checkpoint pairs, as parts. ``owner``: this run's
    identity on an object store (its run directory), which claims a checkpoint name's keys.
    """

    def __init__(self, pairs: Sequence[SyncPair], *, emit: Emit, sync_every: float = 600.0,
                 backend: str = "auto", nice: int = 10, ionice: str = "idle",
                 streams: int = DEFAULT["sync_streams"],
                 retry_base: float = 2.0, retry_cap: float = 120.0, node_rank: int = 0,
                 parts_poll: float = 1.0, writers: Callable[[], set[int]] | None = None,
                 published_before: Mapping[str, Iterable[str]] | None = None, owner: str = "") -> None:
        self.node_rank = node_rank
        self._pairs = tuple(p for p in pairs if node_rank == 0 or (p.kind == "checkpoint" and p.nodes > 1))
        self._sink = emit
        self._emit = _logged(lambda kind, **fields: self._sink(kind, **fields))
        emit = self._emit
        self._backend_error: ConfigError | None = None
        try:
            self._backend: Backend = choose_backend(backend, nice=nice, ionice=ionice, streams=streams)
        except FileNotFoundError:
            self._backend_error = ConfigError("sync_backend", backend, "rsync is not on PATH; use auto or python")
            self._backend = PythonBackend(nice, ionice, streams)
        self._published = 0
        self._completed: list[Published] = []  # every checkpoint published, in order (not pointers, nor files beside them)
        self._published_event = anyio.Event()
        self._engines: list[PairEngine] = []
        for p in self._pairs:
            ours = set(published_before.get(p.name, ())) if published_before is not None else None
            self._engines.append(PairEngine(p, self._backend, emit, every=sync_every, retry_base=retry_base,
                                            retry_cap=retry_cap, on_publish=self._count_publish,
                                            writers=writers if p.kind == "checkpoint" else None, ours=ours,
                                            role=_role_for(p.kind, p.nodes, node_rank, parts_poll)))
            self._engines[-1].state.owner = owner


    def attach(self, emit: Emit, writers: Callable[[], set[int]] | None = None) -> None:
        """Before ``run``: the journal to write to (a plan builds the mirror before the journal
        is open), and the training's processes, whose open files are the evidence."""
        self._sink = emit
        for eng in self._engines:
            if eng.pair.kind == "checkpoint":
                eng.writers = writers

    def share_access(self, run_dir: Path) -> None:
        """Before the node agents start: how this leader reaches each object store, for them
        (``RUN/nodes/store-keys.json``, 0600; ``_store.share_access``). Blocking."""
        if any(p.store is not None for p in self._pairs):
            from supervisor.sync._store import share_access

            share_access(run_dir, self._pairs)

    def link(self, tell: Callable[[str], None] | None = None, *, on: bool = False) -> None:
        """The leader's line (conduct/link.py): where per-node pairs speak; ``on``: it carries words."""
        for eng in self._engines:
            eng.role.link(tell, linked=on)

    def heard(self, word: str) -> None:
        """A word from the line's other side: per-node pairs look at shared storage now."""
        for eng in self._engines:
            eng.role.heard(word)

    @property
    def pairs(self) -> tuple[SyncPair, ...]:
        """The pairs this mirror handles (a node agent: only the per-node checkpoint pairs)."""
        return self._pairs

    @property
    def backend_name(self) -> str:
        return self._backend.name

    @property
    def published(self) -> int:
        """Checkpoints published so far in this run; the stop sequence waits for it to move."""
        return self._published

    @property
    def publishes(self) -> tuple[Published, ...]:
        """Every checkpoint published so far in this run, in order: the stop reads the
        training's save rhythm from them (not pointers, nor files beside the checkpoints)."""
        return tuple(self._completed)

    def _count_publish(self, done_at: float | None = None, ident: tuple[str, int] | None = None) -> None:
        self._published += 1
        self._completed.append(Published(ident, done_at, time.time()))
        self._published_event.set()
        self._published_event = anyio.Event()

    def check(self, *, probe: bool = True) -> list[str]:
        """Hard errors raise ConfigError (exit 2, nothing started); doubts come back as warnings.
        ``probe``: ask each object store whether this run may write it (not again in a later
        attempt of the same process: a spare's, whose store may be the very thing that hangs)."""
        if self._backend_error is not None:
            raise self._backend_error
        warnings = check_pairs(self._pairs)
        for p in self._pairs:
            if p.kind == "checkpoint" and p.nodes > 1 and self.node_rank >= p.nodes:
                raise ConfigError("node_rank", self.node_rank, f"expected 1 to {p.nodes - 1}: sync {p.name} has nodes = {p.nodes}")
        for eng in self._engines:
            if probe and (hung := eng.storage.probe()) is not None:
                warnings.append(hung)
        return warnings

    async def prepare(self, *, previous_start: Mapping[str, Any] | None, host: str) -> list[str]:
        """Before the restore and the offer: a host that was another node in the attempt
        before (``previous_start``: that attempt's ``start`` event, naming its nodes) holds on
        its local side what it wrote in that role; taken as this role's part it would mix
        other ranks' shards into it (a part of ranks 0-1 twice and none of ranks 2-3 would
        look whole). Every per-node pair's local checkpoints not published yet are set aside
        (``part-set-aside``); returns their names."""
        was = role_before(previous_start, host)
        moved: list[str] = []
        for eng in self._engines:
            moved += await anyio.to_thread.run_sync(eng.role.set_aside_role, was)
        return moved

    @staticmethod
    def parts_missing(dst: Path, node: int) -> list[str]:
        """The checkpoints under the persistent side ``dst`` of a per-node pair that have parts,
        are not published, and lack node ``node``'s: what that node's loss left unpublished
        (``node-lost``). Blocking."""
        return missing_from(dst, node)

    async def restore(self, choice: Mapping[str, Any] | None = None) -> Path | None:
        """Before spawn: for pairs with ``restore = true``, the newest complete checkpoint from
        persistent storage to local disk, so a requeued attempt resumes from fast local disk.
        Returns the local path of the first pair's restored checkpoint (SUPERVISE_RESTORED_FROM).
        A failed restore is journaled and the run starts without it. ``choice``: per per-node
        pair, the version the leader chose for every node (``choose``)."""
        first: Path | None = None
        for eng in self._restoring():
            try:
                got = await eng.role.restore(choice)
            except (OSError, CopyError) as e:
                self._emit("restore-failed", pair=eng.pair.name, error=str(e))
                continue
            first = first or got
        return first

    def _restoring(self) -> list[PairEngine]:
        return [e for e in self._engines if e.pair.kind == "checkpoint" and e.pair.restore]

    async def serve_peers(self, run_dir: Path, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Before the offer, until cancelled: this node's per-node pairs served to the other
        nodes, and theirs reachable from here (``_peers``: every restore fills from the nearest
        copy that verifies)."""
        engines = [e for e in self._restoring() if e.pair.nodes > 1]
        book = _peers.Book(run_dir, self.node_rank)
        for eng in engines:
            eng.role.meet(book)
        if not engines:
            task_status.started()
            return
        await _peers.serve([e.pair for e in engines], run_dir, self.node_rank, task_status=task_status)

    async def offer(self) -> dict[str, Any]:
        """A node agent, before the leader chooses: its whole versions of per-node pairs not
        yet published go up as parts (the role's ``offer``); returns, per pair, what it holds
        (``_peers.holdings``) for the leader's choice."""
        out: dict[str, Any] = {}
        for eng in self._restoring():
            try:
                out[eng.pair.name] = await eng.role.offer()
            except (OSError, CopyError) as e:
                self._emit("restore-failed", pair=eng.pair.name, error=f"offering this node's versions: {e}")
        return out

    async def choose(self, offers: Mapping[int, Mapping[str, Any]] | None = None,
                     without: Mapping[str, Collection[str]] | None = None) -> dict[str, Any]:
        """The leader, before every node restores: per per-node pair, the one version they all
        restore: the newest whole across the nodes' ``offers`` and persistent storage (never one
        ``without`` names for the pair: it verified nowhere on some node), and who holds its files."""
        out: dict[str, Any] = {}
        for eng in self._restoring():
            try:
                out.update(await eng.role.choose(offers, (without or {}).get(eng.pair.name, ())))
            except (OSError, CopyError) as e:
                self._emit("restore-failed", pair=eng.pair.name, error=f"choosing the version: {e}")
        return out

    def holds(self) -> dict[str, Any]:
        """Per per-node pair, the version this node restored (name, bytes, mtime, sha256), or
        None. Blocking: hashes the restored file."""
        return {name: v for eng in self._restoring() for name, v in eng.role.holds().items()}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watchers, pass loops and safety-net timers for every pair, until cancelled."""
        await _ready_sides(self._engines, self._emit)
        async with anyio.create_task_group() as tg:
            for eng in self._engines:
                await tg.start(eng.watch)
                for task in eng.tasks():  # the pass loop, the ticker; per-node pairs: the parts watch
                    tg.start_soon(task)
                eng.trigger("start")
            task_status.started()

    def training_exited(self) -> None:
        """The training's whole tree is gone: nothing can change any more, so later passes
        publish what its profile calls complete without waiting, and name what is torn."""
        for eng in self._engines:
            eng.training_exited()

    def training_resumed(self) -> None:
        """A node agent: the job's processes are back on this node (the leader restarted the
        training in place) after ``training_exited``: files may change again."""
        for eng in self._engines:
            eng.exited = False

    def describe(self) -> list[tuple[str, str]]:
        """For ``supervise check`` and the start: each pair, its sides, backend and profile
        (detected from what is on disk now, local side first). Blocking: reads directories."""
        return describe(self._engines)

    def request(self, reason: str) -> None:
        """Sync every pair now (coalesces with a pass already running); never blocks."""
        for eng in self._engines:
            eng.trigger(f"request:{reason}")

    async def in_progress(self) -> frozenset[tuple[str, int]]:
        """Checkpoints being written now, in every checkpoint pair whose publishes name their
        checkpoint (a part's assembly has no identity): the stop sequence takes this at its
        request, and none of them answers it."""
        found: set[tuple[str, int]] = set()
        for eng in self._engines:
            if eng.pair.kind == "checkpoint" and eng.role.identifies:
                found |= await anyio.to_thread.run_sync(eng.in_progress)
        return frozenset(found)

    async def wait_completed(self, since: float, accept: Callable[[float | None, float], bool],
                             started: Callable[[Any], bool] = lambda ident: True) -> Published:
        """The first checkpoint published that ``accept(completed_at, since)`` and
        ``started(ident)`` take (the stop sequence: one started and completed after its
        request, not any publish)."""
        seen = 0
        while True:
            fresh, seen = self._completed[seen:], len(self._completed)
            for done in fresh:
                if accept(done.completed_at, since) and started(done.ident):
                    return done
            await self._published_event.wait()

    @contextmanager
    def hurry(self, reason: str) -> Iterator[None]:
        """While a stop waits for its checkpoint: every pair passes now (``request:<reason>``)
        and, until the block ends, no trigger (a file event, a settle re-check) waits out a
        failed pass's backoff, and a failed pass is retried within a second (``Schedule.hurry``)."""
        for eng in self._engines:
            eng.hurry(True)
        self.request(reason)
        try:
            yield
        finally:
            for eng in self._engines:
                eng.hurry(False)

    async def flush(self, reason: str) -> dict[str, Any]:
        """One final pass of every pair, concurrently, right now (backoff ignored).

        Cancel-safe: a cancelled copy kills its copier; a staged checkpoint is renamed into
        place only after it is verified, so the destination holds old or new, never torn.
        The leader's node agents are not the mirror's: its stop asks them for their last
        flush between two of these (``stopping.last_flush``).
        """
        t0 = time.monotonic()
        results = await self._passes(reason)
        pending = self.pending()
        return {"reason": reason, "seconds": round(time.monotonic() - t0, 3), "pairs": results,
                "ok": all(r["ok"] for r in results.values()) and not pending, "pending": pending}

    async def _passes(self, reason: str) -> dict[str, Any]:
        results: dict[str, Any] = {}

        async def one(eng: PairEngine) -> None:
            try:
                async with eng.lock:
                    results[eng.pair.name] = await eng.run_pass(f"flush:{reason}")
            finally:
                if eng.pair.name not in results:  # cut short (a hung store or copier): owed, as things are now
                    with anyio.CancelScope(shield=True):
                        await eng.note_owed()

        async with anyio.create_task_group() as tg:
            for eng in self._engines:
                tg.start_soon(one, eng)
        return results

    def pending(self) -> list[str]:
        """What is not yet durable here, one line each (for the ``end`` event; the leader's
        adds what its node agents said, ``RunState.pending``)."""
        return [line for eng in self._engines for line in eng.pending]

    def last_activity(self) -> float | None:
        """``time.monotonic()`` of the last change seen in any local side (hang watchdog)."""
        seen = [eng.last_activity for eng in self._engines if eng.last_activity is not None]
        return max(seen) if seen else None


