"""DeepSpeed across nodes with node-local storage (issue 29, item 5): each node's shards, node 0's ``latest``.

``deepspeed_nodes.py`` (ZeRO 1, ``"checkpoint": {"use_node_local_storage": true}``, gloo on the
CPU) under ``srun torchrun --nnodes 2 --nproc-per-node 2`` on a 4-node cluster, saving into each
node's local disk: node 0 holds ``latest``, the model states and ranks 0-1's optimizer shards;
node 1 the same model states (byte for byte) and ranks 2-3's shards, never a ``latest``. Every
rank loads from its own disk at start. With the documented config (``nodes = "auto"``,
``restore = true``), through a requeue onto other nodes, the death of a non-batch node, then
the death of the batch node (the leader with it):

* every ``global_stepN`` saved is published while the job runs (both nodes' parts, every
  rank's shard), the last at the end;
* every rank on every node resumes from the same step, the newest published before the
  interruption (after the requeue exactly the last one saved), and the leader's
  ``restore-versions`` says every node held that checkpoint;
* the job completes; the last step is durable, DeepSpeed loads it, and its weights are an
  uninterrupted run's (``torchrun --standalone --nproc-per-node 4``, no supervise).

    SUPERVISE_LONG=1 .venv/bin/python -m pytest -q -s tests/multinode/test_deepspeed_nodes.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
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
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")]

STEPS, EVERY = 60, 3
TRAIN = Path(__file__).parent / "deepspeed_nodes.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
SHARDS = [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(4)]
MODEL = "mp_rank_00_model_states.pt"

JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --requeue
#SBATCH --open-mode=append
cd {repo}
echo "attempt ${{SLURM_RESTART_COUNT:-0}} on $SLURM_JOB_NODELIST"
export STEP_SLEEP=0.4 OMP_NUM_THREADS=1
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)
exec {python} -m supervisor --config {cfg} --run-dir {run} -- \\
  srun --ntasks-per-node=1 --chdir={local} {torchrun} --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d \\
  --rdzv-endpoint=$HEAD:29500 --rdzv-id=$SLURM_JOB_ID-$SLURM_RESTART_COUNT {train} {steps} {every} --dir checkpoints
"""


def test_deepspeed_node_local_checkpoints_through_a_requeue_and_two_node_deaths(cluster4: SlurmCluster, tmp_path: Path) -> None:
    dst = cluster4.shared / "persist" / "checkpoints"
    _through_a_requeue_and_two_node_deaths(cluster4, tmp_path, str(dst), lambda into: shutil.copytree(dst, into))


def test_deepspeed_node_local_checkpoints_into_a_bucket(cluster4: SlurmCluster, tmp_path: Path) -> None:
    """The same, with the checkpoints in a bucket (issue 45): SeaweedFS on the cluster's network,
    no shared checkpoint directory; each node uploads its own ranks' shards, the leader
    publishes the union. Every checkpoint is read back through its manifest, whole."""
    skip_without_s3()
    c = cluster4
    server, bucket, env = on_cluster(c, tmp_path, "deepspeed")
    prefix = "deepspeed/checkpoints"

    def download(into: Path) -> None:
        """What a user reads by hand (docs/sync.md): every manifest's objects, and the pointers."""
        for name, doc in bucket.manifests(prefix).items():
            assert bucket.whole(doc) == [], (name, bucket.whole(doc))
            for rel in doc["files"]:
                path = into / name / rel if rel else into / name
                path.parent.mkdir(parents=True, exist_ok=True)
                bucket.fetch(doc, rel, path)
        for key in bucket.keys(f"{prefix}/.supervise/pointers/"):
            ptr = json.loads(bucket.get(key) or b"{}")
            (into / ptr["pointer"]).write_text(ptr["target"])

    try:
        _through_a_requeue_and_two_node_deaths(c, tmp_path, bucket.url(prefix), download, env=env)
        assert not (c.shared / "persist").exists()
        assert not bucket.keys(f"{prefix}/.supervise/parts/"), bucket.keys(f"{prefix}/.supervise/parts/")
    finally:
        server.down()


def _through_a_requeue_and_two_node_deaths(c: SlurmCluster, tmp_path: Path, dst: str,
                                           copy_out: Callable[[Path], object], env: dict[str, str] | None = None) -> None:
    """``copy_out(DIR)``: the persistent side's checkpoints into DIR, as DeepSpeed reads them."""
    pytest.importorskip("deepspeed")
    torch = pytest.importorskip("torch")
    t0 = time.monotonic()
    run, cfg, out = c.shared / "run", c.shared / "run.toml", c.shared / "job.out"
    cfg.write_text(f'[[sync]]\nname = "ckpt"\nfrom = "{c.local}/checkpoints"\nto = "{dst}"\n'
                   'nodes = "auto"\nsettle = "1s"\nrestore = true\n')
    job = c.submit(JOB.format(repo=ROOT, python=sys.executable, cfg=cfg, run=run, local=c.local, torchrun=TORCHRUN,
                              train=TRAIN, steps=STEPS, every=EVERY), "-o", str(out), env=env)
    leader = run / "events.jsonl"

    def publishes(attempt: int) -> list[dict]:
        return [e for e in events(leader) if e.get("kind") == "publish" and e["attempt"] == attempt
                and str(e.get("checkpoint")).startswith("global_step")]

    def said() -> str:
        return f"job {c.state(job)}; {out.read_text()[-2500:] if out.exists() else ''}"

    def dies(node: str) -> None:
        print(f"deepspeed: {time.monotonic() - t0:.1f}s {node} dies", flush=True)
        c.node_dies(job, node)

    # 1. attempt 1 on n1+n2: every save published as it is made; then requeued off n1
    wait_for(lambda: len(publishes(1)) >= 3, 300, lambda: f"three checkpoints published in attempt 1; {said()}", interval=0.5)
    assert c.hosts(job) == ["n1", "n2"]
    c.requeue_off(job, "n1")
    print(f"deepspeed: {time.monotonic() - t0:.1f}s requeued off n1", flush=True)

    # 2. attempt 2 on two other nodes: after two more checkpoints, its non-batch node dies
    wait_for(lambda: len(publishes(2)) >= 2, 300, lambda: f"two checkpoints published in attempt 2; {said()}", interval=0.5)
    second = c.hosts(job)
    assert "n1" not in second, second
    dies(second[1])

    # 3. attempt 3: after two more checkpoints, its batch node dies (the leader with it: no end)
    wait_for(lambda: len(publishes(3)) >= 2, 300, lambda: f"two checkpoints published in attempt 3; {said()}", interval=0.5)
    third = c.hosts(job)
    dies(third[0])

    # 4. attempt 4 on the two nodes left finishes
    wait_for(lambda: c.state(job) == "COMPLETED", 400, lambda: f"job {job} completed; {said()}", interval=0.5)
    fourth = c.hosts(job)
    print(f"deepspeed: {time.monotonic() - t0:.1f}s completed; nodes {['n1', 'n2'], second, third, fourth}", flush=True)
    assert second[1] not in third + fourth and third[0] not in fourth
    ev = events(leader)
    text = attempts_of(out.read_text())
    assert sorted(text) == [1, 2, 3, 4], sorted(text)
    every_published = {e["checkpoint"] for e in ev if e.get("kind") == "publish"}
    saved_before: list[int] = []
    for a in (1, 2, 3, 4):
        saved = [int(x) for x in re.findall(r"^saved global_step(\d+)$", text[a], flags=re.M)]
        starts = re.findall(r"^rank (\d) starts at step (\d+) from (\S+)$", text[a], flags=re.M)
        assert sorted(int(r) for r, _, _ in starts) == [0, 1, 2, 3], (a, starts)
        steps, tags = {int(s) for _, s, _ in starts}, {t for _, _, t in starts}
        assert len(steps) == 1 and len(tags) == 1, (a, starts)  # every rank on every node: the same step
        start, tag = steps.pop(), tags.pop()
        versions = next(e for e in ev if e.get("kind") == "restore-versions" and e["attempt"] == a)
        assert versions["agree"] and sorted(versions["nodes"]) == ["0", "1"], versions
        if a == 1:
            assert (start, tag) == (0, "-"), starts
        else:
            assert tag == f"global_step{start}", starts
            if a == 2:  # a clean stop: the last save is durable
                assert start == saved_before[-1], (start, saved_before)
            else:  # a node died: at most its last save
                assert start in saved_before[-2:], (start, saved_before)
            held = [v["ckpt"] for v in versions["nodes"].values()]
            assert all(h and h["name"] == tag for h in held) and len({h["sha256"] for h in held}) == 1, versions
        published = publishes(a)
        # each checkpoint whole: both nodes' parts, every rank's shard, the model states from either
        for e in published:
            assert e["parts"] == {"0": 3, "1": 3} and e["shared"] == [MODEL] and e["files"] == 5, e
        names = {e["checkpoint"] for e in published}
        if a in (1, 4):  # a clean end: every checkpoint saved was published in the attempt
            assert {f"global_step{s}" for s in saved} <= names, (a, saved, sorted(names))
        else:  # a node died: every one but the last saved was published (by this leader or the next)
            assert {f"global_step{s}" for s in saved[:-1]} <= every_published, (a, saved, sorted(every_published))
        spawn = next(e["t"] for e in ev if e.get("kind") == "spawn" and e["attempt"] == a)
        assert not [e for e in ev if e.get("kind") == "sync-deferred" and e["attempt"] == a and e["t"] > spawn]
        lags = sorted(e["lag_s"] for e in published if e.get("lag_s") is not None)
        print(f"deepspeed: attempt {a}: starts at step {start} ({tag}); saved {saved}; {len(published)} published, "
              f"lag {lags[0] if lags else None}-{lags[-1] if lags else None}s", flush=True)
        saved_before += saved
    ends = [e for e in ev if e.get("kind") == "end"]
    assert ends[-1]["reason"] == "child-exit" and ends[-1]["not_durable"] == [], ends[-1]
    copied = tmp_path / "load" / "checkpoints"
    copy_out(copied)
    assert (copied / "latest").read_text() == f"global_step{STEPS}"
    final = copied / f"global_step{STEPS}"
    assert sorted(p.name for p in final.iterdir()) == sorted([MODEL, *SHARDS])
    shutil.copytree(run, tmp_path / "run")  # the journals where the contract check reads every real run's

    # the replay: the same script uninterrupted, 4 ranks on one machine; then DeepSpeed loads the published one
    replay = _torchrun(tmp_path / "replay", STEPS)
    assert f"saved global_step{STEPS}" in replay, replay[-2000:]
    ours = torch.load(final / MODEL, map_location="cpu", weights_only=False)
    theirs = torch.load(tmp_path / "replay" / "checkpoints" / f"global_step{STEPS}" / MODEL, map_location="cpu",
                        weights_only=False)
    assert ours["module"].keys() == theirs["module"].keys()
    for k in ours["module"]:
        assert torch.equal(ours["module"][k], theirs["module"][k]), k
    loaded = _torchrun(tmp_path / "load", STEPS)
    assert len(re.findall(rf"^rank \d starts at step {STEPS} from global_step{STEPS}$", loaded, flags=re.M)) == 4, loaded
    print(f"deepspeed: {time.monotonic() - t0:.1f}s", flush=True)


def _torchrun(where: Path, steps: int) -> str:
    """``deepspeed_nodes.py`` with 4 ranks on this machine, no supervise: its output."""
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", "4", str(TRAIN), str(steps), str(EVERY)],
                          cwd=where, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "STEP_SLEEP": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
