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
