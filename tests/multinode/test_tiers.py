"""Issue 43's bar on the multi-node cluster: no checkpoint dies with its node while the
persistent side is down.

The DDP tutorial's pattern (``tests/support/tutorial_job.py``: global rank 0 ``torch.save``s
``snapshot.pt`` on its node's disk every epoch, every rank loads it from its own disk) on 2
nodes × 2 ranks and one spare, its checkpoints' persistent side an object store (SeaweedFS on
the cluster's network, no shared checkpoint directory). Once a few versions are published, the
store hangs (SIGSTOP: connections accepted, nothing answers); rank 0 goes on saving on n1's
disk; then n2, not the batch node, dies. In the attempt on the spare:

* the leader chooses the version whole on the nodes' disks (``restore-choice``: ``source``
  ``nodes``), newer than any published;
* n3 fetches it from n1's disk over the peer servers, verified (``restore-verify``: ``from``
  ``node-0``), nothing from the store;
* every rank resumes from the newest epoch saved before the kill, not from the last published
  one;
* once the store answers again the versions are published; the job completes, and its final
  weights equal a replay of the epochs trained, bit for bit.

The long set (about 5 minutes: ``.ci/run`` stays under its 40; the requeue onto the same nodes
reading nothing back from persistent storage is checked in CI by test_ddp_tutorial.py):

    SUPERVISE_LONG=1 .venv/bin/python -m pytest -q -s tests/multinode/test_tiers.py
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.support.journal import events
from tests.support.s3 import on_cluster, skip_without_s3
from tests.support.slurm import SlurmCluster
from tests.support.tutorial_job import replay, resumed_epochs, saved_epochs, tutorial_job
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")]

EPOCHS = 60
DIRECTIVES = ["--nodes=3", "--ntasks-per-node=1", "--no-kill", "--requeue", "--open-mode=append"]


def test_a_node_dies_while_the_store_hangs_and_every_rank_resumes_from_the_newest_save(
        cluster4: SlurmCluster, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    skip_without_s3()
    c = cluster4
    t0 = time.monotonic()
    server, bucket, env = on_cluster(c, tmp_path, "tiers")
    paused = False
    try:
        run, cfg, out = c.shared / "run", c.shared / "run.toml", c.shared / "job.out"
        cfg.write_text('requeue = true\nspare_nodes = 1\n\n'
                       f'[[sync]]\nname = "ckpt"\nfrom = "{c.local}/ckpt"\nto = "{bucket.url("tiers/ckpt")}"\n'
                       'nodes = "auto"\nsettle = "1s"\nrestore = true\n')
        job = c.submit(tutorial_job(DIRECTIVES, cfg=cfg, run=run, local=str(c.local), epochs=EPOCHS), "-o", str(out),
                       env=env)
        leader = run / "events.jsonl"

        def log(what: str) -> None:
            print(f"tiers: {time.monotonic() - t0:.1f}s {what}", flush=True)

        def said() -> str:
            return f"job {c.state(job)}; {out.read_text()[-3000:] if out.exists() else ''}"

        def published() -> int:
            return len([e for e in events(leader) if e.get("kind") == "publish" and e.get("checkpoint") == "snapshot.pt"])

        wait_for(lambda: published() >= 3, 300, lambda: f"3 versions published; {said()}", interval=0.5)
        server.pause()
        paused = True
        at_pause = saved_epochs(out.read_text())
        log(f"store paused after {published()} publishes; saved so far {at_pause[-3:]}")
        wait_for(lambda: len(saved_epochs(out.read_text())) >= len(at_pause) + 3, 120,
                 lambda: f"3 more saves while the store hangs; {said()}", interval=0.2)
        text_before = out.read_text()
        c.kill_node("n2")
        killed = time.monotonic()
        log(f"n2 killed; saved before the kill {saved_epochs(text_before)[-3:]}")

        def resumed() -> list[int]:
            return resumed_epochs(out.read_text()[len(text_before):])

        wait_for(lambda: len(resumed()) >= 4, 300, lambda: f"every rank resumed on the spare; {said()}", interval=0.5)
        log(f"every rank resumed at {resumed()} {time.monotonic() - killed:.1f}s after the kill")
        server.resume()
        paused = False
        wait_for(lambda: c.state(job) == "COMPLETED", 300, lambda: f"job {job} completed; {said()}", interval=0.5)
        log("completed")

        ev = events(leader)
        text = out.read_text()
        got = resumed()
        assert len(got) == 4 and len(set(got)) == 1, got
        # the newest epoch saved before the kill (rank 0 may save once more between the test's look
        # and the kill), and newer than anything the store held
        attempt1 = text[:len(text_before) + text[len(text_before):].index("Resuming training from snapshot")]
        assert got[0] in saved_epochs(attempt1)[-2:] and got[0] > at_pause[-1], (got, saved_epochs(attempt1)[-3:], at_pause[-1])
        choice = next(e for e in ev if e.get("kind") == "restore-choice" and e["attempt"] == 2)
        assert choice["source"] == "nodes" and choice["checkpoint"] == "snapshot.pt" and choice["holders"] == ["0"], choice
        # the spare (node 1 now) took every byte from n1's disk, none from the store
        node1 = [e for e in events(run / "nodes" / "node-1" / "events.jsonl")
                 if e.get("kind") == "restore-verify" and e.get("result") == "verified"]
        assert node1 and node1[-1]["from"] == {"node-0": node1[-1]["moved"]} and node1[-1]["moved"] > 0, node1
        versions = next(e for e in ev if e.get("kind") == "restore-versions" and e["attempt"] == 2)
        assert versions["agree"] and len({v["ckpt"]["sha256"] for v in versions["nodes"].values()}) == 1, versions
        ends = {e["attempt"]: e for e in ev if e.get("kind") == "end"}
        assert ends[2]["reason"] == "child-exit" and ends[2]["not_durable"] == [], ends[2]

        doc = bucket.manifest("tiers/ckpt", "snapshot.pt")
        assert doc is not None and bucket.whole(doc) == [], doc
        final = torch.load(bucket.fetch(doc, "", tmp_path / "snapshot.pt"))
        assert final["EPOCHS_RUN"] == EPOCHS - 1, final["EPOCHS_RUN"]
        trained = [*range(0, got[0] + 1), *range(got[0], EPOCHS)]
        want = replay(trained, tmp_path / "replay.pt")
        assert all(torch.equal(final["MODEL_STATE"][k], want[k]) for k in want), trained
        log(f"resumed at {got[0]} (the store held up to {at_pause[-1]}); final weights equal the replay")
    finally:
        if paused:
            server.resume()
        server.down()
