"""Issue 22, item 1: every step of a stop fits the time the stop has, even when the
persistent storage hangs (a stale NFS/Lustre mount: a copier that never returns)."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

from supervisor import policy
from supervisor.journal import read_journal
from tests.support.paths import HELPERS
from tests.support.supervise import start_supervise
from tests.support.wait import wait_for

TRAINER = [sys.executable, str(HELPERS / "trainer.py")]
HUNG_RSYNC = """#!/bin/sh
case "$1" in --version) echo 'rsync  version 3.2.7  protocol version 31'; exit 0;; esac
exec sleep 100000
"""


def test_stop_budget_is_the_end_else_the_kill_delay_else_the_default() -> None:
    assert policy.stop_budget(end=1000.0, kill_wait=30.0, now=990.0) == 10.0
    assert policy.stop_budget(end=None, kill_wait=12.0, now=0.0) == 12.0
    assert policy.stop_budget(end=None, kill_wait=None, now=0.0) == policy.STOP_BUDGET == 30.0
    # Before any stop, or in one with no budget (a hang) and no end known, nothing bounds it.
    assert policy.time_left(end=None, kill=None, lead=0, kill_wait=None, now=0.0) == math.inf
    # A signalled stop with no known end: the budget, less what has passed and a few seconds kept.
    assert policy.time_left(end=None, kill=None, lead=0, kill_wait=None, now=0.0, signalled_for=10.0) == 15.0
    assert policy.time_left(end=None, kill=None, lead=0, kill_wait=None, now=0.0, signalled_for=40.0) == 0.0


def test_a_hung_copier_does_not_outlive_the_stop_budget(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rsync").write_text(HUNG_RSYNC)
    (bin_dir / "rsync").chmod(0o755)
    run, local, persist = tmp_path / "run", tmp_path / "local", tmp_path / "persist"
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--checkpoint-timeout", "5s",
                        "--grace", "3", "--gpu-every", "0", "--", *TRAINER, str(local), "--every", "20",
                        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    try:
        wait_for(lambda: list(local.glob("step_*/.metadata")), timeout=60, what="a first local checkpoint")
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=policy.STOP_BUDGET + 30)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    events = read_journal(run).events
    end = [e for e in events if e["kind"] == "end"]
    assert end, f"no end event: {err[-2000:]}"
    assert took < policy.STOP_BUDGET + 5, f"the stop took {took:.1f}s, more than its {policy.STOP_BUDGET:g}s budget"
    assert any("step_000020" in line for line in end[0]["not_durable"]), end[0]
    steps = {e["step"]: e for e in events if e["kind"] == "stop-step"}
    assert steps["flush"]["outcome"] == "timeout" and steps["final-flush"]["outcome"] in ("timeout", "no-time")
