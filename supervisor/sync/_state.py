"""What the jobs of one pair's engine share (``_pair.py`` composes them).

The engine is split by job: when passes run (``_schedule.py``), checkpoint publishing
(``_publish.py``), log passes (``_logs.py``) and restore (``_restore.py``). Each job gets this
state, and the few callables it needs of the others, explicitly when it is built; none reads
another's private attributes. Only what more than one job reads or writes lives here.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import anyio

from supervisor.config import SyncPair
from supervisor.journal import Emit
from supervisor.sync._backend import Backend
from supervisor.sync._profiles import PROFILES, Profile
from supervisor.sync._stall import Progress


def to_thread(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    return anyio.to_thread.run_sync(partial(fn, *args, **kw))


class PairState:
    """One pair's facts shared among its jobs: the pair, how to copy and journal, the profile
    its checkpoints follow, what is published, what is still owed, the last local change, and
    whether its persistent side moves."""

    def __init__(self, pair: SyncPair, backend: Backend, emit: Emit) -> None:
        self.pair = pair
        self.backend = backend
        self.emit = emit
        # Set by the pair, else detected from what the listings show (the engine adopts it).
        self.profile: Profile | None = PROFILES.get(pair.profile)
        self.published: dict[str, Any] = {}    # checkpoint name → Snap of what was published
        self.sigs: dict[str, Any] = {}         # its top-level stat then, to skip re-walking it
        self.pending: list[str] = [f"{pair.name}: not synced yet"]  # what is not yet durable, a line each
        self.last_activity: float | None = None  # time.monotonic() of the last local change seen
        self.owner = ""                           # this run on a store (its run directory): whose a name's keys are
        self.progress = Progress()                # what is in flight on the persistent side, and whether it moves (_stall.py)

