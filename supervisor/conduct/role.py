"""What the one conductor (``agent.Agent``) asks of its role, and what a role asks of it.

One class conducts on every node, as torch elastic's ``SimpleElasticAgent`` runs one agent on
each: the same named states (``policy.State``, each transition a ``state`` event), one stop
(the first request wins and sets ``Conductor.stop_wanted``), one sampler start-up, one end
event. What differs between node 0 and node K is a role's collaborators, never a branch in
the conductor: the leader (``leader.LeaderRole``) spawns the training, routes signals through
``routing``, decides a stop with ``policy`` and acts it out with ``stopping.StopSequence``; node
K (``node.NodeRole``) holds its end of the leader's line (``link.NodeLine``), follows the
training's processes here, and stops when the leader's ``end`` says so.
"""

from __future__ import annotations

import signal
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol

if TYPE_CHECKING:
    import anyio
    from anyio.abc import TaskGroup

    from supervisor.journal import Emit, Journal
    from supervisor.policy import State
    from supervisor.ports import SamplerPort


class Conductor(Protocol):
    """The conductor as its role sees it: the named state, the one stop, the guard of every part."""

    stop_wanted: anyio.Event
    started: float  # time.monotonic() when it was made

    def set_state(self, new: State, **fields: Any) -> None: ...

    def guarded(self, name: str, run: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[None]]: ...


class Role(Protocol):
    """A conductor's position: its journal, its parts before and after the samplers, its stop
    and its end. ``conductor`` is set by the ``Agent`` it is handed to."""

    conductor: Conductor
    journal: Journal

    def held(self) -> AbstractContextManager[bool]:
        """While the role may conduct (its journal open); False: another conducts here."""

    def journal_start(self) -> None: ...

    def listening(self) -> AbstractContextManager[object]:
        """What outlives the task group while it winds down (the leader's signal receiver)."""

    async def start(self, tg: TaskGroup) -> None:
        """The parts started before the samplers."""

    def gpu_emit(self) -> Emit:
        """What the GPU sampler's events go through (the leader's: its GPU faults, ``health.Faults``)."""

    def sampled(self, gpu: SamplerPort) -> None:
        """The GPU sampler, about to start."""

    def tree_pids(self) -> set[int]:
        """The processes the samplers follow (a node agent's: none; it samples the node)."""

    async def begin(self, tg: TaskGroup) -> None:
        """The parts started after the samplers (the leader's: the training)."""

    async def deliver(self, sig: signal.Signals, received: float | None = None) -> None: ...

    def why(self) -> dict[str, Any]:
        """The stop asked: ``reason`` and ``detail``."""

    async def stop(self) -> None: ...

    async def failed(self, cause: BaseException) -> None:
        """The conductor failed (journaled already): make the node safe, and say so at the end."""

    def outcome(self) -> tuple[dict[str, Any], int]:
        """The ``end`` event's fields (but ``seconds``) and the exit status."""
