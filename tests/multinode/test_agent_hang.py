"""A node's agent hangs (SIGSTOP): the long set (SUPERVISE_LONG=1, a minute or two).

The 2-node torchrun DCP job on n1+n2; once a checkpoint is published, node 1's agent (on n2)
is stopped with SIGSTOP. The training goes on writing checkpoints; the leader waits for node
1's parts (`parts-waiting` names node 1), publishes nothing partial, and when the job is
cancelled its stop ends within Slurm's KillWait with `end.not_durable` naming node 1 for
each checkpoint it could not publish.

    SUPERVISE_LONG=1 .venv/bin/python -m pytest -q -s tests/multinode/test_agent_hang.py
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.multinode.conftest import Cluster, events, wait_for
from tests.multinode.test_bar import SHARDS, published, submit_job

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")]


def agent_pids(c: Cluster, node: str) -> list[int]:
    out = []
    for pid in subprocess.run(["ip", "netns", "pids", f"{c.pfx}-{node}"], capture_output=True, text=True).stdout.split():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"node-agent" in cmd and b"srun" not in cmd[0]:
            out.append(int(pid))
    return out


def test_a_hung_agent_holds_publishing_back_and_is_named(cluster3: Cluster, tmp_path: Path) -> None:
    c = cluster3
    job, run, _progress, _final = submit_job(c)
    leader = run / "events.jsonl"
    wait_for(lambda: any(e.get("kind") == "publish" for e in events(leader)), 180, lambda: f"a publish; job {c.state(job)}")
    hung = wait_for(lambda: agent_pids(c, "n2"), 10, "node 1's agent on n2")
    for pid in hung:
        os.kill(pid, signal.SIGSTOP)
    before = set(published(c))
    waits = wait_for(lambda: [e for e in events(leader) if e.get("kind") == "parts-waiting"
                              and e["checkpoint"] not in before and e["missing"] == [1]], 120, "a checkpoint waiting for node 1")
    c.run("scancel", job)
    wait_for(lambda: any(e.get("kind") == "end" for e in events(leader)), 60, "the leader's end")
    for pid in hung:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    ev = events(leader)
    end = next(e for e in ev if e.get("kind") == "end")
    assert set(published(c)) == before, "nothing published while node 1's agent hung"
    assert all(files == SHARDS for files in published(c).values())
    assert any(f"{waits[0]['checkpoint']} (waiting for parts: node 1 missing)" in x for x in end["not_durable"]), end
    stop = [e for e in ev if e.get("kind") == "stop-step"]
    assert sum(float(e.get("seconds") or 0) for e in stop) < 5.0 + 2.0, stop  # within KillWait (5 s) and a margin
    shutil.copytree(run, tmp_path / "run")
