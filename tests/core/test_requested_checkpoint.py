"""Issue 22, item 7: the answer to a checkpoint request is a checkpoint that *started* after
the request, never a periodic save already being written when it came."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from supervisor import policy
from supervisor.journal import read_journal
from tests.support.paths import HELPERS
from tests.support.supervise import killed_on_exit, start_supervise
from tests.support.wait import wait_for

TRAINER = [sys.executable, str(HELPERS / "trainer.py")]


def test_started_after_request_refuses_what_was_being_written() -> None:
    writing = frozenset({("step_000040", 11)})
    assert not policy.started_after_request(("step_000040", 11), writing)
    assert not policy.started_after_request(("checkpoint-40", 11), writing), "renamed into place: same inode"
    assert policy.started_after_request(("step_000041", 12), writing)
    assert policy.started_after_request(None, writing), "no identity (a multi-node part): no evidence against"


def _in_progress(local: Path, *, after: int) -> Path | None:
    """A periodic save past step ``after`` that is being written (no marker yet)."""
    for d in sorted(local.glob("step_*")):
        if int(d.name.split("_")[1]) > after and not (d / ".metadata").exists():
            return d
    return None


def test_a_periodic_save_under_way_does_not_answer_the_stop_request(tmp_path: Path) -> None:
    run, local, persist = tmp_path / "run", tmp_path / "local", tmp_path / "persist"
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--grace", "10s",
                        "--checkpoint-timeout", "40s", "--gpu-every", "0", "--",
                        *TRAINER, str(local), "--every", "40", "--write-time", "3")
    with killed_on_exit(p):
        wait_for(lambda: (local / "step_000040" / ".metadata").exists(), timeout=60, what="a first periodic save")
        writing = wait_for(lambda: _in_progress(local, after=40), timeout=60, what="the next periodic save under way")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=90)
    events = read_journal(run).events
    steps = {e["step"]: e for e in events if e["kind"] == "stop-step"}
    ck = steps["checkpoint"]
    assert ck["outcome"] == "published", ck
    # The answer (begun after the request) was durable before the training was stopped.
    stop_child_began = steps["stop-child"]["t"] - steps["stop-child"]["seconds"]
    later = [e for e in events if e["kind"] == "publish" and not e.get("pointer") and e["checkpoint"] > writing.name]
    assert later and later[0]["t"] < stop_child_began, (later, stop_child_began, out)
    assert writing.name in ck["in_progress"], ck
    assert ck["answer"] != writing.name, f"{writing.name} was being written at the request: {ck}"
