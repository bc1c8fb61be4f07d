"""A fake of the ``pynvml`` module surface, for tests and the benchmark.

Devices are data (``FakeGpu``); any metric may be unsupported, a device may be lost
after some seconds, a call may be slow, XIDs may be scheduled. ``NvmlBackend(FakeNvml(...))``
then runs the real backend's logic (error sorting, energy deltas, process filtering)
with no GPU. Only the calls the backend makes are faked; names, argument order, return
shapes and error codes follow nvidia-ml-py 13.615.71.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Sequence

# Codes as in pynvml (NVML_ERROR_*).
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized", NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions", NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded", NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found", NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Like pynvml.NVMLError: carries ``.value``; ``str()`` is NVML's message."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")


def _err_class(name: str, code: int) -> Any:  # a subclass whose __init__ takes no code (type checkers cannot see it)
    def init(self: NVMLError, *_: Any) -> None:
        NVMLError.__init__(self, code)

    return type(name, (NVMLError,), {"__init__": init})


NVMLError_NotSupported = _err_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _err_class("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_FunctionNotFound = _err_class("NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND)
NVMLError_GpuIsLost = _err_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Timeout = _err_class("NVMLError_Timeout", NVML_ERROR_TIMEOUT)
NVMLError_LibraryNotFound = _err_class("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_Unknown = _err_class("NVMLError_Unknown", NVML_ERROR_UNKNOWN)

Value = float | Callable[[float], float]  # a constant, or a function of seconds since init


@dataclass
class FakeGpu:
    """One fake GPU. Metric names: util, memory, power, energy, temperature, clocks,
    clock_events, ecc, remapped_rows, processes, xid, mig, name, handle."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    util_gpu: Value = 90.0
    util_mem: Value = 40.0
    mem_total: int = 80 * 2**30
    mem_used: Value = 30 * 2**30
    power_w: Value = 300.0
    temp_c: Value = 65.0
    sm_mhz: Value = 1410.0
    mem_mhz: Value = 1593.0
    clock_events: int = 0
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    procs: dict[int, int] = field(default_factory=dict)  # pid -> bytes
    errors: dict[str, int] = field(default_factory=dict)  # metric -> NVML error code it raises
    unsupported: Sequence[str] = ()  # shorthand for errors[metric] = NOT_SUPPORTED
    lost_after: float | None = None  # seconds after init: every call raises GpuIsLost
    slow: dict[str, float] = field(default_factory=dict)  # metric -> seconds a call blocks
    xids: list[tuple[float, int]] = field(default_factory=list)  # (seconds after init, xid)
    mig: bool = False
    mig_uuids: tuple[str, ...] = ()
    energy_base_mj: int = 123_456_789  # the counter counts since driver load, not from 0


class _Handle:
    def __init__(self, index: int, gpu: FakeGpu) -> None:
        self.index = index
        self.gpu = gpu
        self.energy_mj = float(gpu.energy_base_mj)
        self.energy_t = 0.0  # seconds since init up to which energy_mj is integrated
        self.lock = threading.Lock()


class FakeNvml:
    """Stands in for the ``pynvml`` module. ``call_cost`` is spent on every call (sleep by
    default, or a busy loop with ``spin=True``) to model NVML's latency in the benchmark."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_Unknown = NVMLError_Unknown

    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_UNKNOWN = NVML_ERROR_UNKNOWN

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_DEVICE_MIG_ENABLE = 1
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, gpus: Sequence[FakeGpu], *, driver: str = "550.54.15", init_error: int | None = None,
                 call_cost: float = 0.0, spin: bool = False) -> None:
        self.gpus = list(gpus)
        self.driver = driver
        self.init_error = init_error
        self.call_cost = call_cost
        self.spin = spin
        self.calls = 0
        self.calls_by: Counter[tuple[str, int]] = Counter()  # (metric, device index) -> calls
        self.slow_entered = 0  # slow calls started, so tests can cancel during one
        self.initialised = False
        self.shutdowns = 0
        self._t0 = time.monotonic()
        self._handles = [_Handle(i, g) for i, g in enumerate(self.gpus)]
        self._xid_sent: set[tuple[int, int]] = set()
        self._lock = threading.Lock()

    # -- helpers ------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def _value(self, v: Value) -> float:
        return v(self.elapsed()) if callable(v) else v

    def _cost(self) -> None:
        with self._lock:
            self.calls += 1
        if self.call_cost <= 0:
            return
        if self.spin:
            end = time.perf_counter() + self.call_cost
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(self.call_cost)

    def _enter(self, h: _Handle, metric: str) -> FakeGpu:
        self._cost()
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        g = h.gpu
        with self._lock:
            self.calls_by[(metric, h.index)] += 1
        if g.lost_after is not None and self.elapsed() >= g.lost_after:
            raise NVMLError_GpuIsLost()
        if metric in g.slow:
            with self._lock:
                self.slow_entered += 1
            time.sleep(g.slow[metric])
        code = g.errors.get(metric, NVML_ERROR_NOT_SUPPORTED if metric in g.unsupported else None)
        if code is not None:
            raise NVMLError(code)
        return g

    # -- library ------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._cost()
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._cost()
        return len(self._handles)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._cost()
        if not 0 <= index < len(self._handles):
            raise NVMLError(2)
        code = self._handles[index].gpu.errors.get("handle")
        if code is not None:  # e.g. NoPermission: another job's GPU behind device cgroups
            raise NVMLError(code)
        return self._handles[index]

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        self._cost()
        return h.gpu.uuid

    def nvmlDeviceGetName(self, h: _Handle) -> str:
        return self._enter(h, "name").name

    def nvmlDeviceGetIndex(self, h: _Handle) -> int:
        return h.index

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        g = self._enter(h, "mig")
        return [int(g.mig), int(g.mig)]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Handle) -> int:
        return len(self._enter(h, "mig").mig_uuids)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Handle, k: int) -> Any:
        return SimpleNamespace(gpu=SimpleNamespace(uuid=self._enter(h, "mig").mig_uuids[k]))

    # -- per tick -----------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> Any:
        g = self._enter(h, "util")
        return SimpleNamespace(gpu=int(self._value(g.util_gpu)), memory=int(self._value(g.util_mem)))

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version: Any = None) -> Any:
        g = self._enter(h, "memory")
        used = int(self._value(g.mem_used))
        return SimpleNamespace(total=g.mem_total, used=used, free=g.mem_total - used)

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        g = self._enter(h, "power")
        return int(round(self._value(g.power_w) * 1000))

    def nvmlDeviceGetTotalEnergyConsumption(self, h: _Handle) -> int:
        g = self._enter(h, "energy")
        now = self.elapsed()
        with h.lock:  # integrate power exactly enough (trapezoid on 10 ms steps)
            if not callable(g.power_w):
                h.energy_mj += g.power_w * (now - h.energy_t) * 1000
                h.energy_t = now
                return int(h.energy_mj)
            t = h.energy_t
            while t < now:
                step = min(0.01, now - t)
                p0 = self._at(g.power_w, t)
                p1 = self._at(g.power_w, t + step)
                h.energy_mj += (p0 + p1) / 2 * step * 1000
                t += step
            h.energy_t = now
            return int(h.energy_mj)

    @staticmethod
    def _at(v: Value, t: float) -> float:
        return v(t) if callable(v) else v

    def nvmlDeviceGetTemperatureV(self, h: _Handle, sensor: int, version: Any = None) -> int:
        return int(self._value(self._enter(h, "temperature").temp_c))

    nvmlDeviceGetTemperature = nvmlDeviceGetTemperatureV

    def nvmlDeviceGetClockInfo(self, h: _Handle, kind: int) -> int:
        g = self._enter(h, "clocks")
        return int(self._value(g.sm_mhz if kind == self.NVML_CLOCK_SM else g.mem_mhz))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        return self._enter(h, "clock_events").clock_events

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetComputeRunningProcesses(self, h: _Handle) -> list[Any]:
        g = self._enter(h, "processes")
        return [SimpleNamespace(pid=pid, usedGpuMemory=b, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for pid, b in g.procs.items()]

    nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses

    # -- start and end ------------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, error_type: int, counter_type: int) -> int:
        g = self._enter(h, "ecc")
        return g.ecc_corrected if error_type == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else g.ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, h: _Handle) -> tuple[int, int, int, int]:
        return tuple(self._enter(h, "remapped_rows").remapped_rows)  # type: ignore[return-value]

    # -- events -------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._cost()
        return SimpleNamespace(handles=[])

    def nvmlDeviceGetSupportedEventTypes(self, h: _Handle) -> int:
        self._enter(h, "xid")
        return self.nvmlEventTypeXidCriticalError | 0x1

    def nvmlDeviceRegisterEvents(self, h: _Handle, types: int, event_set: Any) -> None:
        self._enter(h, "xid")
        event_set.handles.append(h)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        # Blocks like the driver does (no polling), until the next scheduled XID or the timeout.
        end = time.monotonic() + timeout_ms / 1000
        while True:
            now = self.elapsed()
            upcoming = []
            for h in event_set.handles:
                for when, xid in h.gpu.xids:
                    if (h.index, xid) in self._xid_sent:
                        continue
                    if now >= when:
                        self._xid_sent.add((h.index, xid))
                        return SimpleNamespace(device=h, eventType=self.nvmlEventTypeXidCriticalError,
                                               eventData=xid, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                    upcoming.append(when - now)
            left = end - time.monotonic()
            if left <= 0:
                raise NVMLError_Timeout()
            time.sleep(min([left, *upcoming]))

    nvmlEventSetWait = nvmlEventSetWait_v2

    def nvmlEventSetFree(self, event_set: Any) -> None:
        event_set.handles.clear()


def fake_uuid(i: int) -> str:
    """A well-formed, stable GPU UUID for fake device ``i``."""
    return f"GPU-{i:08x}-1111-2222-3333-{i:012x}"


def eight_gpus(per_device: Mapping[int, Mapping[str, Any]] | None = None) -> list[FakeGpu]:
    """Eight A100s; ``{3: {"unsupported": ["power"]}}`` changes single devices."""
    per = per_device or {}
    return [FakeGpu(uuid=fake_uuid(i), **dict(per.get(i, {}))) for i in range(8)]
