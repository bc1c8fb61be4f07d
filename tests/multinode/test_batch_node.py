"""The batch node dies (the leader with it): the long set (SUPERVISE_LONG=1, a few minutes).

A 2-node torchrun DCP job on n1+n2 of a 3-node cluster; once checkpoints are published, n1
(the batch node: the leader, node 0, and ranks 0-1) is killed with every process in its
namespaces and its local disk. Slurm marks it down and requeues the job; the next attempt
runs on n2+n3, restores the newest published checkpoint onto both, and finishes with the
uninterrupted run's weights. The journal has no `end` for attempt 1 (the leader was
SIGKILLed), `node-lost` names n1, and `supervise report` tells it.

    SUPERVISE_LONG=1 .venv/bin/python -m pytest -q -s tests/multinode/test_batch_node.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.multinode._dcp_job import SHARDS, STEPS, published, submit_job
from tests.multinode.train_dcp import reference
from tests.support.journal import events
from tests.support.slurm import NODES_POLL, SlurmCluster
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")]


def test_batch_node_dies(cluster3: SlurmCluster, tmp_path: Path) -> None:
    c = cluster3
    job, run, progress, final = submit_job(c)
    leader = run / "events.jsonl"
    wait_for(lambda: len([e for e in events(leader) if e.get("kind") == "publish"]) >= 2, 180,
             lambda: f"two publishes; job {c.state(job)}", interval=NODES_POLL)
    assert c.show(job)["NodeList"] == "n[1-2]"
    c.kill_node("n1")
    wait_for(lambda: c.is_down("n1"), 180, lambda: f"n1 down: {c.node_state('n1')}", interval=NODES_POLL)
    wait_for(lambda: c.state(job) in ("PENDING", "REQUEUED"), 120, lambda: f"requeued: {c.state(job)}", interval=NODES_POLL)
    c.release(job)
    wait_for(lambda: c.state(job) == "COMPLETED", 300, lambda: f"job {job} completed; {c.state(job)}", interval=0.5)

    ev = events(leader)
    starts = {e["attempt"]: e for e in ev if e.get("kind") == "start"}
    assert [starts[a]["nodes"] for a in sorted(starts)] == [["n1", "n2"], ["n2", "n3"]]
    assert not any(e.get("kind") == "end" and e["attempt"] == 1 for e in ev)  # the leader died with n1
    now = published(c)
    assert now and all(files == SHARDS for files in now.values()), now
    restore = next(e for e in ev if e.get("kind") == "restore" and e["attempt"] == 2)
    assert restore["checkpoint"] == max(e["checkpoint"] for e in ev if e.get("kind") == "publish" and e["attempt"] == 1)
    torch = pytest.importorskip("torch")
    assert torch.equal(torch.load(final), reference(STEPS))
    lost = [e for e in ev if e.get("kind") == "node-lost"]
    assert [(e["attempt"], e["node"], e["index"]) for e in lost] == [(2, "n1", 0)], lost
    report = subprocess.run([sys.executable, "-m", "supervisor", "report", str(run)], capture_output=True, text=True,
                            timeout=60)
    assert "node n1" in report.stdout and "attempt 2" in report.stdout, report.stdout
    shutil.copytree(run, tmp_path / "run")
