"""Lightning across nodes (issue 29): ``Trainer(num_nodes=2)`` with ``ModelCheckpoint(save_last=True)``.

``lightning_nodes.py`` under ``srun`` on the 4-node cluster (2 nodes, 2 ranks each, one
task per device as Lightning's Slurm support wants), checkpoints on each node's local disk
(global rank 0 writes them, every rank resolves ``ckpt_path="last"`` on its own node), the
supervise configured by flags alone (``--checkpoints … --nodes auto --restore``: its node
agents get the same configuration), through the four interruptions of a multi-node job: the
time limit (supervise stops ahead of it and requeues), a requeue onto other nodes, the death
of a non-batch node, the death of the batch node (the leader with it). Before: ``last.ckpt`` was published once and never again, a restore made it a
link that the next ``save_last`` wrote through into an epoch file, and a new node resumed
from nothing or from an old epoch. Now: every version of ``last.ckpt`` is published, every rank
of every attempt starts at the same epoch, the one after the last saved before the
interruption, and the job completes with the last epoch durable and the final weights of an
uninterrupted replay (the same script, two ``torchrun`` "nodes" on this machine).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from tests.support.journal import events
from tests.support.paths import ROOT
from tests.support.s3 import on_cluster, skip_without_s3
from tests.support.slurm import SlurmCluster, attempts_of

# Enough that attempt 5 always has epochs left: attempt 1 trains until the time limit (33 epochs
# here, fewer in CI; at most ~45 at EPOCH_SLEEP=1), attempts 2-4 two to four each. With 40, a
# fast run finished every epoch in attempt 4; attempt 5 then resumed at max_epochs, where
# Lightning skips on_train_start, and no rank printed its "starts at epoch" line.
EPOCHS = 64
TRAIN = Path(__file__).parent / "lightning_nodes.py"

JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --time=1
cd {repo}
echo "attempt ${{SLURM_RESTART_COUNT:-0}} on $SLURM_JOB_NODELIST"
export EPOCH_SLEEP=1.0 OMP_NUM_THREADS=1
exec {python} -m supervisor --checkpoints {local}/checkpoints {dst} --nodes auto --restore --settle 1s \\
  --requeue --max-requeues 8 --run-dir {run} -- srun --chdir={local} {python} {train} {epochs}
"""


def test_lightning_across_nodes_through_the_four_interruptions(cluster4: SlurmCluster, tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    torch = pytest.importorskip("torch")
    dst = cluster4.shared / "persist" / "checkpoints"

    def load(f: Path) -> dict:
        return torch.load(f, map_location="cpu", weights_only=False)

    _through_the_four_interruptions(cluster4, tmp_path, str(dst), lambda: load(dst / "last.ckpt"),
                                    lambda: {f.name: load(f) for f in dst.glob("epoch=*.ckpt")})


LONG = pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")


@LONG
def test_lightning_across_nodes_into_a_bucket(cluster4: SlurmCluster, tmp_path: Path) -> None:
    """The same, with the checkpoints in a bucket (issue 45): SeaweedFS on the cluster's
    network, no shared checkpoint directory; every version of ``last.ckpt`` (a copy) and every
    epoch file is read back through its manifest, whole, with Lightning's loader."""
    pytest.importorskip("lightning")
    torch = pytest.importorskip("torch")
    skip_without_s3()
    c = cluster4
    server, bucket, env = on_cluster(c, tmp_path, "lightning")
    prefix = "lightning/checkpoints"
    try:
        def load(name: str) -> dict:
            doc = bucket.manifest(prefix, name)
            assert doc is not None and bucket.whole(doc) == [], (name, doc)
            return torch.load(bucket.fetch(doc, "", tmp_path / name), map_location="cpu", weights_only=False)

        _through_the_four_interruptions(c, tmp_path, bucket.url(prefix), lambda: load("last.ckpt"),
                                        lambda: {n: load(n) for n in bucket.manifests(prefix) if n.startswith("epoch=")},
                                        env=env)
        assert not (c.shared / "persist").exists()
        assert not bucket.keys(f"{prefix}/.supervise/parts/"), bucket.keys(f"{prefix}/.supervise/parts/")
        docs = bucket.manifests(prefix)
        assert {n: bucket.whole(d) for n, d in docs.items()} == {n: [] for n in docs}
    finally:
        server.down()


def _through_the_four_interruptions(c: SlurmCluster, tmp_path: Path, dst: str, final_ckpt: Callable[[], dict],
                                    epoch_files: Callable[[], dict[str, dict]], env: dict[str, str] | None = None) -> None:
    t0 = time.monotonic()
    run, out = c.shared / "run", c.shared / "job.out"
    job = c.submit(JOB.format(repo=ROOT, python=sys.executable, dst=dst, run=run, local=c.local,
                              train=TRAIN, epochs=EPOCHS), "-o", str(out), env=env)
    leader = run / "events.jsonl"

    def lasts(attempt: int) -> list[dict]:
        return [e for e in events(leader) if e.get("kind") == "publish" and e["attempt"] == attempt
                and e.get("checkpoint") == "last.ckpt"]

    def said() -> str:
        return f"job {c.state(job)}; {out.read_text()[-2500:] if out.exists() else ''}"

    def log(what: str) -> None:
        print(f"lightning: {time.monotonic() - t0:.1f}s {what}", flush=True)

    c.four_interruptions(job, lambda a: len(lasts(a)), said, log)
    ev = events(leader)
    text = attempts_of(out.read_text())
    assert sorted(text) == [1, 2, 3, 4, 5], sorted(text)
    ends = {e["attempt"]: e for e in ev if e.get("kind") == "end"}
    assert ends[1]["reason"] == "deadline" and ends[1]["not_durable"] == [], ends[1]
    previous_last = None
    for a in (1, 2, 3, 4, 5):
        starts = re.findall(r"^rank (\d) starts at epoch (\d+) from (\S+)", text[a], flags=re.M)
        assert sorted(int(r) for r, _, _ in starts) == [0, 1, 2, 3], (a, starts)
        epochs = {int(e) for _, e, _ in starts}
        assert len(epochs) == 1, (a, starts)  # every rank on every node: the same epoch
        if a == 1:
            assert epochs == {0}, starts
        else:
            assert {f for _, _, f in starts} == {"last.ckpt"}, starts
            start = epochs.pop()
            if a in (2, 3):  # a clean stop: the last epoch saved is where every rank goes on
                assert start == previous_last + 1, (a, starts, previous_last)
            else:  # a node died: at most its last save
                assert start in (previous_last, previous_last + 1), (a, starts, previous_last)
        versions = next(e for e in ev if e.get("kind") == "restore-versions" and e["attempt"] == a)
        assert versions["agree"], versions
        # the newest version of last.ckpt published in this attempt: the one the next resumes from
        spawn = next(e["t"] for e in ev if e.get("kind") == "spawn" and e["attempt"] == a)
        assert not [e for e in ev if e.get("kind") == "sync-deferred" and e["attempt"] == a and e["t"] > spawn]
        log(f"attempt {a}: starts {sorted(starts)[0][1]}, {len(lasts(a))} versions of last.ckpt published, "
            f"lag max {max((e.get('lag_s') or 0) for e in lasts(a)):.3f}s")
        previous_last = _last_epoch_published(ev, a)
    # the flags reached the node agents whole (issue 29, D3: they exited 2 at --settle)
    agent_starts = [e for e in events(run / "nodes" / "node-1" / "events.jsonl") if e.get("kind") == "node-start"]
    assert len(agent_starts) == 5, agent_starts
    for e in agent_starts:
        (pair,) = e["pairs"]
        assert pair["from"] == f"{c.local}/checkpoints" and pair["to"] == str(dst) and pair["restore"] is True, pair
    final = final_ckpt()
    assert final["epoch"] == EPOCHS - 1, final["epoch"]
    files = epoch_files()
    assert files
    for name, ckpt in files.items():  # no epoch file holds another epoch (a save through a link would)
        assert name.startswith(f"epoch={ckpt['epoch']}-"), name
    # the replay: an epoch lost or trained twice from other weights moves them by 1e-4 or more;
    # one run in two here differed below the printed 1e-4 (float noise, source not found yet)
    want = _replay(tmp_path)["state_dict"]
    differ = max(float((final["state_dict"][k] - want[k]).abs().max()) for k in want)
    log(f"the final weights differ from the replay's by {differ:.3g} at most")
    assert differ <= 1e-5, (final["state_dict"], want)


def _replay(tmp_path: Path) -> dict:
    """The same training, uninterrupted: two ``torchrun`` "nodes" on this machine, each in
    its own directory (its local disk); node 0's ``last.ckpt`` at the end."""
    import torch

    env = {**os.environ, "OMP_NUM_THREADS": "1", "EPOCH_SLEEP": "0"}
    procs = []
    for k in (0, 1):
        (tmp_path / f"replay{k}").mkdir()
        procs.append(subprocess.Popen([str(Path(sys.executable).parent / "torchrun"), "--nnodes=2", "--nproc-per-node=2",
                                       f"--node-rank={k}", "--master-addr=127.0.0.1", "--master-port=29613", str(TRAIN),
                                       str(EPOCHS)], cwd=tmp_path / f"replay{k}", env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    return torch.load(tmp_path / "replay0" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)


def _last_epoch_published(ev: list[dict], attempt: int) -> int:
    """The newest ``epoch=N-…ckpt`` this attempt published (Lightning saves it before last.ckpt)."""
    names = [e["checkpoint"] for e in ev if e.get("kind") == "publish" and e["attempt"] == attempt
             and str(e.get("checkpoint", "")).startswith("epoch=")]
    return max(int(n.split("=")[1].split("-")[0]) for n in names)
