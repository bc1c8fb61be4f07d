"""Journal events that are notifications too: a part journals them, the person is told.

Parts never reach the notifier (docs/design.md: the agent wires them through ports); the agent
hands a part ``relaying(emit, notifier)`` instead of the journal's ``emit``, and the kinds in
``RELAYED`` reach the webhooks as well, their fields as the notification's facts
(docs/notify.md). A stalled persistent side (``sync-stalled``, ``sync/_stall.py``) is one: the
checkpoints written meanwhile are on local disk only, and a person may want to act before the job ends.
"""

from __future__ import annotations

from typing import Any

from supervisor.journal import Emit
from supervisor.ports import NotifierPort

RELAYED = frozenset({"sync-stalled", "sync-resumed"})  # each a notify.EVENTS name too


def relaying(emit: Emit, notifier: NotifierPort | None) -> Emit:
    """``emit``, and for a ``RELAYED`` kind a notification with the same fields."""
    if notifier is None:
        return emit

    def relay(kind: str, /, *, durable: bool = False, **fields: Any) -> dict[str, Any]:
        event = emit(kind, durable=durable, **fields)
        if kind in RELAYED:
            notifier.post(kind, **fields)
        return event

    return relay
