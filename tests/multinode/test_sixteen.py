"""Issue 33: a 16-node job loses a node (the long set: SUPERVISE_LONG=1, about 3 minutes).

``scripts/slurm-up.sh ROOT --nodes 17``; a job over 16 of them (``bench/_scale_writer.py``: one process
per node, each node's shard of a DCP-shaped checkpoint on its own local disk every 3 s, node 0's
``.metadata`` last), with supervise starting its 15 node agents itself. Once two checkpoints are
published, n9 (node rank 8) dies with everything on it; Slurm marks it down and requeues the
job, which runs on the 16 nodes left (n9 out, n17 in) to its last step. On the way Slurm drains
the nodes above n9 in its step tree ("Kill task failed"); the test resumes them as an admin
would (docs/multinode.md, the failure table).

Checked: every agent of both attempts joined the leader's line (``node-agents`` ``linked``) and
was ready; every checkpoint on persistent storage holds all 16 shards and the marker; in the
second attempt every one of the 16 nodes restored the newest checkpoint published before the
death, its own shard intact; the attempt says n9 is gone (``node-lost``), and
``supervise report`` names it. The figures (agents' wait, publish latency after the last part)
are printed.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.journal import events
from tests.support.paths import ROOT
from tests.support.slurm import SlurmCluster, cluster_for_test
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")]

NODES, STEPS = 16, 14
WRITER = ROOT / "bench" / "_scale_writer.py"
SHARDS = {".metadata", *(f"__{k}_0.distcp" for k in range(NODES))}

JOB = """#!/bin/bash
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --requeue
#SBATCH --open-mode=append
cd {repo}
exec {python} -m supervisor --config {cfg} --run-dir {run} --gpu-every 0 -- \\
  srun --ntasks-per-node=1 {python} {writer} {local}/ckpt --barrier {shared}/barrier \\
  --progress {shared}/progress.jsonl --every 3 --saves {steps} --exit
"""


@pytest.fixture
def cluster17() -> Iterator[SlurmCluster]:
    yield from cluster_for_test(NODES + 1)


def published(c: SlurmCluster) -> dict[str, set[str]]:
    dst = c.shared / "persist" / "ckpt"
    return {d.name: {f.name for f in d.iterdir()} for d in dst.iterdir() if d.is_dir() and not d.name.startswith(".")} \
        if dst.exists() else {}


def test_a_sixteen_node_job_loses_a_node_and_resumes_on_the_nodes_left(cluster17: SlurmCluster, tmp_path: Path) -> None:
    c = cluster17
    run, progress = c.shared / "run", c.shared / "progress.jsonl"
    cfg = c.shared / "run.toml"
    cfg.write_text(f'[[sync]]\nname = "ckpt"\nfrom = "{c.local}/ckpt"\nto = "{c.shared}/persist/ckpt"\n'
                   f'nodes = {NODES}\nrestore = true\n')
    job = c.submit(JOB.format(nodes=NODES, repo=ROOT, python=sys.executable, cfg=cfg, run=run, writer=WRITER,
                              local=c.local, shared=c.shared, steps=STEPS), "-o", str(c.shared / "job.out"))
    leader = run / "events.jsonl"
    torn: list[str] = []

    def publishes(attempt: int) -> list[str]:
        torn.extend(f"{n}: {sorted(SHARDS - f)}" for n, f in published(c).items() if not SHARDS <= f)
        return [e["checkpoint"] for e in events(leader) if e.get("kind") == "publish" and e["attempt"] == attempt
                and not e.get("pointer")]

    def said() -> str:
        return f"job {c.state(job)}; {(c.shared / 'job.out').read_text()[-1500:] if (c.shared / 'job.out').exists() else ''}"

    t0 = time.monotonic()
    wait_for(lambda: len(publishes(1)) >= 2, 240, lambda: f"two publishes in attempt 1; {said()}", interval=0.5)
    assert c.hosts(job) == [f"n{i}" for i in range(1, NODES + 1)]
    before = max(publishes(1))
    print(f"sixteen: {time.monotonic() - t0:.1f}s {before} published; n9 dies", flush=True)
    c.kill_node("n9")
    if not c.wait_down("n9", 90):
        c.run("scontrol", "update", "NodeName=n9", "State=DOWN", "Reason=killed-by-the-test")
    resumed = _requeued_onto_the_nodes_left(c, job, leader)
    print(f"sixteen: {time.monotonic() - t0:.1f}s attempt 2 started; resumed by hand: {resumed or 'none'}", flush=True)
    wait_for(lambda: c.state(job) == "COMPLETED", 300, lambda: f"job {job} completed; {said()}", interval=0.5)
    print(f"sixteen: {time.monotonic() - t0:.1f}s completed", flush=True)

    ev = events(leader)
    starts = {e["attempt"]: e for e in ev if e.get("kind") == "start"}
    assert sorted(starts) == [1, 2], sorted(starts)
    assert "n9" not in starts[2]["nodes"] and "n17" in starts[2]["nodes"] and len(starts[2]["nodes"]) == NODES
    # every agent joined the leader's line, and was ready
    for a in (1, 2):
        agents = next(e for e in ev if e.get("kind") == "node-agents" and e["attempt"] == a)
        assert agents["missing"] == [] and agents["linked"] == list(range(1, NODES)), agents
    # every checkpoint on persistent storage is whole, and was never seen otherwise
    publishes(2)
    assert not torn, torn
    now = published(c)
    assert f"step_{STEPS:06d}" in now and all(f == SHARDS for f in now.values()), now
    # attempt 2: every node restored the newest checkpoint published before n9 died, its shard intact
    newest = max(e["checkpoint"] for e in ev if e.get("kind") == "publish" and e["attempt"] == 1 and not e.get("pointer"))
    assert newest >= before
    second = [p for p in map(json.loads, progress.read_text().splitlines()) if p["attempt"] == 2]
    assert sorted(p["node"] for p in second) == list(range(NODES)), second
    assert {p["restored"] for p in second} == {int(newest.split("_")[1])}, (newest, second)
    assert all(p["intact"] for p in second), second
    assert "n9" not in {p["host"] for p in second}
    # n9 is named: the journal's node-lost, and the report
    lost = [e for e in ev if e.get("kind") == "node-lost" and e["attempt"] == 2]
    assert [e["node"] for e in lost] == ["n9"] and lost[0]["index"] == 8, lost
    report = subprocess.run([sys.executable, "-m", "supervisor", "report", str(run)], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert report.returncode == 0 and "n9" in report.stdout, report.stdout + report.stderr
    _figures(ev, run)


def _requeued_onto_the_nodes_left(c: SlurmCluster, job: str, leader: Path, timeout: float = 240) -> list[str]:
    """Slurm requeues the job; this waits until its next attempt starts, doing what an admin
    does where Slurm drains a node on the way. A step's nodes report its end up a tree of them
    (slurmstepd's reverse tree): the nodes above the dead one there (seen: n2 and n1 above n9)
    wait for its report until UnkillableStepTimeout (60 s) and are then drained, "Kill task
    failed", and 15 nodes are too few. Returns the nodes resumed."""
    resumed: list[str] = []
    deadline = time.monotonic() + timeout
    while not any(e.get("kind") == "start" and e["attempt"] == 2 for e in events(leader)):
        if time.monotonic() > deadline:
            raise AssertionError(f"no attempt 2 after {timeout:.0f}s: {c.show(job).get('JobState')}; "
                                 f"{c.run('sinfo', '-N', '-o', '%N %T %E', check=False).stdout}")
        for line in c.run("sinfo", "-N", "-h", "-o", "%N|%T|%E", check=False).stdout.splitlines():
            node, state, reason = line.split("|", 2)
            if "Kill task failed" in reason and "drain" in state and node not in resumed:
                c.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
                resumed.append(node)
        if c.state(job) == "PENDING":
            c.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)
        time.sleep(2.0)
    return resumed


def _figures(ev: list[dict[str, Any]], run: Path) -> None:
    """What 16 nodes cost: the agents' wait and readiness, and each publish after its last part."""
    parts: dict[tuple[int, str], list[float]] = {}
    for j in [run / "events.jsonl", *sorted((run / "nodes").glob("node-*/events.jsonl"))]:
        for e in events(j):
            if e.get("kind") == "part":
                parts.setdefault((e["attempt"], e["checkpoint"]), []).append(e["t"])
    after = [e["t"] - max(parts[(e["attempt"], e["checkpoint"])]) for e in ev
             if e.get("kind") == "publish" and not e.get("pointer") and len(parts.get((e["attempt"], e["checkpoint"]), [])) == NODES]
    for e in ev:
        if e.get("kind") == "node-agents":
            ready = list(e["ready_s"].values())
            print(f"sixteen: attempt {e['attempt']}: agents waited for {e['seconds']:.2f}s, ready p50 "
                  f"{statistics.median(ready):.2f}s max {max(ready):.2f}s, {len(e['linked'])} on the line", flush=True)
    assert after, "no publish with all 16 parts journaled"
    print(f"sixteen: publish after the last part: p50 {statistics.median(after):.2f}s max {max(after):.2f}s "
          f"over {len(after)} checkpoints", flush=True)
