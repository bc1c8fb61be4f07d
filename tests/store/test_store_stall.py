"""Issue 42, 15: a hung object store is journaled and notified while it hangs, not only when its
requests time out (120 s). The real SeaweedFS is stopped (SIGSTOP: connections are accepted,
nothing answers), as in test_store.py's hung-endpoint test; the directory case is
tests/hostile/test_sync_stall.py. docs/sync.md, "Stalls"."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from tests.support.journal import events
from tests.support.s3 import S3Server
from tests.support.supervise import killed_on_exit, start_supervise
from tests.support.wait import wait_for
from tests.support.webhook import Server

TRAINER = Path(__file__).parents[1] / "helpers" / "trainer.py"
HUNG_S = 20  # the outage of the issue: it showed only as a 20.5 s lag_s afterwards


def _of(run: Path, kind: str) -> list[dict]:
    return [e for e in events(run / "events.jsonl") if e.get("kind") == kind]


def test_a_stopped_store_is_journaled_and_notified_as_stalled_then_resumed(s3_own: S3Server, tmp_path: Path,
                                                                          server: Server) -> None:
    bucket = s3_own.make_bucket("stall")
    local, run = tmp_path / "local", tmp_path / "run"
    p = start_supervise("--run-dir", str(run), "--grace", "5s", "--checkpoints", str(local), bucket.url("ckpt"),
                        "--notify", server.url("ok"),
                        "--", sys.executable, str(TRAINER), str(local), "--every", "10", "--step-time", "0.05",
                        env=s3_own.env)
    pid = int((s3_own.root / "weed.pid").read_text())
    with killed_on_exit(p):
        wait_for(lambda: _of(run, "publish"), 60, "the first publish")
        os.kill(pid, signal.SIGSTOP)  # the endpoint hangs: connections open, nothing answers
        stopped_at = time.time()
        try:
            stalled = wait_for(lambda: _of(run, "sync-stalled"), 30, "sync-stalled while the store hangs")[0]
            time.sleep(max(0.0, stopped_at + HUNG_S - time.time()))
            assert not _of(run, "sync-resumed")  # still hung: no word of it moving
        finally:
            os.kill(pid, signal.SIGCONT)
        resumed = wait_for(lambda: _of(run, "sync-resumed"), 60, "sync-resumed once the store answers")[0]
        wait_for(lambda: any(e["t"] > resumed["t"] for e in _of(run, "publish")), 60, "a publish after it")
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=120)
    delay = stalled["t"] - stopped_at
    print(f"sync-stalled {delay:.1f} s after SIGSTOP of the store; resumed {resumed['t'] - stopped_at:.1f} s after it"
          f" (stalled_s {resumed['stalled_s']}, {resumed['how']})")
    assert 10 <= delay < 15, delay  # 10 s without progress, from the first request the hung store took
    assert any(w.startswith(f"s3://{bucket.name}/ckpt/") for w in stalled["in_flight"]), stalled
    assert stalled["pair"] == resumed["pair"] == local.name
    assert resumed["stalled_s"] >= HUNG_S - 4, resumed
    assert not [e for e in _of(run, "sync-failed") if e["t"] < resumed["t"]]  # nothing failed yet: only the stall said it
    notified = {json.loads(r["body"])["event"] for r in server.hits("ok")}
    assert {"sync-stalled", "sync-resumed"} <= notified, notified


def test_a_store_that_does_not_answer_at_the_start_is_a_warning_not_a_wrong_configuration(
        s3_own: S3Server, tmp_path: Path) -> None:
    """A requeue or a spare's attempt must not die of a hung store (issue 43: what it does not
    take waits on the nodes' disks): the start's probe gives up after its bound and says so;
    a store that refuses (a wrong key, no bucket) is still exit 2 (tests/store/test_store_errors.py)."""
    bucket = s3_own.make_bucket("hungstart")
    local, run = tmp_path / "local", tmp_path / "run"
    pid = int((s3_own.root / "weed.pid").read_text())
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        p = start_supervise("--run-dir", str(run), "--grace", "5s", "--checkpoints", str(local), bucket.url("ckpt"),
                            "--", sys.executable, str(TRAINER), str(local), "--steps", "3", "--step-time", "0.05",
                            env=s3_own.env)
        with killed_on_exit(p):
            started = wait_for(lambda: _of(run, "spawn"), 120, "the training started while the store hangs")[0]
            p.send_signal(signal.SIGTERM)
            _out, err = p.communicate(timeout=120)
    finally:
        os.kill(pid, signal.SIGCONT)
    took = started["t"] - (time.time() - (time.monotonic() - t0))
    print(f"spawned {took:.1f} s after the start with the store hung")
    assert "does not answer" in err and "starting anyway" in err, err[-2000:]
    assert took < 60, took
