"""``horovodrun -np 4 -H n1:2,n2:2 python train.py`` across two nodes of the cluster (issue 29).

The command Horovod's docs give for several hosts, as is, under ``supervise`` (``nodes =
"auto"``, ``restore = true``) in a 2-node sbatch job of the 3-node cluster, with
``train_hvd.py`` written as Horovod's own examples write it: rank 0 ``torch.save``s a new
``checkpoint-{epoch}.pth.tar`` on its node's local disk every epoch; at start rank 0 finds the
newest one there, ``hvd.broadcast``s its epoch, loads it alone, and ``hvd.broadcast_parameters``
/ ``broadcast_optimizer_state`` from rank 0; no signal handler.

How horovodrun reaches the other node, and why this way. horovodrun's static mode always
``ssh``es to every host that is not this one first (``_check_all_hosts_ssh_successful`` in
``horovod/runner/launch.py``: ``ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no
HOST date``, 5 tries), whatever the controller; there is no flag that skips it (``-p`` and
``-i`` only change the port and key, ``--disable-cache`` only stops caching its result for 60
minutes), and without ``--network-interfaces`` it then starts its task servers on every host
over ssh to find the common interface. So a horovodrun across hosts needs what a Slurm
cluster's compute nodes have: an sshd, and the user's key accepted there (a shared home's
``~/.ssh``; on many sites ``pam_slurm_adopt`` lets in only the user with a job on the node).
The cluster here gets that (``SSHD=1 scripts/slurm-up.sh``: openssh-server's sshd in every
node's namespaces, the nodes' ``/etc/ssh/ssh_config`` naming root's key and the nodes' host
key). The ranks themselves are not started over ssh: with the MPI controller built, a plain
``horovodrun`` runs ``mpirun -H n1:2,n2:2 …`` (its ``--mpi``), and OpenMPI inside a Slurm
allocation launches its daemon on the other node with ``srun`` (plm/slurm), so the ranks
there run in a step of the job: the node agent sees them by ``SLURM_JOB_ID`` and Slurm ends
them with the job. (``horovodrun --gloo`` would start them over ssh, outside the job.)
``--disable-cache``: every attempt checks ssh afresh (horovodrun keeps what it found in
``~/.horovod`` for 60 minutes, keyed by ``-np`` and ``-H`` alone, so a second attempt on the
same host names, or another cluster's n1 and n2, would not ssh at all).

Through a requeue onto other nodes (n1 excluded) and the death of the non-batch node of the
second attempt, checked:

* horovodrun ssh'ed to the other node in every attempt (its sshd's log); ranks 0-1 on the
  batch node, 2-3 on the other, those in a step of the job (mpirun's srun);
* every rank of every attempt resumed from the same epoch, the newest published before the
  interruption (after the requeue, the last one saved), with the weights rank 0 saved then;
* every version rank 0 saved was published (``publish`` in the leader's journal), while the
  job ran; every attempt's nodes held the same version at the spawn (``restore-versions``);
* the job COMPLETED, the last epoch durable (the weights of the training's end).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.support.journal import events
from tests.support.paths import ROOT
from tests.support.slurm import SlurmCluster, attempts_of
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")]

EPOCHS = 20
HOROVODRUN = Path(sys.executable).parent / "horovodrun"
NAME = re.compile(r"^checkpoint-(\d+)\.pth\.tar$")

JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --requeue
#SBATCH --open-mode=append
cd {repo}
echo "attempt ${{SLURM_RESTART_COUNT:-0}} on $SLURM_JOB_NODELIST"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
HOSTS=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed 's/$/:2/' | paste -sd,)
exec {python} -m supervisor --config {cfg} --run-dir {run} -- \\
  {horovodrun} -np 4 -H $HOSTS --disable-cache {python} {train} --checkpoint-format {local}/ckpt/checkpoint-{{epoch}}.pth.tar \\
  --epochs {epochs} --epoch-sleep 1.0 --progress {progress}
"""


def epoch_of(name: str) -> int:
    m = NAME.match(name)
    assert m, name
    return int(m.group(1))


def test_horovodrun_across_nodes_through_a_requeue_and_a_node_death(cluster3_ssh: SlurmCluster, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("horovod.torch")
    if not HOROVODRUN.exists():
        pytest.skip("horovodrun is not installed (bash scripts/build-horovod.sh)")
    c = cluster3_ssh
    t0 = time.monotonic()
    run, cfg, out, progress = c.shared / "run", c.shared / "run.toml", c.shared / "job.out", c.shared / "progress.jsonl"
    dst = c.shared / "persist" / "ckpt"
    cfg.write_text(f'[[sync]]\nname = "ckpt"\nfrom = "{c.local}/ckpt"\nto = "{dst}"\n'
                   'nodes = "auto"\nsettle = "1s"\nrestore = true\n')
    job = c.submit(JOB.format(repo=ROOT, python=sys.executable, cfg=cfg, run=run, local=c.local, horovodrun=HOROVODRUN,
                              train=Path(__file__).parent / "train_hvd.py", epochs=EPOCHS, progress=progress),
                   "-o", str(out))
    leader = run / "events.jsonl"

    def publishes(attempt: int | None = None) -> list[dict]:
        return [e for e in events(leader) if e.get("kind") == "publish" and NAME.match(str(e.get("checkpoint", "")))
                and (attempt is None or e["attempt"] == attempt)]

    def said() -> str:
        return f"job {c.state(job)}; {out.read_text()[-2500:] if out.exists() else ''}"

    # 1. attempt 1 on n1+n2; three versions published, then requeued off n1
    wait_for(lambda: len(publishes(1)) >= 3, 300, lambda: f"three versions published in attempt 1; {said()}", interval=0.5)
    assert c.hosts(job) == ["n1", "n2"]
    c.requeue_off(job, "n1")
    print(f"hvd: {time.monotonic() - t0:.1f}s requeued off n1", flush=True)

    # 2. attempt 2 on n2+n3: after two more versions, its non-batch node dies
    wait_for(lambda: len(publishes(2)) >= 2, 300, lambda: f"two versions published in attempt 2; {said()}", interval=0.5)
    second = c.hosts(job)
    assert "n1" not in second, second
    print(f"hvd: {time.monotonic() - t0:.1f}s {second[1]} dies", flush=True)
    c.node_dies(job, second[1])

    # 3. attempt 3 on the nodes left finishes
    wait_for(lambda: c.state(job) == "COMPLETED", 400, lambda: f"job {job} completed; {said()}", interval=0.5)
    third = c.hosts(job)
    print(f"hvd: {time.monotonic() - t0:.1f}s completed; nodes {['n1', 'n2'], second, third}", flush=True)
    assert second[1] not in third

    ev = events(leader)
    assert sorted(attempts_of(out.read_text())) == [1, 2, 3], out.read_text()[-3000:]
    said_ = [json.loads(x) for x in progress.read_text().splitlines() if x.strip()]
    saved = {s["epoch"]: s["digest"] for s in said_ if s["what"] == "saved"}  # the last save of an epoch wins
    published = {epoch_of(e["checkpoint"]): e for e in publishes()}
    nodes = {1: ["n1", "n2"], 2: second, 3: third}
    for a in (1, 2, 3):
        starts = {s["rank"]: s for s in said_ if s["what"] == "start" and s["attempt"] == a}
        assert sorted(starts) == [0, 1, 2, 3] and {s["size"] for s in starts.values()} == {4}, (a, starts)
        # ranks 0-1 on the batch node, 2-3 on the other, those in a step of the job (mpirun's srun)
        assert [starts[r]["host"] for r in range(4)] == [nodes[a][0]] * 2 + [nodes[a][1]] * 2, (a, starts)
        assert all(starts[r]["step_id"] not in (None, "batch") for r in (2, 3)), (a, starts)
        epochs = {s["epoch"] for s in starts.values()}
        digests = {s["digest"] for s in starts.values()}
        assert len(epochs) == 1 and len(digests) == 1, (a, starts)  # every rank: the same epoch, the same weights
        start = epochs.pop()
        before = sorted(epoch_of(e["checkpoint"]) for e in publishes() if e["attempt"] < a)
        saved_before = [s["epoch"] for s in said_ if s["what"] == "saved" and s["attempt"] < a]
        if a == 1:
            assert start == 0, starts
        else:
            assert start == before[-1], (a, start, before)  # the newest published before the interruption
            assert digests == {next(s["digest"] for s in reversed(said_) if s["what"] == "saved" and s["epoch"] == start
                                    and s["attempt"] < a)}, (a, starts)
            if a == 2:  # a requeue: the last save is durable
                assert start == saved_before[-1], (start, saved_before)
            else:  # a node died: at most its last save
                assert start in saved_before[-2:], (start, saved_before)
        versions = next(e for e in ev if e.get("kind") == "restore-versions" and e["attempt"] == a)
        assert versions["agree"], versions
        mine = [s["epoch"] for s in said_ if s["what"] == "saved" and s["attempt"] == a]
        lags = sorted(published[e]["lag_s"] for e in mine if e in published and published[e].get("lag_s") is not None)
        print(f"hvd: attempt {a} on {nodes[a]}: every rank starts at epoch {start}; saved {mine}; "
              f"{len(publishes(a))} published, lag max {lags[-1] if lags else None}s", flush=True)
    # horovodrun's ssh check and interface test reached the other node of every attempt
    accepted = {n: (c.root / "log" / f"sshd-{n}.log").read_text().count("Accepted publickey for root") for n in ("n2", "n3")}
    assert accepted["n2"] >= 2 * 2 and accepted["n3"] >= 2, accepted
    # every version rank 0 saved was published, and while the job ran (in the attempt that saved it)
    assert sorted(published) == sorted(saved), (sorted(published), sorted(saved))
    for s in said_:
        if s["what"] == "saved":
            assert any(epoch_of(e["checkpoint"]) == s["epoch"] and e["attempt"] == s["attempt"] for e in publishes()), s
    # the last epoch durable: the weights the training ended with
    final = torch.load(dst / f"checkpoint-{EPOCHS}.pth.tar")
    got = hashlib.sha256(b"".join(t.numpy().tobytes() for t in final["model"].values())).hexdigest()[:16]
    done = {s["digest"] for s in said_ if s["what"] == "done" and s["attempt"] == 3}
    assert done == {got} == {saved[EPOCHS]}, (done, got, saved[EPOCHS])
    ends = [e for e in ev if e.get("kind") == "end"]
    assert ends[-1]["reason"] == "child-exit" and ends[-1]["exit_status"] == 0 and ends[-1]["not_durable"] == [], ends[-1]
    shutil.copytree(run, tmp_path / "run")  # the journals where the contract check reads every real run's
    print(f"hvd: {time.monotonic() - t0:.1f}s", flush=True)
