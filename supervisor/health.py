"""Suspect nodes: the GPU faults seen during an attempt (docs/slurm.md, "Suspect nodes").

The GPU sampler journals ``gpu-xid`` and ``gpu-lost``; ``Faults.through`` sits between it and
the journal and keeps those that make the node suspect (``policy.gpu_fault``). The stop
sequence reads them: the requeue excludes this node, and a crash after a fault is not
restarted in place on the same GPUs (the health gate) but requeued elsewhere.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

from supervisor import policy
from supervisor.journal import Emit


class Faults:
    """The suspect faults of this attempt, in order: ``{"t", "kind", "why"}``."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

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


def this_node(env: Mapping[str, str]) -> str:
    """The scheduler's name for the node supervise runs on."""
    return env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
