"""Issue 42, 12: the report never invents a local-only checkpoint on a node that held no part.

The story: a 2-node Slurm job whose per-node pair is a single ``torch.save`` file that only
global rank 0 writes (the DDP tutorial's ``snapshot.pt``): every version is published
``whole on node 0``, and node 1's agent staged nothing. Node 1 then dies; the leader's last
flush gets no answer from it, so ``end.not_durable`` says "node 1 (n2): Slurm calls it
DOWN+NOT_RESPONDING; its newest part may be missing". The report read that as a checkpoint
left on node 1's local disk ("ONLY ON LOCAL DISK", "Copy it by hand before the node is
cleaned"), though node 1 never held any part. The journals are planted in the shape such a
run writes them (supervisor/conduct/fleet.py's line, sync/_assembly.py's ``publish``, a node
agent's ``node-start`` and its passes that copied nothing); the report runs as the real CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000.0
DOWN = "node 1 (n2): Slurm calls it DOWN+NOT_RESPONDING; its newest part may be missing"
SILENT = "node 1: did not answer the final flush in 22.5s; its newest part may be missing"
PAIR = {"name": "ckpt", "kind": "checkpoint", "from": "/local/ckpt", "to": "/scratch/run/ckpt", "nodes": 2,
        "settle": 30.0, "profile": "torch-save", "restore": True, "markers": [], "exclude": [], "fsync": False}


def ev(t: float, kind: str, **kw: object) -> str:
    return json.dumps({"v": 1, "t": T0 + t, "attempt": 1, "kind": kind, **kw}) + "\n"


def plant(run: Path, line: str, node1_extra: list[str] = ()) -> None:
    node1 = run / "nodes" / "node-1"
    node1.mkdir(parents=True)
    leader = [
        ev(0, "start", host="n1", nodes=["n1", "n2"], job_id="7", scheduler="slurm", restart_count=0,
           command=["srun", "python", "multinode.py"], launcher="srun"),
        ev(0.1, "sync-start", backend="rsync", pairs=[{k: PAIR[k] for k in ("name", "kind", "from", "to", "nodes")}]),
        ev(0.9, "node-agents", started=True, nodes=["n1", "n2"], pid=99, ready=[1], ready_s={"1": 0.7}, missing=[],
           seconds=0.8, linked=[1]),
        ev(1.0, "spawn", pid=100, pgid=100, argv=["srun", "python", "multinode.py"], launcher="srun", restart=0),
    ]
    for i, t in enumerate((60.0, 120.0, 180.0)):
        leader.append(ev(t, "publish", pair="ckpt", checkpoint="snapshot.pt", trigger="watch", files=1,
                         bytes=45_000_000 + i, why="whole on node 0", lag_s=0.8, nodes=2, parts={"0": 1}, shared=[],
                         linked=False))
        leader.append(ev(t + 0.1, "sync", pair="ckpt", trigger="watch", files=1, bytes=45_000_000 + i, seconds=0.7,
                         published=["snapshot.pt"], backend="rsync"))
    leader += [
        ev(200, "signal", signal="SIGTERM", action="stop", reason="preempted"),
        ev(200.1, "stop", reason="preempted", detail="SIGTERM", signal="SIGTERM", time_left_s=3000),
        ev(230, "nodes-flush", request="f1", nodes=[1], reason="final"),
        ev(252.5, "stop-step", step="final-flush", seconds=22.5, outcome="done", pairs={}, pending=[line]),
        ev(253, "end", reason="preempted", detail="SIGTERM", exit_status=143, launcher_status=143, seconds=253,
           not_durable=[line]),
    ]
    node = [
        ev(0.5, "node-start", node=1, nodes=2, host="n2", pid=200, argv=["supervise", "node-agent"], backend="rsync",
           pairs=[PAIR], settings={"sync_every": 60.0}),
        ev(2.0, "node-training", node=1, state="running", processes=1),
        ev(2.1, "sync", pair="ckpt", trigger="start", files=0, bytes=0, seconds=0.01, published=[], backend="rsync"),
        *node1_extra,
    ]  # no end: the node died with its agent
    (run / "events.jsonl").write_text("".join(leader))
    (node1 / "events.jsonl").write_text("".join(node))


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "report", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"})


@pytest.mark.parametrize("line", [DOWN, SILENT], ids=["called-down", "no-answer"])
def test_a_dead_node_that_held_no_part_leaves_nothing_only_on_local_disk(tmp_path: Path, line: str) -> None:
    run = tmp_path / "run"
    plant(run, line)
    out = report(str(run))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "ONLY ON LOCAL DISK" not in text and "Copy it by hand" not in text, text
    assert "only on local disk: nothing" in text, text
    # what did happen is still said, on the node's row: it did not answer, and it held no part
    n2 = text.split("\nNodes", 1)[1].split("node n2", 1)[1].split("\n\n", 1)[0]
    assert "held no part of any checkpoint" in n2, n2
    js = json.loads(report(str(run), "--json").stdout)
    assert js["checkpoints"]["not_durable"] == [] and js["verdict"]["local_only"] is None, js["verdict"]


def test_a_dead_node_that_staged_a_part_is_still_named_only_on_local_disk(tmp_path: Path) -> None:
    """The other side of the rule: node 1's journal says it staged a part of its own (a
    checkpoint of every node's parts), so its newest part may well be on its disk alone."""
    run = tmp_path / "run"
    plant(run, DOWN, [ev(150, "part", pair="ckpt", checkpoint="snapshot.pt", node=1, nodes=2, trigger="watch",
                         files=1, bytes=100, why="complete", lag_s=0.5)])
    out = report(str(run))
    assert out.returncode == 0, out.stderr
    assert "ONLY ON LOCAL DISK" in out.stdout and "Copy it by hand" in out.stdout, out.stdout
    js = json.loads(report(str(run), "--json").stdout)
    assert js["checkpoints"]["not_durable"] == [DOWN]
