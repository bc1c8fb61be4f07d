"""Issue 43 on the multi-node cluster: a byte flipped in a node's own copy, in its partner's
copy, and in the persistent copy is detected, journaled, and never loaded; the training
resumes from good bytes, of the same version while any copy of it verifies, else of the one
before it on every node.

``train_dcp.py`` under ``srun torchrun --nnodes 2 --nproc-per-node 2`` on n1 and n2, every
rank's DCP shard on its own node's disk, the checkpoints' persistent side a directory on
shared storage, the ring on (each node's part copied to the other node's disk). Three times,
the test holds the training still (``--hold``: no rank takes a step), waits until the newest
checkpoint is published and both nodes' rings copied it, requeues the job (``scontrol
requeuehold``: onto the same nodes, their disks kept, unless the test excludes them), and while
it waits in the queue flips one byte of rank 0's shard (size and mtime kept):

1. in node 0's own copy (n1's disk): the leader's restore finds it does not hash to the
   manifest (``restore-verify`` ``failed``: ``live``) and takes that file from its partner's
   copy on n2 (``node-1-copy``), nothing from persistent storage;
2. in node 0's own copy and in the partner's copy on n2: both fail, and the file comes from
   persistent storage;
3. in the persistent copy, the job requeued onto n3 and n4, new nodes with nothing on their
   disks: node 0 can verify no copy of its shard (``restore-verify`` ``failed``:
   ``persistent``) and restores nothing; the leader chooses again without that checkpoint
   (``restore-choice`` ``excluded``, ``restore-versions`` ``rounds`` 2), and every node
   restores the one before it.

Each time every rank resumes from the checkpoint restored (the training's own "start" line),
and the job's final weights equal an uninterrupted run's, bit for bit: no flipped byte was
loaded. The long set (2 minutes here):

    SUPERVISE_LONG=1 .venv/bin/python -m pytest -q -s tests/multinode/test_flipped_bytes.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.multinode._dcp_job import JOB
from tests.multinode.train_dcp import reference
from tests.support.journal import events
from tests.support.node_mirrors import flip
from tests.support.paths import ROOT
from tests.support.slurm import SlurmCluster
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")]

STEPS, EVERY = 60, 5
SHARD = "__0_0.distcp"  # rank 0's shard: node 0's part


def test_a_flipped_byte_in_a_nodes_copy_and_its_partners_is_never_loaded(cluster4: SlurmCluster, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    c = cluster4
    t0 = time.monotonic()
    run, progress, final, out = c.shared / "run", c.shared / "progress.jsonl", c.shared / "final.pt", c.shared / "job.out"
    hold = c.shared / "hold"
    cfg = c.shared / "run.toml"
    cfg.write_text(f'[[sync]]\nname = "ckpt"\nfrom = "{c.local}/ckpt"\nto = "{c.shared}/persist/ckpt"\n'
                   'nodes = "auto"\nsettle = "1s"\nrestore = true\n')
    script = JOB.format(repo=ROOT, python=sys.executable, cfg=cfg, run=run,
                        torchrun=Path(sys.executable).parent / "torchrun", train=Path(__file__).parent / "train_dcp.py",
                        local=c.local, steps=STEPS, every=EVERY, progress=progress, final=final)
    script = script.replace("--final ", f"--hold {hold} --final ")
    job = c.submit(script, "-o", str(out))
    leader, node1 = run / "events.jsonl", run / "nodes" / "node-1" / "events.jsonl"

    def log(what: str) -> None:
        print(f"flipped: {time.monotonic() - t0:.1f}s {what}", flush=True)

    def said() -> str:
        return f"job {c.state(job)}; {out.read_text()[-3000:] if out.exists() else ''}"

    def lines(what: str) -> list[dict]:
        return [e for e in map(json.loads, progress.read_text().splitlines())
                if e["what"] == what] if progress.exists() else []

    def of(journal: Path, kind: str, attempt: int) -> list[dict]:
        return [e for e in events(journal) if e.get("kind") == kind and e.get("attempt") == attempt]

    def held_and_copied(attempt: int) -> str:
        """Hold the training; once its newest checkpoint is published and copied by both
        rings, requeue the job onto the same nodes and return that checkpoint's name."""
        wait_for(lambda: len(of(leader, "publish", attempt)) >= 2, 300,
                 lambda: f"2 checkpoints published in attempt {attempt}; {said()}", interval=0.5)
        hold.touch()
        time.sleep(2.0)  # a step under way ends, and its save with it
        newest = f"step_{lines('saved')[-1]['step']:05d}"
        for journal, kind in ((leader, "publish"), (leader, "peer-copy"), (node1, "peer-copy")):
            wait_for(lambda: newest in {e.get("checkpoint") for e in of(journal, kind, attempt)}, 60,
                     lambda: f"{kind} of {newest} in {journal}; {said()}", interval=0.3)
        restarts = int(c.show(job).get("Restarts", "0"))
        c.run("scontrol", "requeuehold", job)
        wait_for(lambda: of(leader, "end", attempt) and int(c.show(job).get("Restarts", "0")) > restarts
                 and c.state(job) == "PENDING", 120, lambda: f"attempt {attempt} ended and requeued; {said()}", interval=0.5)
        log(f"attempt {attempt} held at {newest} and requeued")
        return newest

    def resume(attempt: int, off: str = "") -> dict:
        hold.unlink()
        if off:
            c.run("scontrol", "update", f"JobId={job}", f"ExcNodeList={off}")
        c.run("scontrol", "release", job)
        c.release(job)
        wait_for(lambda: len(lines("start")) >= attempt, 300, lambda: f"attempt {attempt} started; {said()}", interval=0.5)
        return lines("start")[attempt - 1]

    def verified(attempt: int, name: str) -> dict:
        choice = of(leader, "restore-choice", attempt)[-1]
        assert choice["checkpoint"] == name, (choice, name)
        got = [e for e in of(leader, "restore-verify", attempt) if e["checkpoint"] == name]
        assert got and got[-1]["result"] == "verified", got
        return got[-1]

    live, partner = c.node_local("n1") / "ckpt", c.node_local("n2") / "ckpt" / ".supervise-peer" / "node-0"

    # 1. node 0's own copy
    first = held_and_copied(1)
    flip(live / first / SHARD)
    start = resume(2)
    assert start["step"] == int(first.split("_")[1]) and Path(start["restored"]).name == first, start
    v = verified(2, first)
    assert [(f["from"], f["file"]) for f in v["failed"]] == [("live", SHARD)] and "sha256" in v["failed"][0]["why"], v
    assert v["from"].get("node-1-copy", 0) > 0 and "persistent" not in v["from"], v
    log(f"1: {first}: the flipped live shard failed, taken from n2's copy ({v['from']})")

    # 2. node 0's own copy and its partner's
    second = held_and_copied(2)
    assert second > first, (first, second)
    flip(live / second / SHARD)
    flip(partner / second / SHARD)
    start = resume(3)
    assert start["step"] == int(second.split("_")[1]) and Path(start["restored"]).name == second, start
    v = verified(3, second)
    assert sorted((f["from"], f["file"]) for f in v["failed"]) == [("live", SHARD), ("node-1-copy", SHARD)], v
    assert v["from"].get("persistent", 0) > 0, v
    log(f"2: {second}: the flipped live shard and n2's flipped copy failed, taken from persistent ({v['from']})")

    # 3. the persistent copy, on new nodes (nothing on their disks): node 0 can verify no copy
    # of its shard, so the leader chooses again without that checkpoint, and every rank
    # resumes from the one before it
    third = held_and_copied(3)
    assert third > second, (second, third)
    persistent = c.shared / "persist" / "ckpt"
    flip(persistent / third / SHARD)
    start = resume(4, off="n1,n2")
    assert c.hosts(job) == ["n3", "n4"], c.hosts(job)
    before = f"step_{int(third.split('_')[1]) - EVERY:05d}"
    assert start["step"] == int(before.split("_")[1]) and Path(start["restored"]).name == before, (start, before)
    choices = of(leader, "restore-choice", 4)
    assert [(e["checkpoint"], e.get("excluded")) for e in choices] == [(third, None), (before, [third])], choices
    bad = [e for e in of(leader, "restore-verify", 4) if e["result"] == "failed"]
    assert [(e["checkpoint"], [(f["from"], f["file"]) for f in e["failed"]]) for e in bad] \
        == [(third, [("persistent", SHARD)])], bad
    assert verified(4, before)["from"].get("persistent", 0) > 0
    versions = next(e for e in events(leader) if e.get("kind") == "restore-versions" and e["attempt"] == 4)
    assert versions["agree"] and versions["rounds"] == 2 and versions["choice"] == {"ckpt": before}, versions
    log(f"3: {third}: the flipped persistent shard failed on new nodes; every rank resumed from {before}")

    wait_for(lambda: c.state(job) == "COMPLETED", 300, lambda: f"job {job} completed; {said()}", interval=0.5)
    ends = {e["attempt"]: e for e in events(leader) if e.get("kind") == "end"}
    assert ends[4]["reason"] == "child-exit" and ends[4]["not_durable"] == [], ends[4]
    assert torch.equal(torch.load(final), reference(STEPS))
    log("completed; final weights equal the reference")
