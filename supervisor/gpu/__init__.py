"""GPU sampling of the job's GPUs: NVML, else ``nvidia-smi dmon``, else nothing (journaled).

``GpuSampler.run`` is one task in the agent's task group. It opens a backend in a worker
thread, journals what it found, samples every ``every`` seconds into ``gpu.csv`` (and
optionally a dmon-style text log), waits for XID errors alongside, and on cancellation
spends a short, bounded time on end-of-job counters before it returns. Every backend
call runs in a worker thread that is abandoned on cancel, so a stuck NVML call can
never delay the stop sequence. Columns and events: ``docs/gpu.md``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import anyio
import anyio.to_thread
from anyio.abc import TaskStatus

from supervisor._csv import BatchWriter, CsvWriter
from supervisor.gpu._types import DeviceInfo, GpuBackend, GpuSample, GpuUnavailable, Opened
from supervisor.journal import Emit

__all__ = ["GpuSampler", "GpuBackend", "GpuSample", "DeviceInfo", "GpuUnavailable", "GPU_COLUMNS", "open_backend"]

GPU_FILE = "gpu.csv"
DMON_LOG_FILE = "gpu-dmon.log"
GPU_COLUMNS = ("time", "gpu", "uuid", "util_gpu_pct", "util_mem_pct", "mem_used_mib", "mem_total_mib",
               "power_w", "energy_j", "temp_c", "sm_clock_mhz", "mem_clock_mhz", "clock_events", "proc_mem_mib")
BUSY_PCT = 5.0  # a GPU above this utilisation counts as busy for the hang watchdog
OPEN_TIMEOUT = 60.0  # nvmlInit without persistence mode can take seconds per GPU
END_TIMEOUT = 2.0  # end-of-job counters must not hold up the stop
FLUSH_TIMEOUT = 5.0
XID_WAIT = 2.0  # seconds per blocking event-set wait: each wait costs a thread hop (~0.7 ms CPU), and an
# abandoned wait can hold interpreter exit this long (anyio worker threads are not daemons)

# NVML clocks-event reason bits (nvmlClocksEventReason*), named for the CSV.
CLOCK_EVENT_NAMES = {
    0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks",
}


def clock_event_names(mask: int | None) -> str | None:
    """``sw_power_cap|hw_thermal``; empty when none; None when unknown."""
    if mask is None:
        return None
    names = [n for bit, n in CLOCK_EVENT_NAMES.items() if mask & bit]
    rest = mask & ~sum(CLOCK_EVENT_NAMES)
    if rest:
        names.append(hex(rest))
    return "|".join(names)


def _mib(b: int | None) -> float | None:
    return None if b is None else round(b / 2**20, 1)


def sample_row(s: GpuSample) -> dict[str, Any]:
    return {
        "time": round(s.t, 3), "gpu": s.index, "uuid": s.uuid, "util_gpu_pct": s.util_gpu, "util_mem_pct": s.util_mem,
        "mem_used_mib": _mib(s.mem_used), "mem_total_mib": _mib(s.mem_total), "power_w": s.power_w,
        "energy_j": None if s.energy_j is None else round(s.energy_j, 3), "temp_c": s.temp_c,
        "sm_clock_mhz": s.sm_mhz, "mem_clock_mhz": s.mem_mhz, "clock_events": clock_event_names(s.clock_events),
        "proc_mem_mib": _mib(s.proc_mem),
    }


DMON_HEADER = ["#Date Time gpu pwr gtemp sm mem mclk pclk fb", "#YYYYMMDD HH:MM:SS Idx W C % % MHz MHz MB"]


def dmon_line(s: GpuSample) -> str:
    """The sample as ``nvidia-smi dmon -o DT`` would print it, for people who grep."""

    def v(x: float | None) -> str:
        return "-" if x is None else str(int(round(x)))

    stamp = time.strftime("%Y%m%d %H:%M:%S", time.localtime(s.t))
    fb = None if s.mem_used is None else s.mem_used / 2**20
    return " ".join([stamp, str(s.index), v(s.power_w), v(s.temp_c), v(s.util_gpu), v(s.util_mem),
                     v(s.mem_mhz), v(s.sm_mhz), v(fb)])


def open_backend(kind: str, env: Mapping[str, str], every: float) -> tuple[GpuBackend, Opened]:
    """Choose and open a backend; raises GpuUnavailable with every reason tried.

    ``auto`` tries NVML, then ``nvidia-smi dmon``. Blocking: call it in a worker thread.
    """
    from supervisor.gpu._dmon import DmonBackend
    from supervisor.gpu._nvml import NvmlBackend

    reasons = []
    order = {"auto": ("nvml", "dmon"), "nvml": ("nvml",), "dmon": ("dmon",)}.get(kind, ())
    for name in order:
        backend: GpuBackend = NvmlBackend() if name == "nvml" else DmonBackend(every=every, env=env)
        try:
            return backend, backend.open(env)
        except GpuUnavailable as e:
            reasons.append(str(e))
    raise GpuUnavailable("; ".join(reasons) or f"backend {kind!r}")


class GpuSampler:
    """Samples this job's GPUs until cancelled. See the module docstring."""

    def __init__(self, *, run_dir: Path, emit: Emit, every: float, backend: str = "auto",
                 env: Mapping[str, str] | None = None, dmon_log: bool = False,
                 _backend_override: GpuBackend | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.emit = emit
        self.every = every
        self.backend_kind = backend
        self.env = dict(os.environ if env is None else env)
        self.dmon_log = dmon_log
        self._override = _backend_override
        self._last_busy: float | None = None
        self.samples = 0
        self.devices: list[DeviceInfo] = []
        self._csv: CsvWriter | None = None
        self._peaks: dict[str, dict[str, float]] = {}  # uuid -> peak memory, for gpu-end
        self._mem_first: int | None = None  # bytes in use on the job's GPUs at the first sample (before the training)
        self._mem_last: tuple[float, int] | None = None  # (time.monotonic(), bytes in use) of the latest sample

    def memory_held(self, since: float) -> int | None:
        """Bytes in use on the job's GPUs beyond what was in use before the training started,
        from a sample taken after ``since`` (``time.monotonic()``); None without such a sample.
        The health gate before an in-place restart reads it (supervisor/conduct/health.py)."""
        if self._mem_first is None or self._mem_last is None or self._mem_last[0] < since:
            return None
        return max(0, self._mem_last[1] - self._mem_first)

    def last_busy(self) -> float | None:
        """``time.monotonic()`` of the last sample with any GPU above 5 % utilisation."""
        return self._last_busy

    def _open(self) -> tuple[GpuBackend, Opened]:
        if self._override is not None:
            return self._override, self._override.open(self.env)
        return open_backend(self.backend_kind, self.env, self.every)

    def _none(self, reason: str) -> None:
        self.emit("gpu-none", reason=reason, backend=self.backend_kind)

    async def run(self, *, tree_pids: Callable[[], set[int]], task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Open, journal ``gpu-start`` or ``gpu-none``, sample until cancelled, then ``gpu-end``.

        Returns at once (after ``gpu-none``) when there is nothing to sample, so the caller
        needs no special case. ``tree_pids`` is called in a worker thread once per tick.
        ``task_status.started()`` comes after the backend is open (NVML init can take
        seconds without persistence mode): use ``start_soon`` unless you need that order.
        """
        if self.every <= 0 or (self.backend_kind == "none" and self._override is None):
            self._none("GPU sampling is off (--gpu-every 0)" if self.every <= 0 else "GPU sampling is off (gpu_backend = none)")
            task_status.started()
            return
        try:
            with anyio.fail_after(OPEN_TIMEOUT):
                backend, opened = await anyio.to_thread.run_sync(self._open, abandon_on_cancel=True)
        except GpuUnavailable as e:
            self._none(str(e))
            task_status.started()
            return
        except TimeoutError:
            self._none(f"the GPU library did not answer within {OPEN_TIMEOUT:g}s")
            task_status.started()
            return
        except Exception as e:  # docs/design.md, invariant 4: an odd driver/binding must not take the run down
            self._none(f"opening the GPU backend failed: {type(e).__name__}: {e}")
            task_status.started()
            return
        self.devices = opened.devices
        self.emit("gpu-start", backend=backend.name, driver=opened.driver, source=opened.source,
                  selector=self.env.get(opened.source) if opened.source != "all" else None,
                  every=self.every, xid=opened.xid, devices=[d.public() for d in opened.devices])
        self._emit_notes(backend)
        csv = self._csv = CsvWriter(self.run_dir / GPU_FILE, GPU_COLUMNS)
        log = BatchWriter(self.run_dir / DMON_LOG_FILE, DMON_HEADER, rewrite_header_on_open=True) if self.dmon_log else None
        task_status.started()
        try:
            async with anyio.create_task_group() as tg:
                if opened.xid:
                    tg.start_soon(self._xid_loop, backend)
                await self._sample_loop(backend, tree_pids, csv, log)
        finally:
            await self._finish(backend, csv, log)

    async def _sample_loop(self, backend: GpuBackend, tree_pids: Callable[[], set[int]], csv: CsvWriter,
                           log: BatchWriter | None) -> None:
        def tick() -> list[GpuSample]:
            try:
                tree = tree_pids()
            except Exception:
                tree = set()
            return backend.sample(tree)

        backoff = 0.0
        errors_seen: set[str] = set()
        next_at = anyio.current_time()
        while True:
            try:
                samples = await anyio.to_thread.run_sync(tick, abandon_on_cancel=True)
                backoff = 0.0
            except Exception as e:  # docs/design.md, invariant 4: a broken GPU library never takes us down
                text = f"{type(e).__name__}: {e}"
                if text not in errors_seen:
                    errors_seen.add(text)
                    self.emit("gpu-error", error=text)
                samples = []
                backoff = min(max(backoff * 2, self.every), 300.0)
            self._emit_notes(backend)
            self._record(samples, csv, log)
            for w in (csv, log):
                if w is not None and w.due():
                    await self._flush(w)
            next_at += max(self.every, backoff)
            now = anyio.current_time()
            if next_at < now:  # overran (slow call, suspended laptop): don't catch up in a burst
                next_at = now + (self.every if backoff == 0 else backoff)
            await anyio.sleep_until(next_at)

    def _record(self, samples: list[GpuSample], csv: CsvWriter, log: BatchWriter | None) -> None:
        if not samples:
            return
        self.samples += 1
        if any(s.util_gpu is not None and s.util_gpu > BUSY_PCT for s in samples):
            self._last_busy = time.monotonic()
        used = [s.mem_used for s in samples if s.mem_used is not None]
        if used:
            self._mem_first = sum(used) if self._mem_first is None else self._mem_first
            self._mem_last = (time.monotonic(), sum(used))
        for s in samples:
            peak = self._peaks.setdefault(s.uuid, {})
            for key, value in (("peak_mem_used_mib", s.mem_used), ("peak_proc_mem_mib", s.proc_mem)):
                if value is not None:
                    peak[key] = max(peak.get(key, 0.0), round(value / 2**20, 1))
            csv.add_row(sample_row(s))
            if log is not None:
                log.add(dmon_line(s))

    async def _flush(self, w: BatchWriter) -> None:
        try:
            with anyio.move_on_after(FLUSH_TIMEOUT):
                await anyio.to_thread.run_sync(w.flush, abandon_on_cancel=True)
        except OSError as e:
            self.emit("gpu-error", error=f"writing {w.path.name}: {e}")

    async def _xid_loop(self, backend: GpuBackend) -> None:
        while True:
            try:
                found = await anyio.to_thread.run_sync(backend.wait_xid, XID_WAIT, abandon_on_cancel=True)
            except Exception as e:
                self.emit("gpu-error", error=f"XID wait: {type(e).__name__}: {e}")
                return
            for dev, xid in found:
                self.emit("gpu-xid", durable=True, device=dev.index, uuid=dev.uuid, xid=xid)

    def _emit_notes(self, backend: GpuBackend) -> None:
        for kind, fields in backend.drain_notes():
            self.emit(kind, **fields)

    async def _finish(self, backend: GpuBackend, csv: CsvWriter, log: BatchWriter | None) -> None:
        """End counters, flush, close: each bounded, shielded from the cancel that got us here."""
        end: list[dict[str, Any]] | None = None
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + END_TIMEOUT):
            try:
                end = await anyio.to_thread.run_sync(backend.end_stats, abandon_on_cancel=True)
            except Exception as e:
                self.emit("gpu-error", error=f"end counters: {type(e).__name__}: {e}")
        self._emit_notes(backend)
        devices = end if end is not None else [{"index": d.index, "uuid": d.uuid} for d in self.devices]
        for row in devices:
            row.update(self._peaks.get(row["uuid"], {}))
        self.emit("gpu-end", complete=end is not None, samples=self.samples, devices=devices)
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + FLUSH_TIMEOUT):
            for w in (csv, log):
                if w is not None:
                    try:
                        await anyio.to_thread.run_sync(w.flush, abandon_on_cancel=True)
                    except OSError as e:
                        self.emit("gpu-error", error=f"writing {w.path.name}: {e}")
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + END_TIMEOUT):
            try:
                await anyio.to_thread.run_sync(backend.close, abandon_on_cancel=True)
            except Exception:
                pass  # closing is a courtesy; the process is about to end
