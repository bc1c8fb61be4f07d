"""Which GPUs belong to this job: CUDA_VISIBLE_DEVICES, then Slurm's lists, else all.

A node may hold GPUs of other jobs; sampling them would mix their load into ours. CUDA
accepts indices, full or unique-prefix ``GPU-`` UUIDs and ``MIG-`` UUIDs, and stops at the
first entry it cannot parse; we do the same. Indices are taken as NVML indices: Slurm
sets CUDA_VISIBLE_DEVICES to physical indices without device cgroups, and with them NVML
itself only sees the job's GPUs, renumbered from 0 like CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from supervisor.gpu._types import DeviceInfo
from supervisor.sched import visible_gpus


def _parse_list(text: str) -> list[str]:
    """``0,1``, ``0-3``, ``GPU-ab12,GPU-cd34`` → entries, ranges expanded."""
    out: list[str] = []
    for raw in text.split(","):
        item = raw.strip()
        m = re.fullmatch(r"(\d+)-(\d+)", item)
        if m:
            out.extend(str(i) for i in range(int(m.group(1)), int(m.group(2)) + 1))
        elif item:
            out.append(item)
    return out


def _match(entry: str, devices: Sequence[DeviceInfo]) -> DeviceInfo | None:
    if entry.isdigit():
        return next((d for d in devices if d.index == int(entry)), None)
    low = entry.lower()
    if low.startswith("mig-"):
        # MIG-<uuid> or the old MIG-GPU-<uuid>/gi/ci form: the parent GPU is what we sample.
        for d in devices:
            if any(m.lower() == low for m in d.mig_uuids) or low.startswith("mig-" + d.uuid.lower() + "/"):
                return d
        return None
    if low.startswith("gpu-"):
        hits = [d for d in devices if d.uuid.lower().startswith(low)]
        return hits[0] if len(hits) == 1 else None
    return None


def select(env: Mapping[str, str], devices: Sequence[DeviceInfo]) -> tuple[list[DeviceInfo], str]:
    """The job's devices and the variable that chose them ("all" when unconstrained): the
    list ``sched.visible_gpus`` finds (CUDA's, else the scheduler's), matched to the devices."""
    visible = visible_gpus(env)
    if visible is None:
        return list(devices), "all"
    var, listed = visible
    chosen: list[DeviceInfo] = []
    for entry in _parse_list(listed):
        d = _match(entry, devices)
        if d is None:
            break  # CUDA ignores the rest after an invalid entry
        if d not in chosen:
            chosen.append(d)
    return chosen, var
