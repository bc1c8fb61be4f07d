"""Issue 43's ring on the multi-node cluster: a DCP node's shards survive its death while the
persistent side is down, from the copy its partner took while the training ran.

``train_dcp.py`` under ``srun torchrun --nnodes 2 --nproc-per-node 2`` on 3 nodes, one a spare
(``spare_nodes = 1``, ``--no-kill``), every rank's DCP shard on its own node's local disk, the
checkpoints' persistent side an object store (SeaweedFS on the cluster's network). Once two
checkpoints are published the store hangs (SIGSTOP: connections accepted, nothing answers);
the training goes on saving on the nodes' disks, and each node's ring copies its part to the
other node. Then n2 (node 1, not the batch node) dies, and with it the only original of its
ranks' shards of every checkpoint saved since the store hung. In the attempt on the spare:

* the leader chooses a checkpoint saved while the store hung, whole across n1's own part and
  n1's copy of node 1's part (``restore-choice``: ``source`` ``nodes``, a ``0/1`` holder), at
  least the newest one node 1 had copied before it died, and newer than any published;
* the spare (node 1 now) takes its shards from n1's copy, verified (``restore-verify``);
* every rank resumes from it (the training's own "start" line names the step);
* once the store answers again the job completes, and its final weights equal an
  uninterrupted run's, bit for bit.

The same with a directory pair whose destination refuses every write from then until the
spare's training runs (``chattr -R +i``: a filesystem at quota, a read-only remount): the
versions saved meanwhile are published once it takes writes again.

Without the ring node 1's part of those checkpoints dies with n2, and the attempt resumes from
the last published one (this test fails). The long set (about 4 minutes):

    SUPERVISE_LONG=1 .venv/bin/python -m pytest -q -s tests/multinode/test_ring_nodes.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.multinode._dcp_job import JOB
from tests.multinode.train_dcp import reference
from tests.support.journal import events
from tests.support.paths import ROOT
from tests.support.s3 import on_cluster, skip_without_s3
from tests.support.slurm import SlurmCluster
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")]

STEPS, EVERY = 60, 5


class Refusing:
    """The directory pair's destination refuses every write while paused: ``chattr -R +i``
    (immutable: not even root creates an entry in it; every node sees it, as a filesystem at
    quota or a read-only remount would be seen)."""

    def __init__(self, where: Path) -> None:
        self.where = where

    def pause(self) -> None:
        subprocess.run(["chattr", "-R", "+i", str(self.where)], check=True, capture_output=True)

    def resume(self) -> None:
        subprocess.run(["chattr", "-R", "-i", str(self.where)], check=True, capture_output=True)

    def down(self) -> None:
        return None


@pytest.mark.parametrize("persistent", ["store", "directory"])
def test_a_dcp_nodes_shards_come_back_from_its_partners_copy_while_the_store_hangs(
        cluster4: SlurmCluster, tmp_path: Path, persistent: str) -> None:
    torch = pytest.importorskip("torch")
    c = cluster4
    t0 = time.monotonic()
    if persistent == "store":
        skip_without_s3()
        server, bucket, env = on_cluster(c, tmp_path, "ring")
        to = bucket.url("ring/ckpt")
    else:
        if shutil.which("chattr") is None:
            pytest.skip("needs chattr (e2fsprogs) to make the destination refuse writes")
        to, env = f"{c.shared}/persist/ckpt", {}
        Path(to).mkdir(parents=True, exist_ok=True)
        server = Refusing(Path(to))  # type: ignore[assignment]
    paused = False
    try:
        run, progress, final, out = c.shared / "run", c.shared / "progress.jsonl", c.shared / "final.pt", c.shared / "job.out"
        cfg = c.shared / "run.toml"
        cfg.write_text('spare_nodes = 1\n\n'
                       f'[[sync]]\nname = "ckpt"\nfrom = "{c.local}/ckpt"\nto = "{to}"\n'
                       'nodes = "auto"\nsettle = "1s"\nrestore = true\n')
        script = JOB.format(repo=ROOT, python=sys.executable, cfg=cfg, run=run,
                            torchrun=Path(sys.executable).parent / "torchrun", train=Path(__file__).parent / "train_dcp.py",
                            local=c.local, steps=STEPS, every=EVERY, progress=progress, final=final)
        script = script.replace("#SBATCH --nodes=2\n", "#SBATCH --nodes=3\n#SBATCH --no-kill\n") \
            .replace("--step-sleep 0.3", "--step-sleep 0.6")
        job = c.submit(script, "-o", str(out), env=env)
        leader, node1 = run / "events.jsonl", run / "nodes" / "node-1" / "events.jsonl"

        def log(what: str) -> None:
            print(f"ring: {time.monotonic() - t0:.1f}s {what}", flush=True)

        def said() -> str:
            return f"job {c.state(job)}; {out.read_text()[-3000:] if out.exists() else ''}"

        def published() -> list[str]:
            return [e["checkpoint"] for e in events(leader) if e.get("kind") == "publish" and e["attempt"] == 1]

        def copied_by_node_1() -> list[str]:
            return [e["checkpoint"] for e in events(node1) if e.get("kind") == "peer-copy" and e["attempt"] == 1]

        def lines(what: str) -> list[dict]:
            return [e for e in map(json.loads, progress.read_text().splitlines())
                    if e["what"] == what] if progress.exists() else []

        wait_for(lambda: len(published()) >= 2, 300, lambda: f"2 checkpoints published; {said()}", interval=0.5)
        server.pause()
        paused = True
        at_pause = max(published())
        log(f"store paused; published up to {at_pause}")
        # node 1's ring copies two checkpoints saved while the store hangs, to n1's disk
        wait_for(lambda: len([n for n in copied_by_node_1() if n > at_pause]) >= 2, 120,
                 lambda: f"node 1's copies of 2 checkpoints newer than {at_pause}; {said()}", interval=0.2)
        copied = max(copied_by_node_1())
        c.kill_node("n2")
        killed = time.monotonic()
        saved = [f"step_{e['step']:05d}" for e in lines("saved")]
        log(f"n2 killed; node 1 had copied up to {copied}, saved up to {saved[-1]}")

        wait_for(lambda: len(lines("start")) >= 2, 300, lambda: f"the attempt on the spare started; {said()}", interval=0.5)
        start = lines("start")[1]
        log(f"resumed at step {start['step']} from {start['restored']} {time.monotonic() - killed:.1f}s after the kill")
        server.resume()
        paused = False
        wait_for(lambda: c.state(job) == "COMPLETED", 300, lambda: f"job {job} completed; {said()}", interval=0.5)
        log("completed")

        ev = events(leader)
        choice = next(e for e in ev if e.get("kind") == "restore-choice" and e["attempt"] == 2)
        assert choice["source"] == "nodes" and "0/1" in choice["holders"], choice
        # at least the newest checkpoint node 1 had copied, newer than anything published; at most the last saved
        assert copied <= choice["checkpoint"] <= saved[-1] and choice["checkpoint"] > at_pause, (choice, copied, saved)
        assert start["restored"] and Path(start["restored"]).name == choice["checkpoint"], start
        assert start["step"] == int(choice["checkpoint"].split("_")[1]), start
        # the spare, node 1 now: node 1's shards from n1's copy of them, every byte verified
        verified = [e for e in events(node1) if e.get("kind") == "restore-verify" and e["attempt"] == 2]
        assert verified and verified[-1]["result"] == "verified" and "node-0-copy" in verified[-1]["from"], verified
        # every checkpoint copied once by its node in an attempt (no version pushed again and dropped)
        for journal in (ev, events(node1)):
            copies = [(e["attempt"], e["checkpoint"]) for e in journal if e.get("kind") == "peer-copy"]
            assert copies and len(copies) == len(set(copies)), copies
        ends = {e["attempt"]: e for e in ev if e.get("kind") == "end"}
        assert ends[2]["reason"] == "child-exit" and ends[2]["not_durable"] == [], ends[2]
        assert torch.equal(torch.load(final), reference(STEPS))
        log(f"resumed at {choice['checkpoint']} (the store held up to {at_pause}); final weights equal the reference")
    finally:
        if paused:
            server.resume()
        server.down()
