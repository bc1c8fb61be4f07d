"""A TensorBoard event file mirrored into an object store: bytes sent and lag, today's whole-file
uploads beside the segments (issue 45, item 2).

A real S3 server (SeaweedFS, scripts/s3-up.sh) runs for the whole benchmark. The training is
``tests/helpers/tb_writer.py``: a faithful TFRecord writer (TensorBoard's bytes, CRC-32C and
all: TensorBoard's own ``EventAccumulator`` reads them; TensorBoard is no dependency of this
project, and without TensorFlow its writer computes CRCs in pure Python, minutes for 200 MB)
writing a simulated ``--hours`` (12) of steps, a ``loss`` scalar and a histogram each, up to
``--size`` bytes (200 MB), compressed into ``--seconds`` (60) of real time, flushed every 0.2 s
through a 64 KiB buffer, so a record is often on disk in part. Each way runs the real
``supervise --logs LOCAL s3://…`` with that writer as its training, in turn:

1. **today**: ``supervise`` as it was before issue 45 (``--today``, a git revision: its
   ``supervisor/`` taken with ``git archive``), which uploads the whole file at each batch;
2. **segments**: this tree's, which uploads only what grew, as a new object.

**Bytes sent** are counted in the client's upload path: the payload each PUT handed to obstore
(the ``bytes`` of the pair's ``sync`` events, counted by ``_store.Store`` as it reads the file),
HTTP headers not included (one request per upload, about 1 KB each). **Lag**: the writer notes
each flush (time, bytes of whole records on disk); a reader lists the bucket every 0.25 s; a
flush's lag is the time until the bucket held that many bytes of the log. The batch is the real
10 s, so a compressed run makes fewer uploads than a real 12 h (``--seconds`` / 10 against
4 320): today's bytes for a real 12 h are projected from the measured growth (the sum of the
file's sizes at one upload every 10 s), and printed as such.

    .venv/bin/python bench/s3_logs.py                        # 200 MB in 60 s, each way (about 3 min)
    .venv/bin/python bench/s3_logs.py --size 20e6 --seconds 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _s3_server import s3_up  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TODAY = "93b8cde"  # the last commit before issue 45's segments: whole-file log uploads
WRITER = ROOT / "tests" / "helpers" / "tb_writer.py"
EVENTS = "events.out.tfevents.1700000000.node0001.4242.0"
BATCH = 10.0  # s: supervisor/sync/_pair.py LOG_BATCH


def log_bytes(store: object, prefix: str) -> int:
    """Bytes of the log in the bucket: its key and its ``.seg-*`` objects (today: the key alone)."""
    import obstore

    key = f"{prefix}/train/{EVENTS}"
    return sum(m["size"] for batch in obstore.list(store, prefix=f"{prefix}/train") for m in batch
               if m["path"] == key or m["path"].startswith(f"{key}.seg-"))


def one_way(where: Path, code: Path, store: object, prefix: str, env: dict[str, str], a: argparse.Namespace) -> dict:
    """The real supervise (``code``: the directory holding its ``supervisor/``) mirroring the writer's logs."""
    import obstore

    run, logs, times = where / f"run-{prefix}", where / f"logs-{prefix}", where / f"times-{prefix}"
    seen: list[tuple[float, int]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            seen.append((time.time(), log_bytes(store, prefix)))
            time.sleep(0.25)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "supervisor", "--run-dir", str(run), "--logs", str(logs),
                               f"s3://bench/{prefix}", "--", sys.executable, str(WRITER), str(logs / "train"),
                               "--seconds", str(a.seconds), "--hours", str(a.hours), "--size", str(int(a.size)),
                               "--times", str(times)],
                              env={**env, "PYTHONPATH": str(code), "SUPERVISE_SYNC_NICE": "0", "SUPERVISE_SYNC_IONICE": "none"},
                              cwd=where, capture_output=True, text=True, timeout=a.seconds * 4 + 300)  # cwd: not ROOT, first on -m's path
    finally:
        stop.set()
        t.join()
    wall = time.monotonic() - t0
    seen.append((time.time(), log_bytes(store, prefix)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = (logs / "train" / EVENTS).stat().st_size
    syncs = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if '"kind":"sync"' in line]
    sent = sum(e["bytes"] for e in syncs)
    uploads = sum(e["files"] for e in syncs)
    lags = []
    flushes = [(float(at), int(size)) for at, size, _step in (line.split() for line in times.read_text().splitlines())]
    for at, size in flushes:
        there = next((ts for ts, n in seen if n >= size and ts >= at), None)
        lags.append(there - at if there is not None else float("inf"))
    objects = [m for batch in obstore.list(store, prefix=f"{prefix}/train") for m in batch]
    held = sum(m["size"] for m in objects)
    assert held == final, (held, final)  # what the bucket holds of the log is the whole file, no more
    # today's way at a real 12 h: one upload every 10 s, each the whole file as it was then
    sizes = [size for _at, size in flushes]
    n = int(a.hours * 3600 / BATCH)
    projected = sum(sizes[min(len(sizes) - 1, (k * len(sizes)) // n)] for k in range(1, n + 1))
    return {"final": final, "sent": sent, "uploads": uploads, "objects": len(objects), "wall": wall,
            "lag_med": statistics.median(lags), "lag_p95": sorted(lags)[int(0.95 * (len(lags) - 1))], "lag_max": max(lags),
            "projected_whole": projected, "real_uploads": n}


def code_of(rev: str, into: Path) -> Path:
    """The ``supervisor/`` package at git revision ``rev`` (today's way), unpacked under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "supervisor"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=float, default=200e6, help="bytes the event file ends at (default 200 MB)")
    ap.add_argument("--seconds", type=float, default=60.0, help="real seconds the simulated hours are written in")
    ap.add_argument("--hours", type=float, default=12.0, help="simulated hours")
    ap.add_argument("--today", default=TODAY, help="the git revision whose supervise is today's way")
    ap.add_argument("--work", default=None, help="where the logs and the server's data go (default: a temp dir)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.work, prefix="bench-s3-logs-") as tmp:
        where = Path(tmp)
        env, store = s3_up(where / "s3")
        try:
            print(f"a simulated {a.hours:g} h event file of {a.size / 1e6:.0f} MB, written in {a.seconds:g} s; "
                  f"uploads at most every {BATCH:g} s", flush=True)
            rows = {}
            for name, code in (("today", code_of(a.today, where / "today")), ("segments", ROOT)):
                r = rows[name] = one_way(where, code, store, name, env, a)
                assert name != "today" or r["objects"] == 1, f"today's way wrote {r['objects']} objects: not today's code"
                print(f"  {name:9s}: final {r['final'] / 1e6:7.1f} MB | sent {r['sent'] / 1e6:8.1f} MB in {r['uploads']:3d} "
                      f"uploads = {r['sent'] / r['final']:5.2f} x final | bucket: {r['objects']} objects | lag median "
                      f"{r['lag_med']:4.1f} s, p95 {r['lag_p95']:4.1f} s, max {r['lag_max']:4.1f} s", flush=True)
            today, seg = rows["today"], rows["segments"]
            print(f"  sent, today / segments: {today['sent'] / seg['sent']:.1f} x (this run's {today['uploads']} uploads); "
                  f"segments sent {seg['sent'] / seg['final']:.3f} x the final size (goal <= 1.1)", flush=True)
            print(f"  a real {a.hours:g} h ({today['real_uploads']} uploads, projected from this growth): today "
                  f"{today['projected_whole'] / 1e12:.2f} TB = {today['projected_whole'] / today['final']:.0f} x final; "
                  f"segments {seg['final'] / 1e6:.0f} MB once + {today['real_uploads']} requests", flush=True)
        finally:
            subprocess.run(["bash", str(ROOT / "scripts" / "s3-down.sh"), str(where / "s3")], capture_output=True)


if __name__ == "__main__":
    main()
