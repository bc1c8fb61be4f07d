"""How far the newest durable checkpoint trails the newest complete local one (issue 30, 2).

Read from a run's journal alone: each checkpoint's first ``publish`` (not a pointer, not a
file beside the checkpoints) gives when it landed (``t``) and when its writer completed it
(``t - lag_s``). Staleness at a moment is the completion time of the newest checkpoint
complete locally then, less that of the newest one durable then (0 when it is durable). It
only grows as a newer one completes and only falls as one lands, so its highs are just
before each landing: those are the samples. It needs every checkpoint published in the end
(a final flush; no local retention), which the runs that measure it do; the landings
after ``until`` are still samples of the time before it (a run that published nothing while
training has one, as long as it trained).
"""

from __future__ import annotations

import re
from typing import Any, Iterable


def _step(name: str) -> int:
    digits = re.findall(r"\d+", name)
    return int(digits[-1]) if digits else -1


def staleness(events: Iterable[dict[str, Any]], until: float | None = None) -> list[float]:
    """Samples of the staleness (seconds), one just before each landing up to ``until`` (the
    training's exit, say). Before anything is durable it counts from the first completion."""
    done: dict[str, float] = {}
    landed: dict[str, float] = {}
    for e in events:
        if e.get("kind") != "publish" or e.get("pointer") or e.get("restorable") is False or e.get("lag_s") is None:
            continue
        name = str(e["checkpoint"])
        if name not in landed:
            landed[name], done[name] = float(e["t"]), float(e["t"]) - float(e["lag_s"])
    out = []
    for when in sorted(landed.values()):
        if until is not None and when > until:
            when = until  # the last moment that counts: what was behind then
        durable = [n for n, t in landed.items() if t < when]
        local = [n for n, t in done.items() if t <= when]
        if not local:
            continue
        newest_local = done[max(local, key=_step)]
        # Nothing durable yet: behind since the first checkpoint completed.
        newest_durable = done[max(durable, key=_step)] if durable else min(done.values())
        out.append(round(max(0.0, newest_local - newest_durable), 3))
        if until is not None and when >= until:
            break
    return out
