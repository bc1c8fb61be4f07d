"""Host sampling: CPU and memory of the training's process tree, and the node's memory.

Read straight from /proc (Linux) at the GPU cadence, written to ``host.csv`` in batches.
A post-mortem needs to tell "the input pipeline starved the GPUs" (CPU pinned, GPUs idle)
from "the node ran out of memory" (MemAvailable near zero before the OOM kill), so we keep
the tree's CPU time and RSS and the node's available memory. Columns: ``docs/gpu.md``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import anyio
import anyio.to_thread
from anyio.abc import TaskStatus

from supervisor._csv import CsvWriter
from supervisor.journal import Emit

HOST_FILE = "host.csv"
HOST_COLUMNS = ("time", "nprocs", "cpu_pct", "rss_mib", "node_mem_total_mib", "node_mem_available_mib", "load1")
PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def read_proc(pid: int) -> tuple[int, int] | None:
    """(CPU ticks user+system, RSS bytes) of one process, or None if it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_bytes()
        statm = (PROC / str(pid) / "statm").read_bytes()
    except OSError:
        return None
    rest = stat[stat.rfind(b")") + 2 :].split()
    try:
        ticks = int(rest[11]) + int(rest[12])  # utime, stime (fields 14 and 15)
        rss = int(statm.split()[1]) * _PAGE
    except (IndexError, ValueError):
        return None
    return ticks, rss


def read_meminfo() -> dict[str, int]:
    """MemTotal, MemAvailable, ... in bytes."""
    out: dict[str, int] = {}
    try:
        text = (PROC / "meminfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


class TreeCpu:
    """CPU % of a changing set of processes between two readings.

    Per pid, so a rank that exits between ticks does not make the total go backwards,
    and a new one counts only the ticks it used since it appeared.
    """

    def __init__(self) -> None:
        self._prev: dict[int, int] = {}
        self._t: float | None = None

    def update(self, t: float, ticks: dict[int, int]) -> float | None:
        used = sum(v - self._prev.get(pid, v if self._t is None else 0) for pid, v in ticks.items())
        pct = None
        if self._t is not None and t > self._t:
            pct = max(0.0, used / _TICKS / (t - self._t) * 100)
        self._prev, self._t = ticks, t
        return pct


class HostSampler:
    """Samples the training tree and the node every ``every`` seconds until cancelled."""

    def __init__(self, *, run_dir: Path, emit: Emit, every: float) -> None:
        self.run_dir = Path(run_dir)
        self.emit = emit
        self.every = every
        self._cpu = TreeCpu()
        self.last: dict[str, float | int | None] = {}

    def _sample(self, tree_pids: Callable[[], set[int]]) -> dict[str, float | int | None]:
        try:
            pids = tree_pids()
        except Exception:
            pids = set()
        ticks: dict[int, int] = {}
        rss = 0
        for pid in pids:
            got = read_proc(pid)
            if got is not None:
                ticks[pid], r = got
                rss += r
        t = time.monotonic()
        mem = read_meminfo()
        try:
            load1: float | None = os.getloadavg()[0]
        except OSError:
            load1 = None
        row = {
            "time": round(time.time(), 3), "nprocs": len(ticks), "cpu_pct": self._cpu.update(t, ticks),
            "rss_mib": round(rss / 2**20, 1),
            "node_mem_total_mib": round(mem["MemTotal"] / 2**20) if "MemTotal" in mem else None,
            "node_mem_available_mib": round(mem["MemAvailable"] / 2**20) if "MemAvailable" in mem else None,
            "load1": load1,
        }
        if row["cpu_pct"] is not None:
            row["cpu_pct"] = round(row["cpu_pct"], 1)
        return row

    async def run(self, *, tree_pids: Callable[[], set[int]], task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Sample until cancelled; the last batch is flushed within 5 s of the cancel.

        ``tree_pids`` is called in a worker thread once per tick.
        """
        if self.every <= 0:
            task_status.started()
            return
        csv = CsvWriter(self.run_dir / HOST_FILE, HOST_COLUMNS)
        task_status.started()
        errors: set[str] = set()
        try:
            next_at = anyio.current_time()
            while True:
                row = await anyio.to_thread.run_sync(self._sample, tree_pids, abandon_on_cancel=True)
                self.last = row
                csv.add_row(row)
                if csv.due():
                    try:
                        with anyio.move_on_after(10):
                            await anyio.to_thread.run_sync(csv.flush, abandon_on_cancel=True)
                    except OSError as e:
                        if str(e) not in errors:
                            errors.add(str(e))
                            self.emit("host-error", error=f"writing {HOST_FILE}: {e}")
                next_at = max(next_at + self.every, anyio.current_time())
                await anyio.sleep_until(next_at)
        finally:
            with anyio.CancelScope(shield=True, deadline=anyio.current_time() + 5):
                try:
                    await anyio.to_thread.run_sync(csv.flush, abandon_on_cancel=True)
                except OSError as e:
                    self.emit("host-error", error=f"writing {HOST_FILE}: {e}")
