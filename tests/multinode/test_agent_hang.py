"""A node's agent hangs (SIGSTOP): the long set (SUPERVISE_LONG=1, a minute or two).

The 2-node torchrun DCP job on n1+n2; once a checkpoint is published, node 1's agent (on n2)
is stopped with SIGSTOP. The training goes on writing checkpoints; the leader waits for node
1's parts (`parts-waiting` names node 1) and publishes nothing without them. Slurm's cancel
sends SIGCONT with its SIGTERM (the agent resumes for the stop); the stop ends within
KillWait and every published checkpoint is whole.

    SUPERVISE_LONG=1 .venv/bin/python -m pytest -q -s tests/multinode/test_agent_hang.py
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.multinode._dcp_job import SHARDS, published, submit_job
from tests.support.journal import events
from tests.support.slurm import NODES_POLL, SlurmCluster
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")]


def test_a_hung_agent_holds_publishing_back_and_is_named(cluster3: SlurmCluster, tmp_path: Path) -> None:
    c = cluster3
    job, run, _progress, _final = submit_job(c)
    leader = run / "events.jsonl"
    wait_for(lambda: any(e.get("kind") == "publish" for e in events(leader)), 180, lambda: f"a publish; job {c.state(job)}",
             interval=NODES_POLL)
    hung = wait_for(lambda: c.agent_pids("n2"), 10, "node 1's agent on n2", interval=NODES_POLL)
    for pid in hung:
        os.kill(pid, signal.SIGSTOP)
    stopped = time.time()
    victim = wait_for(lambda: next((e["checkpoint"] for e in events(leader) if e.get("kind") == "parts-waiting"
                                    and e["t"] > stopped + 0.5 and e["missing"] == [1]), None), 120,
                      "a checkpoint written after the stop, waiting for node 1", interval=NODES_POLL)
    time.sleep(3.0)  # well past the lag of a healthy node (0.2-1 s here)
    assert victim not in published(c), "published without node 1's part"
    assert c.state(job) == "RUNNING"
    # Slurm's cancel sends SIGCONT with its SIGTERM: the agent resumes for the stop, which must
    # still end within KillWait, publishing only whole checkpoints.
    c.run("scancel", job)
    wait_for(lambda: any(e.get("kind") == "end" for e in events(leader)), 60, "the leader's end", interval=NODES_POLL)
    ev = events(leader)
    assert all(files == SHARDS for files in published(c).values()), published(c)
    stop = [e for e in ev if e.get("kind") == "stop-step"]
    assert sum(float(e.get("seconds") or 0) for e in stop) < 5.0 + 2.0, stop  # within KillWait (5 s) and a margin
    # node 1's GPU and host samples reach the run directory, beside its journal
    node1_dir = run / "nodes" / "node-1"
    # (the agent, resumed by the cancel's SIGCONT, flushes its last batch as it ends: after the leader's end)
    wait_for(lambda: (node1_dir / "host.csv").exists(), 15, lambda: f"node 1's host.csv: {sorted(x.name for x in node1_dir.iterdir())}", interval=NODES_POLL)
    assert any(e.get("kind") in ("gpu-start", "gpu-none") for e in events(node1_dir / "events.jsonl"))
    shutil.copytree(run, tmp_path / "run")
