"""What the process does with a signal nobody listens for: a port the conductor is given.

A supervisor changes process-wide signal dispositions twice: while it runs, every catchable
signal it does not handle is quieted (left at their default, ALRM or a real-time signal would
kill it without an ``end`` and orphan the training); once the stop is done, the stop signals
are ignored (``scontrol requeue`` sends a TERM at once, which must not cut the journal's last
line). For ``supervise`` these changes are right until it exits. For anything else that runs
an ``Agent`` in its own process (the in-process conductor tests) they would leak: a shell
started later inherits SIG_IGN for TERM and never dies of it. So the changes go through one
object handed to the ``Agent``: ``ProcessDispositions`` (the default) makes them for good;
a test passes its own (tests/core/test_conductor.py records them and changes nothing).
"""

from __future__ import annotations

import signal
from typing import Iterable, Protocol

from supervisor import policy
from supervisor.child import quiet_stray_signals


class Dispositions(Protocol):
    """The two changes the conductor makes to the process's signal dispositions."""

    def quiet_stray(self, handled: Iterable[int]) -> None:
        """Every catchable signal not in ``handled`` is ignored (faults keep their default)."""

    def ignore_stop(self) -> None:
        """The stop signals are ignored from now on: nothing is left to stop."""


class ProcessDispositions:
    """The real port: changes this process's dispositions, kept until it exits."""

    def quiet_stray(self, handled: Iterable[int]) -> None:
        quiet_stray_signals(handled)

    def ignore_stop(self) -> None:
        for sig in policy.STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
