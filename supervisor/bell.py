"""A wake-up that is kept until it is heard.

The leader and its node agents tell each other when to look at shared storage (the leader's
line, conduct/link.py): a part staged, a go file written, a journal line for the nodes. The
side that hears such a word may be busy looking when it comes; an ``anyio.Event`` alone
would lose it, or must be replaced by whoever waits. A ``Bell`` rung while nobody waits
stays rung, and the next ``wait`` returns at once and silences it: one look for any number of
rings, never none.
"""

from __future__ import annotations

import anyio


class Bell:
    """``ring()`` from anywhere in the event loop's thread; ``await wait(timeout)`` returns
    True once rung (now or since the last wait), False after ``timeout`` seconds."""

    def __init__(self) -> None:
        self._event: anyio.Event | None = None  # made in the loop: a plan builds its parts before one runs
        self._rung = False

    def ring(self) -> None:
        self._rung = True
        if self._event is not None:
            self._event.set()

    async def wait(self, timeout: float) -> bool:
        if not self._rung:
            self._event = anyio.Event()
            with anyio.move_on_after(max(0.0, timeout)):
                await self._event.wait()
            self._event = None
        rung, self._rung = self._rung, False
        return rung


LINKED_LOOK_S = 30.0  # while a line carries the words (conduct/link.py): a look at shared storage anyway, this often
