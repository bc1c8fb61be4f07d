"""When to warn before the time limit. Pure logic, no I/O: the agent feeds it numbers.

The warning must come early enough for the stop sequence to finish before the scheduler's
SIGKILL: "checkpoint now" and wait for the checkpoint to be written (step ``checkpoint``),
flush every sync pair (``flush``), stop the child, flush again (``final-flush``). How long
those take is known best from earlier attempts of the same run (the agent journals each
step as a ``stop-step`` event), so ``--warn-before auto`` learns the lead (docs/slurm.md,
"The warning lead"):

* **Only stops the training answered teach.** An attempt is a sample when its ``checkpoint``
  step ended ``published`` (a checkpoint completed *after* the request, made durable) and
  the training answered the request (``answered`` is not false: a stop that waited for the
  training's next periodic save says ``answered: false`` and teaches nothing, or the lead
  would grow with the save period, issue 15).
* ``need`` of a sample = checkpoint + flush + final-flush seconds (the steps run one after
  the other); the samples are smoothed in attempt order (EWMA, weight ``SMOOTHING`` for the
  newest), and ``lead = margin × smoothed + extra``, at most ``cap``.
* **The lead fits the job** (``fit``): with nothing learned it is the default (5 min) but
  never more than a quarter of the allocation (``FIRST_SHARE``); any lead is at least
  ``floor`` (itself at most that quarter) and never so long that the training runs less
  than ``MIN_SHARE`` of its allocation before the warning.

``margin`` (25 %) covers growth of the checkpoint; ``extra`` (30 s) covers what is not
measured: the request's way to every rank and the training step in flight when it arrives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

STOP_STEP = "stop-step"
LEARNED_STEPS = ("checkpoint", "flush", "final-flush")
DEFAULT_LEAD = 300.0   # seconds, with nothing learned (then cut to FIRST_SHARE of the allocation)
FLOOR, CAP = 60.0, 1800.0
MARGIN, EXTRA = 1.25, 30.0
SMOOTHING = 0.5        # weight of the newest attempt in the smoothed need
FIRST_SHARE = 0.25     # the unlearned lead is at most this share of the allocation
MIN_SHARE = 0.6        # the training runs at least this share of its allocation before a warning


@dataclass(frozen=True)
class Lead:
    """The lead and what it was learned from (journaled in the ``deadline`` event)."""

    seconds: float
    learned: bool
    samples: tuple[dict[str, Any], ...] = ()   # per answered stop: attempt, the steps' seconds, need_s
    ignored: tuple[dict[str, Any], ...] = ()   # stops that teach nothing, and why
    smoothed_need_s: float | None = None

    def fields(self) -> dict[str, Any]:
        return {"learned": self.learned, "samples": list(self.samples), "ignored": list(self.ignored),
                "smoothed_need_s": self.smoothed_need_s}


def warning_time(end: float, lead: float) -> float:
    """The moment to start the stop sequence: ``lead`` seconds before ``end``."""
    return end - max(0.0, lead)


def _seconds(ev: dict[str, Any]) -> float | None:
    try:
        s = float(ev.get("seconds"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return s if math.isfinite(s) and s >= 0 else None


def _attempt(ev: dict[str, Any]) -> int | None:
    try:
        return int(ev.get("attempt", 0))
    except (TypeError, ValueError):
        return None


def stops_by_attempt(events: Iterable[dict[str, Any]], *,
                     before_attempt: int | None = None) -> dict[int, dict[str, dict[str, Any]]]:
    """The learned stop steps of each attempt: {attempt: {step: event}}. Events that are not
    ``stop-step``, other steps and unreadable ``seconds`` are left out (a torn or foreign
    journal must not break the deadline)."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for ev in events:
        if not isinstance(ev, dict) or ev.get("kind") != STOP_STEP or ev.get("step") not in LEARNED_STEPS:
            continue
        attempt = _attempt(ev)
        if attempt is None or (before_attempt is not None and attempt >= before_attempt):
            continue
        if _seconds(ev) is None:
            continue
        out.setdefault(attempt, {})[ev["step"]] = ev
    return out


def sample_of(attempt: int, steps: dict[str, dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """(the sample an attempt's stop gives, or None and why it teaches nothing)."""
    cp = steps.get("checkpoint")
    if cp is None:
        return None, "no checkpoint step"
    if cp.get("outcome") != "published":
        return None, f"checkpoint {cp.get('outcome') or 'not taken'}"
    if cp.get("answered") is False:
        return None, "waited for a periodic save: the training did not answer the request"
    sample: dict[str, Any] = {"attempt": attempt}
    for name in LEARNED_STEPS:
        ev = steps.get(name)
        sample[name.replace("-", "_") + "_s"] = _seconds(ev) if ev is not None else 0.0
    sample["need_s"] = round(sum(sample[n.replace("-", "_") + "_s"] for n in LEARNED_STEPS), 3)
    return sample, ""


def smooth(values: Iterable[float], weight: float = SMOOTHING) -> float:
    """Exponentially weighted mean, oldest first; the newest value weighs ``weight``."""
    it = iter(values)
    s = next(it)
    for v in it:
        s = weight * v + (1 - weight) * s
    return s


def learn(events: Iterable[dict[str, Any]], *, before_attempt: int | None = None, default: float = DEFAULT_LEAD,
          margin: float = MARGIN, extra: float = EXTRA, cap: float = CAP) -> Lead:
    """The lead learned from earlier attempts' answered stops (module docstring); ``default``
    when none answered. ``before_attempt`` keeps the current attempt's own events out."""
    samples, ignored = [], []
    for attempt, steps in sorted(stops_by_attempt(events, before_attempt=before_attempt).items()):
        sample, why = sample_of(attempt, steps)
        if sample is None:
            ignored.append({"attempt": attempt, "why": why})
        else:
            samples.append(sample)
    if not samples:
        return Lead(default, False, ignored=tuple(ignored))
    need = smooth(s["need_s"] for s in samples)
    return Lead(min(cap, margin * need + extra), True, tuple(samples), tuple(ignored), round(need, 3))


def learn_lead(events: Iterable[dict[str, Any]], **kw: Any) -> float:
    """Seconds of warning, before fitting to the job (``learn(...).seconds``)."""
    return learn(events, **kw).seconds


def fit(lead: Lead, allocation: float | None, *, floor: float = FLOOR) -> tuple[float, str | None]:
    """(the lead this job can afford, what bounded it or None). ``allocation``: seconds from
    the attempt's start to the job's end, when known."""
    if allocation is None or allocation <= 0:
        return (max(floor, lead.seconds), "floor") if lead.learned and lead.seconds < floor else (lead.seconds, None)
    first, most = FIRST_SHARE * allocation, (1 - MIN_SHARE) * allocation
    seconds, bound = lead.seconds, None
    if not lead.learned and seconds > first:
        seconds, bound = first, "first-share"
    if lead.learned and seconds < min(floor, first):
        seconds, bound = min(floor, first), "floor"
    if seconds > most:
        seconds, bound = most, "min-share"
    return round(seconds, 3), bound


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
