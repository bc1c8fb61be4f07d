"""Training-side helper: has the supervisor asked for a checkpoint, or for a stop?

Imported inside every rank, so it uses the standard library only and costs nothing per
step. The supervisor asks for "checkpoint now" in two ways, and this module watches both:

* a signal (``$SUPERVISE_CHECKPOINT_SIGNAL``, a name such as ``USR1``; USR1 by default),
  whose handler is installed **on import**: SIGUSR1's default action is to kill the process,
  so a request that comes before the training loop starts must find a handler already there;
* a file at ``$SUPERVISE_CHECKPOINT_REQUEST`` (on storage every node sees), which reaches
  ranks that no signal can reach (other nodes, launchers that die on USR1). It is looked at
  at most every ``STAT_INTERVAL`` seconds, so ``checkpoint_requested()`` can be called
  every step.

Typical loop (docs/training.md shows how ranks agree on the step)::

    from supervisor import training
    training.install_stop_handler()
    for step in ...:
        train_step()
        if training.checkpoint_requested():
            save_checkpoint(step)
            training.acknowledge()
        if training.stop_requested():
            save_checkpoint(step)
            break
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType
from typing import Any, Callable, Iterable

from supervisor import childenv

__all__ = [
    "checkpoint_requested", "acknowledge", "stop_requested", "install_stop_handler",
    "checkpoint_signal", "request_path", "run_dir", "attempt", "restored_from", "STAT_INTERVAL",
]

STAT_INTERVAL = 0.5  # seconds between looks at the request file

_signalled = False          # the checkpoint signal arrived and is not acknowledged yet
_file_pending = False       # the request file appeared and is not acknowledged yet
_acked_stamp: tuple[int, int] | None = None  # (inode, mtime_ns) of the file we acknowledged
_signals = 0                # checkpoint signals received so far
_file_stamp: tuple[int, int] | None = None  # the request file's stamp when it was last seen new
_signal_looked = 0          # the signal count for which the request file was last looked at
_asked: tuple[int, tuple[int, int] | None] = (0, None)  # (_signals, _file_stamp) when last reported: what acknowledge() clears
_next_stat = 0.0
_stat_count = 0             # how many times we looked (tests check the rate)
_stop_signal: int | None = None
_handler_installed = False


def checkpoint_signal() -> signal.Signals:
    """The signal that means "checkpoint now": ``$SUPERVISE_CHECKPOINT_SIGNAL`` or USR1."""
    name = os.environ.get(childenv.CHECKPOINT_SIGNAL, "").strip().upper() or "USR1"
    if name.isdigit():
        return signal.Signals(int(name))
    return signal.Signals[name if name.startswith("SIG") else "SIG" + name]


def request_path() -> str | None:
    """Where the supervisor puts the request file, or None outside ``supervise``."""
    return os.environ.get(childenv.CHECKPOINT_REQUEST) or None


def run_dir() -> str | None:
    return os.environ.get(childenv.RUN_DIR) or None


def attempt() -> int:
    """1 on the first run, 2 after the first requeue, …; 1 outside ``supervise``."""
    try:
        return int(os.environ.get(childenv.ATTEMPT, "1"))
    except ValueError:
        return 1


def restored_from() -> str | None:
    """The checkpoint the supervisor restored before this attempt, if it did."""
    return os.environ.get(childenv.RESTORED_FROM) or None


def _on_checkpoint_signal(signum: int, frame: FrameType | None) -> None:
    global _signalled, _signals
    _signalled = True
    _signals += 1


def _stamp(path: str) -> tuple[int, int] | None:
    global _stat_count
    _stat_count += 1
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns)


def checkpoint_requested() -> bool:
    """True once "checkpoint now" arrived (signal or request file) until ``acknowledge()``.

    Cheap: a flag test and a clock read; the file is stat'ed at most every 0.5 s. Every
    rank should agree on the step before saving (docs/training.md).
    """
    global _file_pending, _next_stat, _file_stamp, _asked, _signal_looked
    if _signalled or _file_pending:
        if _signalled and not _file_pending and _signal_looked != _signals:
            # supervise writes the request file, then signals: that file is this same request,
            # and acknowledge() must clear it too (else one request makes two checkpoints).
            _signal_looked = _signals
            path = request_path()
            stamp = _stamp(path) if path else None
            if stamp is not None and stamp != _acked_stamp:
                _file_stamp = stamp
        _asked = (_signals, _file_stamp)
        return True
    now = time.monotonic()
    if now < _next_stat:
        return False
    _next_stat = now + STAT_INTERVAL
    path = request_path()
    if path:
        stamp = _stamp(path)
        if stamp is not None and stamp != _acked_stamp:
            _file_pending, _file_stamp = True, stamp
    if _signalled or _file_pending:
        _asked = (_signals, _file_stamp)
    return _signalled or _file_pending


def acknowledge() -> None:
    """Clear this rank's request after the checkpoint is saved, so the next one is seen.

    The request file may stay where it is: the same file (same inode and mtime) does not
    count twice, while a new or touched file is a new request. Only what
    ``checkpoint_requested()`` last reported is cleared: a request that came during the save
    (or a periodic save that never asked) stays pending, since supervise waits for a
    checkpoint *started* after its request (issue 22). A request is its file: a signal that finds
    the answered file unchanged belongs to it (if supervise could not write the file, a full run
    directory, such a signal during a save is taken for the answered one).
    """
    global _signalled, _file_pending, _acked_stamp, _next_stat
    _signalled = _signals != _asked[0]
    _file_pending = False
    _acked_stamp = _asked[1]
    _next_stat = 0.0
    if _signalled and _acked_stamp is not None:
        # supervise writes a new request file before each signal. A signal that came during
        # the save while the file on disk is still the one just answered is that request's
        # own signal, late (the stat saw the file first), not a second request.
        path = request_path()
        if path and _stamp(path) == _acked_stamp:
            _signalled = False


def stop_requested() -> bool:
    """True after SIGTERM/SIGINT arrived, once ``install_stop_handler()`` was called."""
    return _stop_signal is not None


def install_stop_handler(signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT)) -> bool:
    """Turn TERM/INT into a flag, so the loop can save and leave at a step boundary.

    A handler that was already there (a framework's) still runs after ours; the default
    actions (die, KeyboardInterrupt) are what we replace. Only from the main thread;
    returns False when that is not where we are.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in signals:
        previous = signal.getsignal(sig)
        if not getattr(previous, "_supervise", False):  # installing twice changes nothing
            signal.signal(sig, _chain(previous))
    return True


def _chain(previous: Any) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        global _stop_signal
        _stop_signal = signum
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)
    handler._supervise = True  # type: ignore[attr-defined]
    return handler


def _install_checkpoint_handler() -> None:
    """Catch the checkpoint signal unless somebody already handles it (or ignores it)."""
    global _handler_installed
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        sig = checkpoint_signal()
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _on_checkpoint_signal)
            _handler_installed = True
    except (KeyError, ValueError, OSError):
        pass  # a bad name, or not allowed here: the request file still works


_install_checkpoint_handler()
