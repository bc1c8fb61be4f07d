"""The long chaos set, by hand: ``python -m tests.chaos --trials 200 [--seed S]``.

Runs seeds S, S+1, … (S: the given one, else drawn and printed), one line per trial, then
"N passed, N failed". A failed trial keeps its directory and prints how to replay it.
Run from the repository root, as root for the mount faults (others are not drawn without).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos._harness import FAULTS, can_mount, category, make_plan, run_trial


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20, help="how many trials (default 20)")
    ap.add_argument("--seed", type=int, default=None, help="first seed (default: drawn, and printed)")
    ap.add_argument("--fault", choices=FAULTS, action="append",
                    help="only seeds whose plan has this fault (repeatable); seeds are skipped, not re-drawn")
    ap.add_argument("--keep", action="store_true", help="keep every trial's directory, not only failed ones")
    ap.add_argument("--dir", type=Path, default=None, help="where trial directories go (default: a new temp dir)")
    ap.add_argument("--plan", action="store_true", help="print the plans only, run nothing")
    a = ap.parse_args(argv)
    first = a.seed if a.seed is not None else random.SystemRandom().randrange(10**6)
    mounts = can_mount()
    base = a.dir or Path(tempfile.gettempdir() if a.plan else tempfile.mkdtemp(prefix="supervise-chaos-"))
    print(f"chaos: {a.trials} trials from seed {first}{'' if mounts else ' (not root: no mount faults)'}; in {base}",
          flush=True)
    passed = failed = 0
    seed = first
    t0 = time.monotonic()
    while passed + failed < a.trials:
        plan = make_plan(seed, mounts=mounts)
        if a.fault and plan.fault not in a.fault:
            seed += 1
            continue
        if a.plan:
            print(category(plan).ljust(36), plan.describe(), flush=True)
            passed += 1
            seed += 1
            continue
        result = run_trial(seed, base / f"seed-{seed}", mounts=mounts, keep=a.keep)
        if result.ok:
            passed += 1
            print(result.line(), flush=True)
        else:
            failed += 1
            print(result.explain(), flush=True)
        seed += 1
    if a.plan:
        print(f"{passed} plans (seeds {first}..{seed - 1})")
        return 0
    print(f"{passed} passed, {failed} failed ({time.monotonic() - t0:.0f}s; seeds {first}..{seed - 1})",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
