"""Suspect nodes: the GPU faults seen during an attempt (docs/slurm.md, "Suspect nodes").

The GPU sampler journals ``gpu-xid`` and ``gpu-lost``; ``Faults.through`` sits between it and
the journal and keeps those that make the node suspect (``policy.gpu_fault``). The stop
sequence reads them: the requeue excludes this node, and a crash after a fault is not
restarted in place on the same GPUs (the health gate) but requeued elsewhere. The node's
name the requeue excludes is the scheduler's (``Scheduler.node_name``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio

from supervisor import policy
from supervisor.journal import Emit

if TYPE_CHECKING:
    from supervisor.ports import SamplerPort


class Faults:
    """The suspect faults of this attempt, in order: ``{"t", "kind", "why"}``."""

    def __init__(self, emit: Emit) -> None:
        self.seen: list[dict[str, Any]] = []
        self._emit = emit

    def through(self, emit: Emit) -> Emit:
        """An emit that journals as ``emit`` does and keeps the suspect faults."""
        def kept(kind: str, /, **fields: Any) -> Any:
            why = policy.gpu_fault(kind, fields)
            if why is not None:
                self.seen.append({"t": time.time(), "kind": kind, "why": why})
            return emit(kind, **fields)
        return kept  # type: ignore[return-value]

    @property
    def reasons(self) -> list[str]:
        return [f["why"] for f in self.seen]

    async def gate(self, gpu: SamplerPort | None, since: float, wait: float) -> bool:
        """The health gate before an in-place restart: no GPU fault seen, and the GPUs' memory
        back to what it was before the training (a sample after ``since``, waited for up to
        ``wait`` s). Without GPU sampling only the faults count. A failed gate makes the node
        suspect: the run stops and is requeued elsewhere (docs/slurm.md, "Suspect nodes")."""
        if self.reasons:
            return False
        held = None
        if gpu is not None:
            with anyio.move_on_after(wait):
                while (held := gpu.memory_held(since)) is None:
                    await anyio.sleep(0.2)
        if policy.gpu_memory_freed(held):
            return True
        why = f"{held / 2**20:.0f} MiB of GPU memory still in use after the crash"  # type: ignore[operator]
        self.seen.append({"t": time.time(), "kind": "health-gate", "why": why})
        self._emit("health-gate", ok=False, why=why, held_mib=round(held / 2**20, 1))  # type: ignore[operator]
        return False
