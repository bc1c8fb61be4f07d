"""The hostile corpus's long set, by hand: ``python -m tests.hostile [PYTEST ARGS…]``.

The default test run holds the CI set (about 2–3 min on 2 cores). The long set adds every
real-time signal to the stray-signal faults and repeats the whole corpus ``--rounds`` times
(default 3), so timing-dependent faults meet other interleavings.
"""

from __future__ import annotations

import argparse
import os
import sys

import pytest


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.hostile")
    ap.add_argument("--rounds", type=int, default=3)
    args, rest = ap.parse_known_args()
    os.environ["HOSTILE_LONG"] = "1"
    for n in range(1, args.rounds + 1):
        print(f"hostile long set: round {n} of {args.rounds}", flush=True)
        rc = pytest.main(["-q", "-p", "no:cacheprovider", os.path.dirname(__file__), *rest])
        if rc != 0:
            return int(rc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
