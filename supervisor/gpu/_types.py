"""What every GPU backend hands the sampler, and the small interface it implements.

Backends are synchronous on purpose: NVML is a blocking C library and ``nvidia-smi`` a
subprocess, so the sampler calls every method in a worker thread (docs/design.md, invariant 6) and the
backends stay plain, testable code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol


class GpuUnavailable(Exception):
    """No way to sample GPUs here; the message says why, for the ``gpu-none`` event."""


@dataclass(frozen=True)
class DeviceInfo:
    """One GPU this job owns, as journaled in ``gpu-start``."""

    index: int  # the backend's index (NVML / nvidia-smi enumeration order)
    uuid: str
    name: str = ""
    mig: bool = False  # MIG mode on: utilisation is not reported by the driver
    mig_uuids: tuple[str, ...] = ()
    memory_total: int | None = None  # bytes

    def public(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "uuid": self.uuid, "name": self.name, "mig": self.mig}
        if self.mig_uuids:
            out["mig_uuids"] = list(self.mig_uuids)
        if self.memory_total is not None:
            out["memory_total_mib"] = round(self.memory_total / 2**20)
        return out


@dataclass
class GpuSample:
    """One GPU at one instant. ``None`` means not supported or not available."""

    t: float  # unix seconds
    index: int
    uuid: str
    util_gpu: float | None = None  # % of time a kernel ran
    util_mem: float | None = None  # % of time memory was read or written
    mem_used: int | None = None  # bytes
    mem_total: int | None = None  # bytes
    power_w: float | None = None
    energy_j: float | None = None  # since the sampler opened the device
    temp_c: float | None = None
    sm_mhz: float | None = None
    mem_mhz: float | None = None
    clock_events: int | None = None  # NVML clocks-event (throttle) reason bitmask
    proc_mem: int | None = None  # bytes held by the training tree's processes


@dataclass
class Opened:
    """What ``open`` found: the devices to sample and how they were chosen."""

    devices: list[DeviceInfo]
    source: str  # which variable chose them, or "all"
    driver: str = ""
    xid: bool = False  # XID events can be waited for
    extra: dict[str, Any] = field(default_factory=dict)


class GpuBackend(Protocol):
    """A source of GPU samples. Every method may block; none may raise for one bad GPU."""

    name: str

    def open(self, env: Mapping[str, str]) -> Opened:
        """Load the library, pick the job's GPUs, snapshot start counters. Raises GpuUnavailable."""
        ...

    def sample(self, tree: set[int]) -> list[GpuSample]:
        """One sample of every live device; ``tree`` are the training's pids."""
        ...

    def wait_xid(self, timeout_s: float) -> list[tuple[DeviceInfo, int]]:
        """Block up to ``timeout_s`` for XID critical errors; ``[]`` when none came."""
        ...

    def end_stats(self) -> list[dict[str, Any]]:
        """Per device: ECC and remapped-row changes since open, energy used."""
        ...

    def drain_notes(self) -> list[tuple[str, dict[str, Any]]]:
        """Events noticed since the last call (``gpu-unsupported``, ``gpu-lost``, ...)."""
        ...

    def close(self) -> None: ...


class EnergyMeter:
    """Energy since start for one GPU: from the driver's counter, else the power integral.

    The counter (mJ since driver load) gives the exact energy however coarse the
    sampling; integrating point samples of power is the fallback for old GPUs and dmon.
    """

    def __init__(self) -> None:
        self.base_mj: float | None = None
        self.last_mj: float | None = None
        self.integral_j = 0.0
        self._last: tuple[float, float] | None = None  # (t, power W)

    def update(self, t: float, counter_mj: float | None, power_w: float | None) -> float | None:
        if power_w is not None:
            if self._last is not None and t > self._last[0]:
                self.integral_j += (t - self._last[0]) * (power_w + self._last[1]) / 2
            self._last = (t, power_w)
        if counter_mj is not None:
            if self.base_mj is None or self.last_mj is None:
                self.base_mj = counter_mj
            elif counter_mj < self.last_mj:
                # The counter restarted (driver reload): rebase and keep what was counted.
                self.base_mj = counter_mj - (self.last_mj - self.base_mj)
            self.last_mj = counter_mj
        return self.total()[0]

    def total(self) -> tuple[float | None, str | None]:
        """(joules, "counter" | "power-integral"), or (None, None) with nothing to go on."""
        if self.base_mj is not None and self.last_mj is not None:
            return (self.last_mj - self.base_mj) / 1000, "counter"
        if self._last is not None:
            return self.integral_j, "power-integral"
        return None, None
