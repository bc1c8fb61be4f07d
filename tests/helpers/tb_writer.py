"""A training's TensorBoard writer, time compressed: a simulated ``--hours`` of steps (one a
simulated second: a ``loss`` scalar and a histogram, sized so the file ends at ``--size``
bytes; fewer steps for a small size) written over ``--seconds`` real seconds into ``LOGDIR/events.out.tfevents.…``,
through a buffered file flushed every ``--flush`` seconds, as SummaryWriter does (so a
record may be on disk in part between flushes). ``--partial``: each flush leaves half of the
next record on disk for a while (a record being written). ``--torn-end``: the last record is
left half written (a writer killed mid-record). ``--times FILE``: one line per flush, "wall
time, bytes of whole records on disk, last step", for the lag. Bytes: tests/support/tfevents.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.tfevents import FixedBody, event_head, file_version, frame, histogram_summary, scalar  # noqa: E402

FILE = "events.out.tfevents.1700000000.node0001.4242.0"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("logdir")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--hours", type=float, default=12.0)
    ap.add_argument("--size", type=int, default=2 << 20)
    ap.add_argument("--flush", type=float, default=0.2)
    ap.add_argument("--partial", action="store_true")
    ap.add_argument("--torn-end", action="store_true")
    ap.add_argument("--times", default="")
    a = ap.parse_args()
    steps = max(1, min(int(a.hours * 3600), a.size // 140))  # a step a simulated second, fewer for a small --size
    spacing = a.hours * 3600 / steps
    per_step = a.size / steps
    bins = max(1, int((per_step - 100) / 12))  # a histogram event is about 12 bytes a bucket, plus framing and tag
    hist = FixedBody(histogram_summary("layer0/weights", bins))
    logdir = Path(a.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    times = open(a.times, "a") if a.times else None
    t0 = time.time()
    sim0 = 1_700_000_000.0
    with open(logdir / FILE, "ab", buffering=1 << 16) as f:
        f.write(frame(file_version(sim0)))
        whole = f.tell()  # bytes of whole records written
        held, held_len = b"", 0
        step = 0
        while step < steps:
            now = time.time() - t0
            due = min(steps, int(steps * min(1.0, now / a.seconds)) + 1)
            f.write(held)
            whole += held_len
            held, held_len = b"", 0
            out = []
            while step < due:
                wall = sim0 + step * spacing
                out.append(frame(scalar(wall, step, "loss", 1.0 / (1 + step))))
                out.append(hist.record(event_head(wall, step)))
                step += 1
            if a.partial and step < steps:
                held_len = len(out[-1])
                cut = held_len // 2
                held = out[-1][cut:]
                out[-1] = out[-1][:cut]
                f.write(b"".join(out))
                whole += sum(len(r) for r in out[:-1])
            else:
                f.write(b"".join(out))
                whole += sum(len(r) for r in out)
            f.flush()
            if times is not None:
                times.write(f"{time.time():.3f} {whole} {step - 1}\n")
                times.flush()
            time.sleep(a.flush)
        if a.torn_end:
            last = hist.record(event_head(sim0 + steps * spacing, steps))
            f.write(last[:len(last) // 2])
            f.flush()
    print(f"wrote {steps} steps", flush=True)


if __name__ == "__main__":
    main()
