"""What ``supervise check`` and the start say of each sync pair: its sides, and the profile
detected from what is on disk now (local side first)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from supervisor.sync._complete import classify
from supervisor.sync._profiles import GENERIC

if TYPE_CHECKING:
    from supervisor.sync._pair import PairEngine


def describe(engines: list[PairEngine]) -> list[tuple[str, str]]:
    """Each pair in one line, ``("ok" | "warn", text)``. Blocking: reads directories."""
    out = []
    for eng in engines:
        p = eng.pair
        text = f"{p.kind} {p.src} -> {p.where}"
        if p.kind != "checkpoint":
            out.append(("ok", f"{p.name}: {text}, grows files in place"))
            continue
        prof, evidence = eng.profile, "set" if eng.profile is not None else ""
        for root in (p.src,) if p.store is not None else (p.src, p.dst):
            if prof is None:
                listing = classify(root, exclude=p.exclude, now=time.time())
                prof, evidence = listing.profile, f"detected from {root / listing.evidence}" if listing.profile else ""
                if prof is None and listing.entries:
                    prof, evidence = GENERIC, f"no known layout in {root}: {sorted(listing.entries)[0]}"
        quiet = prof is not None and eng.relies_on_quiescence(prof)
        name = prof.name if prof else "auto (detected when the first checkpoint appears; logged then)"
        how = (f"relies on quiescence alone (settle {p.settle:g}s): set markers or profile" if quiet
               else f"complete by evidence (writers {eng.writer_view()})" if prof
               else f"writers {eng.writer_view()}")
        out.append(("warn" if quiet else "ok",
                    f"{p.name}: {text}, profile {name}{' (' + evidence + ')' if evidence else ''}, "
                    f"{'restore, ' if p.restore else ''}{how}"))
    return out
