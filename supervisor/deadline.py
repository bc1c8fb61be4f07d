"""When to warn before the time limit. Pure logic, no I/O: the agent feeds it numbers.

The warning must come early enough for the stop sequence to finish before the scheduler's
SIGKILL: "checkpoint now" and wait for the checkpoint to be written (step ``checkpoint``),
flush every sync pair (``flush``), stop the child, flush again (``final-flush``). How long
those take is known best from earlier attempts of the same run (the agent journals each
step's duration as a ``stop-step`` event), so ``--warn-before auto`` learns the lead:

    need = p95(checkpoint) + p95(flush) + p95(final-flush)   (seconds; a step never seen counts 0)
    lead = clamp(margin * need + extra, floor, cap)

p95 is the nearest-rank percentile (the ceil(0.95·n)-th smallest), so with fewer than 20
samples it is the slowest one seen: one slow checkpoint is enough to warn earlier next time.
``margin`` (25 %) covers growth of the checkpoint; ``extra`` (30 s) covers what is not
measured: the request's way to every rank and the training step in flight when it arrives.
``floor`` keeps a sane minimum when past steps were instant, ``cap`` keeps one pathological
attempt from wasting half the allocation. With nothing learned the default (5 min) is used.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

STOP_STEP = "stop-step"
LEARNED_STEPS = ("checkpoint", "flush", "final-flush")


def warning_time(end: float, lead: float) -> float:
    """The moment to start the stop sequence: ``lead`` seconds before ``end``."""
    return end - max(0.0, lead)


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty collection."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of nothing")
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def step_durations(events: Iterable[dict[str, Any]], *, before_attempt: int | None = None) -> dict[str, list[float]]:
    """Durations of the learned stop steps, by step name, from journal events.

    Ignores events that are not ``stop-step``, steps not in LEARNED_STEPS, and unreadable or
    negative ``seconds`` (a torn or foreign journal must not break the deadline).
    """
    out: dict[str, list[float]] = {name: [] for name in LEARNED_STEPS}
    for ev in events:
        if not isinstance(ev, dict) or ev.get("kind") != STOP_STEP or ev.get("step") not in out:
            continue
        if before_attempt is not None:
            try:
                if int(ev.get("attempt", 0)) >= before_attempt:
                    continue
            except (TypeError, ValueError):
                continue
        try:
            seconds = float(ev.get("seconds"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isfinite(seconds) and seconds >= 0:
            out[ev["step"]].append(seconds)
    return out


def learn_lead(
    events: Iterable[dict[str, Any]],
    *,
    floor: float = 60.0,
    cap: float = 1800.0,
    margin: float = 1.25,
    extra: float = 30.0,
    default: float = 300.0,
    before_attempt: int | None = None,
) -> float:
    """Seconds of warning before the end, learned from earlier attempts (formula above).

    The steps are summed because the stop sequence runs them one after the other.

    ``before_attempt`` limits learning to attempts before it (the current attempt's own
    events, if any, are not "earlier"). Returns ``default`` when no duration was recorded.
    """
    durations = step_durations(events, before_attempt=before_attempt)
    if not any(durations.values()):
        return default
    need = sum(percentile(v, 95) for v in durations.values() if v)
    return min(cap, max(floor, margin * need + extra))


def resolve_end(
    now: float,
    start: float | None,
    time_limit: float | None,
    deadline: float | None,
    scheduler_end: float | None,
) -> tuple[float | None, str]:
    """Which end time governs the run, and where it came from.

    The flags (``Config.time_limit``: seconds from ``start``; ``Config.deadline``: absolute)
    override the scheduler: a user who sets one means it (a test of the stop sequence with a
    short limit, or a site whose reported end is wrong). When both flags are set the earlier
    wins. Sources: ``"deadline"``, ``"time-limit"``, ``"scheduler"``, ``"none"``.
    """
    flags: list[tuple[float, str]] = []
    if time_limit is not None:
        flags.append(((start if start is not None else now) + time_limit, "time-limit"))
    if deadline is not None:
        flags.append((deadline, "deadline"))
    if flags:
        return min(flags)
    if scheduler_end is not None:
        return scheduler_end, "scheduler"
    return None, "none"
