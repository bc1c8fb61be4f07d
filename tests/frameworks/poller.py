"""Watch a persistent directory as a reader would: every 50 ms, load every newly visible
checkpoint with its library's loader (checkers.py) and append one JSON line per sighting.

    python tests/frameworks/poller.py CHECKER DIR OUT.jsonl [--interval 0.05]

A sighting is ``{"t", "name", "ok", "step" | "error"}``, one per version of an entry (its
inode, size, mtime and, for a link, its target): a checkpoint that is swapped for a newer copy
is loaded again. An entry that changed while it was being loaded is looked at again rather
than counted torn: only a version that stays put and does not load is a torn sighting.
Runs until SIGTERM; prints ``ready`` on stdout once its imports are done.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkers import CHECKERS, entries  # noqa: E402


def version(p: Path) -> tuple | None:
    try:
        st = os.stat(p, follow_symlinks=False)
        key: tuple = (st.st_ino, st.st_size, st.st_mtime_ns)
        if p.is_symlink():
            t = os.stat(p)
            key += (os.readlink(p), t.st_ino, t.st_size, t.st_mtime_ns)
        elif p.is_dir():
            key += tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(p)))
        return key
    except OSError:
        return None


def warm_up(check) -> None:  # noqa: ANN001
    """Pay the loaders' first-call costs now (imports; torch.load's first real load took 2 s
    here), so that the first sighting is not late by seconds."""
    import tempfile

    import torch

    try:
        check(Path("/nonexistent/checkpoint-0"))
    except BaseException:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        pass
    with tempfile.TemporaryDirectory() as tmp:
        f = os.path.join(tmp, "warm.pt")
        torch.save({"model": torch.nn.Linear(4, 4).state_dict(), "step": 0}, f)
        for weights_only in (True, False):
            torch.load(f, weights_only=weights_only)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checker", choices=sorted(CHECKERS))
    ap.add_argument("dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--interval", type=float, default=0.05)
    a = ap.parse_args()
    check = CHECKERS[a.checker]
    ready = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    warm_up(check)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    seen: dict[str, tuple] = {}
    ready.write("ready\n")
    ready.close()
    with open(a.out, "a") as out:
        while not stop:
            for p in entries(a.checker, a.dir):
                key = version(p)
                if key is None or seen.get(p.name) == key:
                    continue
                t = time.time()
                try:
                    line = {"t": t, "name": p.name, "ok": True, "step": check(p)}
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as e:  # noqa: BLE001 - any failure to load is the finding
                    if version(p) != key:
                        continue  # it changed under the load: look again next round
                    line = {"t": t, "name": p.name, "ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
                seen[p.name] = key
                out.write(json.dumps(line) + "\n")
                out.flush()
            time.sleep(a.interval)


if __name__ == "__main__":
    main()
