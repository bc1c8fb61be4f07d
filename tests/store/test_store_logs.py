"""Logs into an object store cost what they grew (issue 45): each upload of a log is a new
object holding only the bytes that grew since the last one (``<path>``, then
``<path>.seg-NNNNNNNN``), so the client sends each byte once; a TensorBoard event file is cut
at whole records, so each object is an event file of its own; the newest bytes still reach
the bucket within the 10 s batch; a requeue continues a log without sending it again.
Real SeaweedFS, the real ``supervise``. docs/sync.md, "Object stores"; the layout:
supervisor/sync/_storelogs.py."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from tests.support.journal import events
from tests.support.s3 import Bucket, S3Server
from tests.support.supervise import run_supervise
from tests.support.tfevents import records, steps

WRITER = Path(__file__).parents[1] / "helpers" / "tb_writer.py"
EVENTS = "events.out.tfevents.1700000000.node0001.4242.0"
PY = sys.executable
BATCH = 10.0      # s: _pair.LOG_BATCH, the most a new byte waits while the training writes
SLACK = 6.0       # s: the upload itself, a loaded machine, and the poller's own period
PER_UPLOAD = 0    # bytes a segment sends besides what grew (its request's headers are not counted here)


def _sent(run: Path, attempt: int | None = None) -> tuple[int, int]:
    """Bytes and objects the log pair's uploads sent, as the client counted them (the ``sync`` events)."""
    ev = [e for e in events(run / "events.jsonl", "sync") if e["pair"] == "logs" and (attempt is None or e["attempt"] == attempt)]
    return sum(e["bytes"] for e in ev), sum(e["files"] for e in ev)


def test_an_event_file_goes_up_in_segments_each_byte_once_and_each_an_event_file(bucket: Bucket, s3_server: S3Server,
                                                                                tmp_path: Path) -> None:
    logs, run, prefix = tmp_path / "logs", tmp_path / "run", "run1/tb"
    key = f"{prefix}/train/{EVENTS}"
    times = tmp_path / "times"
    seen: list[tuple[float, int]] = []
    stop = threading.Event()

    def look() -> None:
        seen.append((time.time(), sum(n for k, n in bucket.keys(f"{prefix}/train").items()
                                      if k == key or k.startswith(f"{key}.seg-"))))

    def poll() -> None:  # a reader of the bucket: when did each byte get there?
        while not stop.is_set():
            look()
            time.sleep(0.25)

    t = threading.Thread(target=poll)
    t.start()
    try:
        # 32 s of writing, a flush every 0.2 s, each leaving half a record on disk; the last record torn
        r = run_supervise("--run-dir", str(run), "--logs", str(logs), bucket.url(prefix), "--", PY, str(WRITER),
                          str(logs / "train"), "--seconds", "32", "--size", str(3 << 20), "--partial", "--torn-end",
                          "--times", str(times), env=s3_server.env, timeout=120)
    finally:
        stop.set()
        t.join()
    look()  # after the stop's last pass
    assert r.returncode == 0, r.stderr[-3000:]
    local = (logs / "train" / EVENTS).read_bytes()
    sent, uploads = _sent(run)
    assert sent == len(local), (sent, len(local))  # each byte once: today's whole-file uploads sent the sum of sizes
    assert sent <= 1.1 * len(local) + PER_UPLOAD * uploads
    parts = bucket.log_parts(key)
    assert uploads == len(parts)
    assert b"".join(data for _k, data in parts) == local  # the whole log, torn last record and all (the stop's last pass)
    assert len(parts) >= 4, [k for k, _d in parts]        # the first upload, one every 10 s, the stop's
    for k, data in parts[:-1]:  # every object but the last: whole records, every CRC right (AssertionError otherwise)
        assert len(list(records(data))) > 0, k
    whole = b"".join(data for _k, data in parts[:-1])
    assert steps(whole) == sorted(steps(whole)) and steps(whole)[-1] > 0
    # the lag: every whole record the writer flushed was in the bucket within the batch
    late = []
    for line in times.read_text().splitlines()[:-1]:
        at, size, _step = line.split()
        there = next((ts for ts, n in seen if n >= int(size) and ts >= float(at)), None)
        if there is None or there - float(at) > BATCH + SLACK:
            late.append((float(at), int(size), there and round(there - float(at), 1)))
    assert not late, late[:5]


def test_a_requeue_continues_a_log_and_sends_only_what_grew(bucket: Bucket, s3_server: S3Server, tmp_path: Path) -> None:
    logs, run, prefix = tmp_path / "logs", tmp_path / "run", "run1/logs"
    writer = ("import sys, time, pathlib\n"
              "p = pathlib.Path(sys.argv[1]); p.mkdir(exist_ok=True)\n"
              "with open(p / 'train.log', 'a') as f:\n"
              "    for i in range(200):\n"
              "        f.write(f'{sys.argv[2]} step {i} ' + 'x' * 500 + '\\n'); f.flush(); time.sleep(0.005)\n")
    sizes = []
    for attempt in ("first", "second"):
        if attempt == "second":
            # 9 MiB appended between the attempts, so the second's first upload holds all of it: a segment past
            # the 8 MiB part, a multipart upload from an offset. (Written by the training, an upload could cut it
            # mid-write: a log is cut where its bytes end.)
            with open(logs / "train.log", "a") as f:
                f.write("y" * (9 << 20) + "\n")
        r = run_supervise("--run-dir", str(run), "--logs", str(logs), bucket.url(prefix), "--", PY, "-c", writer,
                          str(logs), attempt, env=s3_server.env, timeout=60)
        assert r.returncode == 0, r.stderr[-2000:]
        sizes.append((logs / "train.log").stat().st_size)
    parts = bucket.log_parts(f"{prefix}/train.log")
    assert b"".join(d for _k, d in parts) == (logs / "train.log").read_bytes()
    assert max(len(d) for _k, d in parts) > 8 << 20
    assert _sent(run, 1)[0] == sizes[0]
    assert _sent(run, 2)[0] == sizes[1] - sizes[0]  # the second attempt sent only what it appended
    assert not [e for e in events(run / "events.jsonl", "log-restarted")]
    assert sorted(bucket.keys(prefix)) == [k for k, _d in parts]  # no attempt kept aside: nothing started over


def test_segments_left_without_their_log_are_removed_before_it_starts(bucket: Bucket, s3_server: S3Server,
                                                                     tmp_path: Path) -> None:
    logs, run, prefix = tmp_path / "logs", tmp_path / "run", "run1/logs"
    bucket.put(f"{prefix}/train.log.seg-00000001", b"a segment whose log is gone\n")  # a removal cut short
    r = run_supervise("--run-dir", str(run), "--logs", str(logs), bucket.url(prefix), "--", PY, "-c",
                      "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.mkdir(exist_ok=True); "
                      "(p / 'train.log').write_text('the new log\\n')", str(logs), env=s3_server.env, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert bucket.log(f"{prefix}/train.log") == b"the new log\n"
    assert sorted(bucket.keys(prefix)) == [f"{prefix}/train.log"]


def test_a_file_named_tfevents_that_is_not_tfrecord_goes_up_as_it_grows(bucket: Bucket, s3_server: S3Server,
                                                                       tmp_path: Path) -> None:
    logs, run, prefix = tmp_path / "logs", tmp_path / "run", "run1/logs"
    writer = ("import sys, time, pathlib\n"
              "p = pathlib.Path(sys.argv[1]); p.mkdir(exist_ok=True)\n"
              "with open(p / 'notes.tfevents.txt', 'w') as f:\n"
              "    for i in range(120):\n"
              "        f.write(f'line {i}: not a record\\n'); f.flush(); time.sleep(0.1)\n")
    r = run_supervise("--run-dir", str(run), "--logs", str(logs), bucket.url(prefix), "--", PY, "-c", writer, str(logs),
                      env=s3_server.env, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    local = (logs / "notes.tfevents.txt").read_bytes()
    assert bucket.log(f"{prefix}/notes.tfevents.txt") == local
    # while it was written (not only at the stop): its bytes were not held back as a record never whole
    while_written = sum(e["bytes"] for e in events(run / "events.jsonl", "sync") if not e["trigger"].startswith("flush"))
    assert while_written >= len(local) // 2, (while_written, len(local))
