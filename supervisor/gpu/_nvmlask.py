"""One NVML question, and what its error means (the NVML backend's: ``_nvml.py``).

Errors are sorted once: NotSupported / NoPermission / FunctionNotFound mean "this GPU will
never answer this", so the (device, metric) pair is noted once and never asked again;
GpuIsLost raises ``Lost`` (the backend retires the device with one event); anything else is
noted once per kind and asked again next tick. Notes wait in a list the sampler drains
into the journal: they are made on the sampler's thread and the XID waiter's.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from supervisor.gpu._types import DeviceInfo, EnergyMeter

_NEVER_CODES = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_FUNCTION_NOT_FOUND")


class Lost(Exception):
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)."""


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass
class Dev:
    info: DeviceInfo
    handle: Any
    skip: set[str] = field(default_factory=set)  # metrics that will never answer
    errors_seen: set[tuple[str, str]] = field(default_factory=set)
    lost: bool = False
    lost_at_open: str | None = None
    energy: EnergyMeter = field(default_factory=EnergyMeter)
    start: dict[str, Any] = field(default_factory=dict)
    samples: int = 0


class Asker:
    """Asks one NVML module (``pynvml``, or a fake with its surface) and sorts its errors."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._never = {getattr(nvml, name) for name in _NEVER_CODES if hasattr(nvml, name)}
        self._fallbacks: set[str] = set()
        self._notes: list[tuple[str, dict[str, Any]]] = []
        self._notes_lock = threading.Lock()

    def note(self, kind: str, **fields: Any) -> None:
        with self._notes_lock:
            self._notes.append((kind, fields))

    def drain_notes(self) -> list[tuple[str, dict[str, Any]]]:
        with self._notes_lock:
            out, self._notes = self._notes, []
        return out

    def lose(self, dev: Dev, error: str) -> None:
        if not dev.lost:
            dev.lost = True
            self.note("gpu-lost", device=dev.info.index, uuid=dev.info.uuid, error=error)

    def q(self, dev: Dev, metric: str, fn: Callable[..., Any], *args: Any) -> Any:
        """One query; None when the GPU cannot answer. Raises ``Lost`` for a lost GPU."""
        if metric in dev.skip or dev.lost:
            return None
        nv = self.nvml
        try:
            return fn(dev.handle, *args)
        except nv.NVMLError as e:
            code = getattr(e, "value", None)
            if code in self._never:
                dev.skip.add(metric)
                self.note("gpu-unsupported", device=dev.info.index, uuid=dev.info.uuid, metric=metric, error=str(e))
                return None
            if code == nv.NVML_ERROR_GPU_IS_LOST:
                raise Lost(str(e)) from None
            if code == getattr(nv, "NVML_ERROR_NOT_FOUND", None):
                return None  # e.g. no value yet; not worth an event
            if (metric, str(e)) not in dev.errors_seen:
                dev.errors_seen.add((metric, str(e)))
                self.note("gpu-error", device=dev.info.index, uuid=dev.info.uuid, metric=metric, error=str(e))
            return None
        except Exception as e:
            # pynvml's versioned wrappers raise NVMLLibraryMismatchError for a missing symbol;
            # an older nvidia-ml-py may lack the Python function altogether.
            if type(e).__name__ == "NVMLLibraryMismatchError" or isinstance(e, AttributeError):
                dev.skip.add(metric)
                self.note("gpu-unsupported", device=dev.info.index, uuid=dev.info.uuid, metric=metric, error=str(e))
                return None
            raise

    def either(self, new: str, old: str, *fixed: Any) -> Callable[..., Any]:
        """``new`` where the driver has it, else the older call: drivers lag the bindings.

        Once one device's driver lacks ``new``, every device uses ``old`` (one driver per node).
        """
        nv = self.nvml

        def call(handle: Any) -> Any:
            if old not in self._fallbacks:
                try:
                    return getattr(nv, new)(handle, *fixed)
                except nv.NVMLError as e:
                    if e.value != nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                        raise
                except AttributeError:
                    pass
                except Exception as e:
                    if type(e).__name__ != "NVMLLibraryMismatchError":
                        raise
                self._fallbacks.add(old)
            return getattr(nv, old)(handle, *fixed)

        return call
