"""Parsing of the small value types every room shares: durations and signal names."""

from __future__ import annotations

import re
import signal

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)([hms]))")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration(text: str | int | float) -> float:
    """Seconds from ``90``, ``90s``, ``1.5s``, ``10m``, ``1h30m`` or a number.

    Raises ValueError with the accepted forms, so callers can build a one-line message.
    """
    if isinstance(text, bool):
        raise ValueError("a duration such as 90, 90s, 10m or 1h30m")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError("a duration that is not negative")
        return float(text)
    s = str(text).strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        return float(s)
    pos, total = 0, 0.0
    units_seen: list[str] = []
    for m in _DURATION.finditer(s):
        if m.start() != pos or m.group(2) in units_seen:
            break
        units_seen.append(m.group(2))
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s) or units_seen != sorted(units_seen, key="hms".index):
        raise ValueError("a duration such as 90, 90s, 10m or 1h30m")
    return total


def format_duration(seconds: float) -> str:
    """The inverse of parse_duration for messages: ``1h30m``, ``45s``, ``0.25s``."""
    if seconds < 60:
        return f"{seconds:.3g}s"
    whole = int(round(seconds))
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v) or "0s"


def parse_signal(name: str | int) -> signal.Signals:
    """A signal from ``USR1``, ``SIGUSR1``, ``usr1`` or ``10``."""
    if isinstance(name, bool):
        raise ValueError("a signal name such as TERM, INT, USR1 or USR2")
    if isinstance(name, int) or (isinstance(name, str) and name.strip().isdigit()):
        try:
            return signal.Signals(int(name))
        except ValueError:
            raise ValueError("a signal name such as TERM, INT, USR1 or USR2") from None
    s = str(name).strip().upper()
    if not s.startswith("SIG"):
        s = "SIG" + s
    try:
        sig = signal.Signals[s]
    except KeyError:
        raise ValueError("a signal name such as TERM, INT, USR1 or USR2") from None
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise ValueError("a signal that can be caught (not KILL or STOP)")
    return sig


def signal_name(sig: int) -> str:
    """``SIGTERM`` for 15; ``signal 99`` for unknown numbers."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """``step_9`` < ``step_10``: digits compare as numbers, so "newest" means the highest step."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in _DIGITS.split(name) if p)
