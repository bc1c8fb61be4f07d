"""Parsing of the small value types every room shares: durations and signal names."""

from __future__ import annotations

import math
import re
import signal

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)([hms]))")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0}
# The schedulers' own forms (sbatch --time, PBS walltime): MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_CLOCK = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
MAX_DURATION = 10 * 366 * 86400.0  # ten years: past any scheduler's limit, and sleep() would overflow
FORMS = ("a duration such as 90 (seconds), 90s, 10m, 1h30m, or as the scheduler writes it: "
         "MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS")


def parse_duration(text: str | int | float) -> float:
    """Seconds from ``90``, ``90s``, ``1.5s``, ``10m``, ``1h30m`` or a number, or from the
    schedulers' forms (``sbatch --time``, PBS ``walltime``): ``MM:SS``, ``HH:MM:SS``, ``D-HH``,
    ``D-HH:MM``, ``D-HH:MM:SS``. A bare number is seconds (sbatch reads it as minutes; no
    colon form differs from Slurm's).

    Raises ValueError with the accepted forms, so callers can build a one-line message.
    NaN, infinities and anything beyond ten years are refused: a timer armed with them
    never fires (or overflows), so the watch it feeds would silently be off.
    """
    if isinstance(text, bool):
        raise ValueError(FORMS)
    if isinstance(text, (int, float)):
        if not math.isfinite(text):
            raise ValueError("a finite duration such as 90s, 10m or 1h30m")
        if text < 0:
            raise ValueError("a duration that is not negative")
        return _bounded(float(text))
    s = str(text).strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        return _bounded(float(s))
    if ":" in s or "-" in s:
        return _bounded(_clock(s))
    pos, total = 0, 0.0
    units_seen: list[str] = []
    for m in _DURATION.finditer(s):
        if m.start() != pos or m.group(2) in units_seen:
            break
        units_seen.append(m.group(2))
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s) or units_seen != sorted(units_seen, key="hms".index):
        raise ValueError(FORMS)
    return _bounded(total)


def _clock(s: str) -> float:
    """``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS`` as Slurm reads them (PBS's
    walltime is ``HH:MM:SS`` or ``MM:SS`` too); a field after the first is under 60 (the first
    may be more: ``90:00``, ``48:00:00``). Anything else (``1-``, four fields, a unit) is refused."""
    m = _CLOCK.fullmatch(s)
    if m is None:
        raise ValueError(FORMS)
    day, first, *rest = m.groups()
    fields = [int(first), *(int(x) for x in rest if x is not None)]
    if day is None:
        if len(fields) < 2:
            raise ValueError(FORMS)
        hms = fields if len(fields) == 3 else [0, *fields]  # MM:SS is minutes and seconds, as sbatch reads it
    else:
        hms = (fields + [0, 0])[:3]  # D-HH, D-HH:MM, D-HH:MM:SS
    if any(v >= 60 for v in fields[1:]):  # the first field may be large: 90:00, 48:00:00
        raise ValueError(FORMS + " (minutes and seconds under 60)")
    return float(((int(day or 0) * 24 + hms[0]) * 60 + hms[1]) * 60 + hms[2])


def _bounded(seconds: float) -> float:
    if seconds > MAX_DURATION:
        raise ValueError("a duration under ten years, such as 90s, 10m or 1h30m")
    return seconds


def parse_positive_duration(text: str | int | float) -> float:
    """A duration that must be more than zero (an interval, a timeout): 0 would spin or never wait."""
    seconds = parse_duration(text)
    if seconds <= 0:
        raise ValueError("a duration above zero, such as 90s, 10m or 1h30m")
    return seconds


def format_duration(seconds: float) -> str:
    """The inverse of parse_duration for messages: ``1h30m``, ``45s``, ``0.25s``."""
    if seconds < 60:
        return f"{seconds:.3g}s"
    whole = int(round(seconds))
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v) or "0s"


# Signals an option may name: catchable, not the kernel's fault reports (SEGV, BUS, ILL, FPE,
# ABRT, TRAP, SYS), not job control (STOP, TSTP, TTIN, TTOU, CONT: CONT is Slurm's job-wide
# mark) and not CHLD or PIPE, which the runtime itself uses.
OPTION_SIGNALS = frozenset(getattr(signal, n) for n in (
    "SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF",
    "SIGXCPU", "SIGPWR", "SIGURG", "SIGWINCH", "SIGIO") if hasattr(signal, n))
_SIGNAL_FORMS = "a signal name such as TERM, INT, USR1 or USR2"


def parse_signal(name: str | int) -> signal.Signals:
    """A signal from ``USR1``, ``SIGUSR1`` or ``usr1``.

    Numbers are refused (they differ between architectures: 10 is USR1 on x86 and BUS on
    others; ``9`` and ``19`` slipped KILL and STOP through), and so is any signal outside
    OPTION_SIGNALS: one supervise cannot catch, or one whose meaning is taken.
    """
    if isinstance(name, bool) or not isinstance(name, str):
        raise ValueError(f"{_SIGNAL_FORMS} (by name, not by number)")
    s = name.strip().upper()
    if s.isdigit():
        raise ValueError(f"{_SIGNAL_FORMS} (by name, not by number)")
    if not s.startswith("SIG"):
        s = "SIG" + s
    try:
        sig = signal.Signals[s]
    except KeyError:
        raise ValueError(_SIGNAL_FORMS) from None
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise ValueError("a signal that can be caught (not KILL or STOP)")
    if sig not in OPTION_SIGNALS:
        raise ValueError(f"{_SIGNAL_FORMS}; {sig.name} is not one supervise can take "
                         "(faults, job control, CHLD and PIPE are refused)")
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
