"""The NVML backend, on NVIDIA's ``pynvml`` module (package nvidia-ml-py).

Init once, cache handles, ask each GPU for a handful of cheap scalars per tick. Each
question and what its error means is ``_nvmlask.Asker``'s (a GPU that never answers a
metric is not asked again; a lost GPU is retired with one event). The module is injected so tests can hand in a fake with the same
surface (``supervisor.gpu.fake.FakeNvml``); by default ``pynvml`` is imported lazily.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Mapping

from supervisor.gpu._nvmlask import Asker, Dev, Lost, text
from supervisor.gpu._select import select
from supervisor.gpu._types import DeviceInfo, GpuSample, GpuUnavailable, Opened

class NvmlBackend:
    """Samples the job's GPUs through NVML. Thread-safe enough for one sampler thread
    plus the XID waiter: per-device state is only appended to."""

    name = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml
        self._devs: list[Dev] = []
        self._ask = Asker(nvml)  # asked again with the module ``open`` imports
        self._event_set: Any = None
        self._inflight = 0
        self._inflight_lock = threading.Lock()

    def drain_notes(self) -> list[tuple[str, dict[str, Any]]]:
        return self._ask.drain_notes()

    # -- open ---------------------------------------------------------------------------

    def open(self, env: Mapping[str, str]) -> Opened:
        if self._nvml is None:
            try:
                import pynvml  # lazily: the agent must stay light to import
            except ImportError as e:
                raise GpuUnavailable(f"nvidia-ml-py is not installed ({e})") from None
            self._nvml = pynvml
        nv = self._nvml
        self._ask = Asker(nv)
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise GpuUnavailable(f"NVML: {e}") from None
        except OSError as e:
            raise GpuUnavailable(f"NVML: {e}") from None
        try:
            return self._open_devices(env)
        except GpuUnavailable:
            self._shutdown()
            raise
        except nv.NVMLError as e:
            self._shutdown()
            raise GpuUnavailable(f"NVML: {e}") from None

    def _open_devices(self, env: Mapping[str, str]) -> Opened:
        nv = self._nvml
        try:
            driver = text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError:
            driver = ""
        count = nv.nvmlDeviceGetCount()
        found: list[Dev] = []
        refused: list[str] = []
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = text(nv.nvmlDeviceGetUUID(h))
            except nv.NVMLError as e:
                # A GPU we may not open is another job's (device cgroups) or broken: not ours.
                refused.append(f"GPU {i}: {e}")
                continue
            dev = Dev(DeviceInfo(index=i, uuid=uuid), h)
            try:
                name = self._ask.q(dev, "name", nv.nvmlDeviceGetName)
                mem = self._ask.q(dev, "memory", nv.nvmlDeviceGetMemoryInfo)
                mig_mode = self._ask.q(dev, "mig", nv.nvmlDeviceGetMigMode)
                mig = bool(mig_mode) and mig_mode[0] == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)
                dev.info = DeviceInfo(index=i, uuid=uuid, name=text(name or ""), mig=mig,
                                      mig_uuids=self._mig_uuids(dev) if mig else (),
                                      memory_total=getattr(mem, "total", None))
            except Lost as e:
                dev.lost_at_open = str(e)  # journaled below, if the GPU turns out to be ours
            found.append(dev)
        if not found:
            raise GpuUnavailable("NVML found no GPU on this node" if count == 0
                                 else "NVML could open none of the GPUs (" + "; ".join(refused[:4]) + ")")
        chosen, source = select(env, [d.info for d in found])
        if not chosen:
            raise GpuUnavailable(f"{source}={env.get(source, '')!r} names none of this node's GPUs")
        by_info = {d.info.uuid: d for d in found}
        self._devs = [by_info[c.uuid] for c in chosen]  # in CUDA's order: CUDA device k is the k-th
        for dev in self._devs:
            if dev.lost_at_open is not None:
                self._ask.lose(dev, dev.lost_at_open)
                continue
            dev.start = self._counters(dev)
            try:
                self._energy(dev, time.time())
            except Lost as e:
                self._ask.lose(dev, str(e))
        xid = self._open_xid()
        return Opened(devices=[d.info for d in self._devs], source=source, driver=driver, xid=xid)

    def _mig_uuids(self, dev: Dev) -> tuple[str, ...]:
        nv = self._nvml
        n = self._ask.q(dev, "mig", nv.nvmlDeviceGetMaxMigDeviceCount) or 0
        out = []
        for k in range(n):
            try:
                out.append(text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, k))))
            except nv.NVMLError:
                continue  # empty slot
        return tuple(out)

    def _open_xid(self) -> bool:
        nv = self._nvml
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            self._ask.note("gpu-unsupported", metric="xid", error=str(e))
            return False
        registered = 0
        for dev in self._devs:
            try:
                supported = self._ask.q(dev, "xid", nv.nvmlDeviceGetSupportedEventTypes)
                if supported is not None and supported & nv.nvmlEventTypeXidCriticalError:
                    self._ask.q(dev, "xid", nv.nvmlDeviceRegisterEvents, nv.nvmlEventTypeXidCriticalError, self._event_set)
                    registered += "xid" not in dev.skip
            except Lost as e:
                self._ask.lose(dev, str(e))
        if not registered:
            self._free_event_set()
        return bool(registered)

    # -- per tick -----------------------------------------------------------------------

    def sample(self, tree: set[int]) -> list[GpuSample]:
        with self._inflight_lock:
            self._inflight += 1
        try:
            out = []
            for dev in self._devs:
                if dev.lost:
                    continue
                try:
                    out.append(self._sample_one(dev, tree))
                except Lost as e:
                    self._ask.lose(dev, str(e))
            return out
        finally:
            with self._inflight_lock:
                self._inflight -= 1

    def _sample_one(self, dev: Dev, tree: set[int]) -> GpuSample:
        nv = self._nvml
        q = self._ask.q
        util = q(dev, "util", nv.nvmlDeviceGetUtilizationRates)
        mem = q(dev, "memory", nv.nvmlDeviceGetMemoryInfo)
        power_mw = q(dev, "power", nv.nvmlDeviceGetPowerUsage)
        temp = q(dev, "temperature", self._ask.either("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU))
        sm = q(dev, "clocks", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
        memclk = q(dev, "clocks", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM)
        events = q(dev, "clock_events", self._ask.either("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"))
        procs = q(dev, "processes", self._ask.either("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"))
        t = time.time()
        power_w = power_mw / 1000 if power_mw is not None else None
        energy = self._energy(dev, t, power_w)
        dev.samples += 1
        return GpuSample(
            t=t, index=dev.info.index, uuid=dev.info.uuid,
            util_gpu=getattr(util, "gpu", None), util_mem=getattr(util, "memory", None),
            mem_used=getattr(mem, "used", None), mem_total=getattr(mem, "total", None),
            power_w=power_w, energy_j=energy, temp_c=temp, sm_mhz=sm, mem_mhz=memclk,
            clock_events=events, proc_mem=self._tree_memory(procs, tree),
        )

    def _energy(self, dev: Dev, t: float, power_w: float | None = None) -> float | None:
        counter = self._ask.q(dev, "energy", self._nvml.nvmlDeviceGetTotalEnergyConsumption)
        return dev.energy.update(t, counter, power_w)

    @staticmethod
    def _tree_memory(procs: Any, tree: set[int]) -> int | None:
        """GPU memory of the training's processes only; other jobs' are not ours."""
        if procs is None:
            return None
        return sum((p.usedGpuMemory or 0) for p in procs if p.pid in tree)

    # -- XID ----------------------------------------------------------------------------

    def wait_xid(self, timeout_s: float) -> list[tuple[DeviceInfo, int]]:
        nv = self._nvml
        if self._event_set is None:
            time.sleep(timeout_s)
            return []
        with self._inflight_lock:
            self._inflight += 1
        try:
            data = nv.nvmlEventSetWait_v2(self._event_set, int(timeout_s * 1000))
        except nv.NVMLError as e:
            if e.value != nv.NVML_ERROR_TIMEOUT:
                time.sleep(timeout_s)  # e.g. GPU lost: the sampler's next call journals which one
            return []
        finally:
            with self._inflight_lock:
                self._inflight -= 1
        if not data.eventType & nv.nvmlEventTypeXidCriticalError:
            return []
        try:
            uuid = text(nv.nvmlDeviceGetUUID(data.device))
        except nv.NVMLError:
            uuid = ""
        dev = next((d for d in self._devs if d.info.uuid == uuid), None)
        info = dev.info if dev else DeviceInfo(index=-1, uuid=uuid)
        return [(info, int(data.eventData))]

    # -- start and end counters ---------------------------------------------------------

    def _counters(self, dev: Dev) -> dict[str, Any]:
        nv = self._nvml
        out: dict[str, Any] = {}
        try:
            for key, etype in (("ecc_corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                               ("ecc_uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
                out[key] = self._ask.q(dev, "ecc", nv.nvmlDeviceGetTotalEccErrors, etype, nv.NVML_VOLATILE_ECC)
            rows = self._ask.q(dev, "remapped_rows", nv.nvmlDeviceGetRemappedRows)
        except Lost as e:
            self._ask.lose(dev, str(e))
            return out
        if rows is not None:
            out["remapped_rows"] = dict(zip(("correctable", "uncorrectable", "pending", "failure"), rows))
        return out

    def end_stats(self) -> list[dict[str, Any]]:
        out = []
        for dev in self._devs:
            end = self._counters(dev) if not dev.lost else {}
            energy, source = dev.energy.total()
            row: dict[str, Any] = {"index": dev.info.index, "uuid": dev.info.uuid, "samples": dev.samples,
                                   "lost": dev.lost, "energy_j": None if energy is None else round(energy, 1),
                                   "energy_source": source}
            for key in ("ecc_corrected", "ecc_uncorrected"):
                a, b = dev.start.get(key), end.get(key)
                row[key] = b
                row[key + "_delta"] = b - a if a is not None and b is not None else None
            row["remapped_rows"] = end.get("remapped_rows")
            out.append(row)
        return out

    # -- close --------------------------------------------------------------------------

    def _free_event_set(self) -> None:
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except self._nvml.NVMLError:
                pass
            self._event_set = None

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass

    def close(self) -> None:
        with self._inflight_lock:
            busy = self._inflight
        if busy:
            return  # a call abandoned on cancel is still inside NVML; the process exit cleans up
        self._free_event_set()
        self._shutdown()
