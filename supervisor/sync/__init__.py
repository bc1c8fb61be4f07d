"""The sync room: checkpoints and logs from node-local disk to persistent storage.

``Mirror`` is the one thing the agent sees. Checkpoints are published complete or not at
all (staged under ``.supervise-staging-<name>`` on the destination, verified, renamed),
markers and pointer files last; logs grow in place so a TensorBoard reading the persistent
copy sees new points. Rules, event kinds and fields: docs/sync.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import anyio
from anyio.abc import TaskStatus

from supervisor.config import SyncPair
from supervisor.errors import ConfigError
from supervisor.journal import Emit
from supervisor.sync import _fsops
from supervisor.sync._backend import Backend, CopyError, PythonBackend, choose_backend
from supervisor.sync._checks import check_pairs
from supervisor.sync._pair import PairEngine

__all__ = ["Mirror"]


class Mirror:
    """Mirrors every sync pair until cancelled; the agent asks it for restores and flushes."""

    def __init__(self, pairs: Sequence[SyncPair], *, emit: Emit, sync_every: float = 600.0,
                 backend: str = "auto", nice: int = 10, ionice: str = "idle",
                 retry_base: float = 2.0, retry_cap: float = 120.0) -> None:
        self._pairs = tuple(pairs)
        self._emit = emit
        self._backend_error: ConfigError | None = None
        try:
            self._backend: Backend = choose_backend(backend, nice=nice, ionice=ionice)
        except FileNotFoundError:
            self._backend_error = ConfigError("sync_backend", backend, "rsync is not on PATH; use auto or python")
            self._backend = PythonBackend(nice, ionice)
        self._published = 0
        self._published_event = anyio.Event()
        self._engines = [PairEngine(p, self._backend, emit, every=sync_every, retry_base=retry_base,
                                    retry_cap=retry_cap, on_publish=self._count_publish) for p in self._pairs]

    @property
    def backend_name(self) -> str:
        return self._backend.name

    @property
    def published(self) -> int:
        """Checkpoints published so far in this run; the stop sequence waits for it to move."""
        return self._published

    def _count_publish(self) -> None:
        self._published += 1
        self._published_event.set()
        self._published_event = anyio.Event()

    def check(self) -> list[str]:
        """Hard errors raise ConfigError (exit 2, nothing started); doubts come back as warnings."""
        if self._backend_error is not None:
            raise self._backend_error
        return check_pairs(self._pairs)

    async def restore(self) -> Path | None:
        """Before spawn: for pairs with ``restore = true``, the newest complete checkpoint from
        persistent storage to local disk, so a requeued attempt resumes from fast local disk.
        Returns the local path of the first pair's restored checkpoint (SUPERVISE_RESTORED_FROM).
        A failed restore is journaled and the run starts without it."""
        first: Path | None = None
        for eng in self._engines:
            if eng.pair.kind != "checkpoint" or not eng.pair.restore:
                continue
            try:
                got = await eng.restore()
            except (OSError, CopyError) as e:
                self._emit("restore-failed", pair=eng.pair.name, error=str(e))
                continue
            first = first or got
        return first

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watchers, pass loops and safety-net timers for every pair, until cancelled."""
        await self._prepare()
        async with anyio.create_task_group() as tg:
            for eng in self._engines:
                await tg.start(eng.watch)
                tg.start_soon(eng.loop)
                tg.start_soon(eng.ticker)
                eng.trigger("start")
            task_status.started()

    async def _prepare(self) -> None:
        """Create missing local sides we can; remove our staging leftovers from a killed run."""
        for eng in self._engines:
            p = eng.pair
            if not await anyio.to_thread.run_sync(p.src.exists):
                try:
                    await anyio.to_thread.run_sync(lambda: p.src.mkdir(parents=True, exist_ok=True))
                    self._emit("sync-source", pair=p.name, path=p.src, action="created")
                except OSError as e:
                    self._emit("sync-source", pair=p.name, path=p.src, action="waiting", error=str(e))
            if p.kind != "checkpoint":
                continue
            stale = await anyio.to_thread.run_sync(_fsops.stale_staging, p.dst)
            stale += [s for s in await anyio.to_thread.run_sync(_fsops.stale_staging, p.src)
                      if s.name.startswith(".supervise-staging-")]
            for s in stale:
                await anyio.to_thread.run_sync(_fsops.remove_ours, s)
            if stale:
                self._emit("sync-cleanup", pair=p.name, removed=[str(s) for s in stale])

    def request(self, reason: str) -> None:
        """Sync every pair now (coalesces with a pass already running); never blocks."""
        for eng in self._engines:
            eng.trigger(f"request:{reason}")

    async def wait_published(self, after: int) -> None:
        """Return once ``published > after``; the caller bounds the wait with a cancel scope."""
        while self._published <= after:
            await self._published_event.wait()

    async def flush(self, reason: str) -> dict[str, Any]:
        """One final pass of every pair, concurrently, right now (backoff ignored).

        Cancel-safe: a cancelled copy kills its copier; a staged checkpoint is renamed into
        place only after it is verified, so the destination holds old or new, never torn.
        """
        t0 = time.monotonic()
        results: dict[str, Any] = {}

        async def one(eng: PairEngine) -> None:
            async with eng.lock:
                results[eng.pair.name] = await eng.run_pass(f"flush:{reason}")

        async with anyio.create_task_group() as tg:
            for eng in self._engines:
                tg.start_soon(one, eng)
        pending = self.pending()
        return {"reason": reason, "seconds": round(time.monotonic() - t0, 3), "pairs": results,
                "ok": all(r["ok"] for r in results.values()) and not pending, "pending": pending}

    def pending(self) -> list[str]:
        """What is not yet durable, one line each (for the ``end`` event)."""
        return [line for eng in self._engines for line in eng.pending]

    def last_activity(self) -> float | None:
        """``time.monotonic()`` of the last change seen in any local side (hang watchdog)."""
        seen = [eng.last_activity for eng in self._engines if eng.last_activity is not None]
        return max(seen) if seen else None


