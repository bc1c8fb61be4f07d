"""mpiexec (OpenMPI, its remote ranks launched through Slurm) across 2 nodes of the cluster,
where only rank 0 saves and rank 0 is not on the batch node (issue 21).

The job runs on n1+n2; n1 is the batch node (the leader, node 0). A rankfile puts rank 0 on
n2, so every checkpoint (``torch.save``, one file) exists only on n2's local disk: node 1's
agent stages it as node 1's part and the leader publishes it from that part alone. Checked:
rank 0 ran on n2 and rank 1 on n1, every checkpoint rank 0 saved is published and loads with
the values rank 0 saved, and each publish came from node 1's part.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.support.journal import events
from tests.support.paths import ROOT
from tests.support.slurm import SlurmCluster
from tests.support.wait import wait_for

STEPS, SAVE_EVERY = 20, 5

JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
cd {repo}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec {python} -m supervisor --config {cfg} --run-dir {run} -- \\
  mpiexec -n 2 --rankfile {rankfile} --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \\
  {python} {train} --out {local}/ckpt --steps {steps} --save-every {every} --progress {progress}
"""


def test_mpiexec_rank0_off_the_batch_node_is_published(cluster3: SlurmCluster, tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    torch = pytest.importorskip("torch")
    if shutil.which("mpiexec") is None:
        pytest.skip("needs OpenMPI's mpiexec")
    c = cluster3
    t0 = time.monotonic()
    run, progress, cfg, rankfile = c.shared / "run", c.shared / "progress.jsonl", c.shared / "run.toml", c.shared / "ranks"
    cfg.write_text(f'[[sync]]\nname = "ckpt"\nfrom = "{c.local}/ckpt"\nto = "{c.shared}/persist/ckpt"\n'
                   'nodes = 2\nsettle = "1s"\nrestore = true\n')
    rankfile.write_text("rank 0=n2 slot=0\nrank 1=n1 slot=0\n")
    job = c.submit(JOB.format(repo=ROOT, python=sys.executable, cfg=cfg, run=run, rankfile=rankfile,
                              train=Path(__file__).parent / "train_mpi.py", local=c.local, steps=STEPS,
                              every=SAVE_EVERY, progress=progress), "-o", str(c.shared / "job.out"))
    leader = run / "events.jsonl"
    wait_for(lambda: any(e.get("kind") == "end" for e in events(leader)), 150,
             lambda: f"the leader's end; job {c.state(job)}; {(c.shared / 'job.out').read_text()[-1500:] if (c.shared / 'job.out').exists() else ''}",
             interval=0.5)
    print(f"mpi: {time.monotonic() - t0:.1f}s", flush=True)
    ev = events(leader)
    end = next(e for e in ev if e.get("kind") == "end")
    out = (c.shared / "job.out").read_text()
    assert end["exit_status"] == 0, (end, out[-3000:])
    start = next(e for e in ev if e.get("kind") == "start")
    assert start["host"] == "n1" and start["nodes"] == ["n1", "n2"], start
    said = [json.loads(x) for x in progress.read_text().splitlines()]
    hosts = {s["rank"]: s["host"] for s in said if s["what"] == "start"}
    assert hosts == {0: "n2", 1: "n1"}, hosts
    saved = [s["step"] for s in said if s["what"] == "saved"]
    assert saved == list(range(SAVE_EVERY, STEPS + 1, SAVE_EVERY)), saved
    # every checkpoint rank 0 saved on n2 is on persistent storage, whole, from node 1's part alone
    dst = c.shared / "persist" / "ckpt"
    for step in saved:
        got = torch.load(dst / f"model_{step:05d}.pt")
        assert got["step"] == step, got
    publishes = {e["checkpoint"]: e for e in ev if e.get("kind") == "publish"}
    assert sorted(publishes) == [f"model_{s:05d}.pt" for s in saved], sorted(publishes)
    assert all(e.get("parts") == {"1": 1} for e in publishes.values()), publishes
    node1 = events(run / "nodes" / "node-1" / "events.jsonl")
    assert next(e for e in node1 if e.get("kind") == "node-start")["host"] == "n2"
    assert {e["checkpoint"] for e in node1 if e.get("kind") == "part"} == set(publishes)
    shutil.copytree(run, tmp_path / "run")  # the journals where the contract check reads every real run's
