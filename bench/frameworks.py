"""Every framework profile side by side, through the real ``supervise`` (issue 12).

For each case of tests/frameworks (HF ``Trainer``, Lightning with a ``last.ckpt`` copy and a
link, ``torch.save`` in place and through ``os.replace``, DCP, Accelerate, DeepSpeed ZeRO 0 and
1 with 2 ranks, Orbax), in one invocation:

1. **Publish lag.** A finished run of ``--saves`` checkpoints, one every ``--every`` seconds.
   Two figures per checkpoint: the ``publish`` event's ``lag_s`` (supervise's own: now minus
   the time the writer finished the checkpoint — its marker's mtime, its last write), and the
   reader's lag: when the poller (tests/frameworks/poller.py, every 50 ms) first loaded that
   step on the persistent side, minus when the library returned from the save (the trainer's
   ``saved`` line). The second includes the poll interval; it is what a reader waits.
2. **Torn sightings**: every checkpoint the poller saw on the persistent side that did not load
   with the library's own loader, across all runs of the case.
3. **Preemption.** SIGTERM to supervise mid-run (between two saves), then a second attempt on an
   empty local disk: steps lost = the last step the first attempt computed minus the step the
   second one resumed at; whether the resumed-from checkpoint is one of the profile's (a restore
   of anything else counts as a bad restore); whether the final checkpoint of the finished
   second attempt is durable when supervise exits (a lost final checkpoint otherwise).

    .venv/bin/python bench/frameworks.py                 # every case whose library is installed
    .venv/bin/python bench/frameworks.py --cases hf dcp  # some
    .venv/bin/python bench/frameworks.py --json out.json
    .venv/bin/python bench/frameworks.py --cases deepspeed-zero1 --save-pause 3   # rank 1 late by 3 s
    .venv/bin/python bench/frameworks.py --cases deepspeed-zero1 --saves 100 --every 0.12 --save-every 3 --lag-only

``stale_*``: how far the newest durable checkpoint trailed the newest complete one while the
training ran (tests/support/staleness.py, issue 30).

Goal (issue 12): lag p95 < 1 s for every profile whose writer is visible; 0 torn sightings;
0 lost final checkpoints; 0 restores of a non-checkpoint.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.frameworks._harness import CASES, Poller, Run  # noqa: E402
from tests.frameworks.checkers import CHECKERS  # noqa: E402
from tests.support.staleness import staleness  # noqa: E402


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1]


def reader_lags(attempt_saved: list[dict[str, Any]], sightings: list[dict[str, Any]]) -> list[float]:
    """Per saved step: the first good sighting of that step minus the time the save returned."""
    first: dict[int, float] = {}
    for s in sightings:
        if s["ok"] and s["step"] not in first:
            first[s["step"]] = s["t"]
    return [first[x["step"]] - x["t"] for x in attempt_saved if x["step"] in first]


def bench_case(case_id: str, work: Path, saves: int, every: float, save_pause: float = 0.0,
               lag_only: bool = False, save_every: int = 5) -> dict[str, Any]:
    case = CASES[case_id]
    step_sleep = every / save_every
    res: dict[str, Any] = {"case": case_id, "profile": case.profile}

    # 1. lag over a finished run
    run = Run(case, work / case_id / "lag")
    poller = Poller.start(case.loader, run.persistent, work / case_id / "lag-sightings.jsonl")
    try:
        a = run.run(steps=saves * save_every, save_every=save_every, step_sleep=step_sleep, restore=False, timeout=600,
                    save_pause=save_pause)
    finally:
        poller.stop()
    # checkpoints only: not pointers, nor files beside them (DeepSpeed's zero_to_fp32.py)
    lags = [e["lag_s"] for e in run.events(a, "publish") if not e.get("pointer") and e.get("restorable") is not False
            and e.get("lag_s") is not None]
    seen = reader_lags(a.lines("saved"), poller.sightings())
    prof = (run.events(a, "sync-profile") or [{}])[-1]
    # issue 30: how far the newest durable checkpoint trails the newest complete one while training
    exits = [e["t"] for e in run.events(a, "child-exit")]
    stale = staleness(run.events(a, "publish"), until=exits[0] if exits else None)
    res.update(rc=a.rc, detected=prof.get("profile"), writers=prof.get("writers"), publishes=len(lags),
               lag_p50=pct(lags, 50), lag_p95=pct(lags, 95), lag_max=max(lags, default=None),
               stale_p50=pct(stale, 50), stale_max=max(stale, default=None),
               reader_p50=pct(seen, 50), reader_p95=pct(seen, 95), reader_n=len(seen),
               final_durable=bool(run.durable()) and run.durable()[-1] == max(a.saved(), default=-1))
    torn = len(poller.torn())
    if lag_only:
        return {**res, "torn_sightings": torn}

    # 2. preemption, then a requeue on an empty disk
    run = Run(case, work / case_id / "preempt")
    poller = Poller.start(case.loader, run.persistent, work / case_id / "preempt-sightings.jsonl")
    try:
        a1 = run.start(steps=100000, save_every=save_every, step_sleep=step_sleep)
        run.preempt(a1, at_step=3 * save_every + 2, timeout=300)
        last = max(x["step"] for x in a1.lines("step"))
        run.wipe_local()
        a2 = run.run(steps=last + save_every, save_every=save_every, timeout=600)
    finally:
        poller.stop()
    start = a2.start_step() or {}
    restored = start.get("restored")
    good_restore = True
    if restored:
        name = Path(restored).name
        p = run.persistent / name
        try:
            CHECKERS[case.loader](p)
        except BaseException:  # noqa: BLE001 - a restore of something that does not load
            good_restore = False
    torn += len(poller.torn())
    final = run.durable()
    res.update(torn_sightings=torn, stop_rc=a1.rc, last_step=last, resumed_at=start.get("step"),
               steps_lost=None if start.get("step") is None else last - start["step"],
               restored=Path(restored).name if restored else None, bad_restores=0 if good_restore else 1,
               final_after_requeue=bool(final) and final[-1] == max(a2.saved(), default=-1))
    res["lost_finals"] = int(not res["final_durable"]) + int(not res["final_after_requeue"])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="*", default=sorted(CASES), choices=sorted(CASES))
    ap.add_argument("--saves", type=int, default=8, help="checkpoints in the lag run (default 8)")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between saves (default 1)")
    ap.add_argument("--save-pause", type=float, default=0.0,
                    help="a pause inside each save of the lag run (DeepSpeed: rank 1 late by this much)")
    ap.add_argument("--lag-only", action="store_true", help="the lag run alone, no preemption")
    ap.add_argument("--save-every", type=int, default=5, help="steps between saves (default 5)")
    ap.add_argument("--work", type=Path, help="scratch directory (default: a temp dir)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir=a.work) as tmp:
        for cid in a.cases:
            why = CASES[cid].missing()
            if why:
                print(f"{cid}: skipped, {why}", file=sys.stderr)
                continue
            print(f"{cid} …", file=sys.stderr, flush=True)
            rows.append(bench_case(cid, Path(tmp), a.saves, a.every, a.save_pause, a.lag_only, a.save_every))
    f = lambda v: "–" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    cols = ["case", "profile", "writers", "publishes", "lag_p50", "lag_p95", "lag_max", "stale_p50", "stale_max",
            "reader_p50", "reader_p95",
            "torn_sightings", "steps_lost", "restored", "bad_restores", "lost_finals"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f(r.get(c)) for c in cols) + " |")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
