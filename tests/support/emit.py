"""An ``Emit`` (supervisor's journal callable) that keeps the events in memory, for the tests of
one part on its own (the sampler, the mirror) where no journal file is wanted."""

from __future__ import annotations

from typing import Any


class Events(list):
    """Every event emitted, in order, as the journal would have written it."""

    def __call__(self, kind: str, /, *, durable: bool = False, **fields: Any) -> dict[str, Any]:
        event = {"kind": kind, **fields}
        self.append(event)
        return event

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self if e["kind"] == kind]
