"""HF ``Trainer`` across nodes (issue 29): ``torchrun --nnodes 2`` on every node of the job.

``hf_nodes.py`` is written as HF's example scripts are: ``checkpoint-N/`` every
``save_steps`` into ``out/`` on each node's local disk, resumed from
``get_last_checkpoint(output_dir)`` on the rank's own disk. With ``save_on_each_node`` false
(the default) global rank 0's node writes the model, optimizer and ``trainer_state.json``
while every rank writes its ``rng_state_R.pth`` on its own node: one checkpoint in parts on
two nodes. With it true, each node writes a checkpoint of its own (here without the model,
and with its own ``trainer_state.json``: node 0's view is published, with every node's random
states; the long set runs it, five minutes more). Under the documented config
(``nodes = "auto"``, ``restore = true``) on a 4-node cluster, through the four interruptions
of a multi-node job: the time limit (supervise stops ahead of it and requeues), a requeue onto
other nodes, the death of a non-batch node, the death of the batch node (the leader with it):

* every checkpoint rank 0 saved is published while the job runs (one ``publish`` a save);
* every rank on every node resumes from the same step, the newest published before the
  interruption (after a clean stop exactly the last saved), and the leader journals what
  each node held at the spawn (``restore-versions``, all the same);
* the final weights equal an uninterrupted replay's bit for bit: each rank resumed its own
  random state (dropout), so node 1's ``rng_state_2/3.pth`` were published and restored.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.journal import events
from tests.support.paths import ROOT
from tests.support.slurm import SlurmCluster, attempts_of

MAX_STEPS, SAVE_STEPS = 160, 5
TRAIN = Path(__file__).parent / "hf_nodes.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"

JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --time=1
cd {repo}
echo "attempt ${{SLURM_RESTART_COUNT:-0}} on $SLURM_JOB_NODELIST"
export STEP_SLEEP=0.3 OMP_NUM_THREADS=1
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)
exec {python} -m supervisor --config {cfg} --run-dir {run} -- \\
  srun --ntasks-per-node=1 --chdir={local} {torchrun} --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d \\
  --rdzv-endpoint=$HEAD:29500 --rdzv-id=$SLURM_JOB_ID-$SLURM_RESTART_COUNT {train} {steps} {every} {each}
"""


# Both in the long set: CI keeps the DDP tutorial and Lightning through the four interruptions,
# and this one (about 6 minutes under CI's load) would take it past its 40 minutes (issue 31).
LONG = pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")


@pytest.mark.parametrize("each", [pytest.param(False, marks=LONG), pytest.param(True, marks=LONG)],
                         ids=["rank0-node", "each-node"])
def test_hf_trainer_across_nodes_through_the_four_interruptions(cluster4: SlurmCluster, tmp_path: Path, each: bool) -> None:
    pytest.importorskip("transformers")
    safetensors = pytest.importorskip("safetensors.torch")
    c = cluster4
    t0 = time.monotonic()
    run, cfg, out = c.shared / "run", c.shared / "run.toml", c.shared / "job.out"
    dst = c.shared / "persist" / "out"
    cfg.write_text('requeue = true\nmax_requeues = 8\n\n'
                   f'[[sync]]\nname = "out"\nfrom = "{c.local}/out"\nto = "{dst}"\n'
                   'nodes = "auto"\nsettle = "1s"\nrestore = true\n')
    job = c.submit(JOB.format(repo=ROOT, python=sys.executable, cfg=cfg, run=run, local=c.local, torchrun=TORCHRUN,
                              train=TRAIN, steps=MAX_STEPS, every=SAVE_STEPS, each=int(each)), "-o", str(out))
    leader = run / "events.jsonl"

    def publishes(attempt: int) -> list[dict]:
        return [e for e in events(leader) if e.get("kind") == "publish" and e["attempt"] == attempt
                and str(e.get("checkpoint", "")).startswith("checkpoint-")]

    def said() -> str:
        return f"job {c.state(job)}; {out.read_text()[-2500:] if out.exists() else ''}"

    def log(what: str) -> None:
        print(f"hf[{'each' if each else 'rank0'}]: {time.monotonic() - t0:.1f}s {what}", flush=True)

    c.four_interruptions(job, lambda a: len(publishes(a)), said, log)
    ev = events(leader)
    text = attempts_of(out.read_text())
    assert sorted(text) == [1, 2, 3, 4, 5], sorted(text)
    ends = {e["attempt"]: e for e in ev if e.get("kind") == "end"}
    assert ends[1]["reason"] == "deadline" and ends[1]["not_durable"] == [], ends[1]
    saved_before: list[int] = []
    for a in (1, 2, 3, 4, 5):
        starts = re.findall(r"^rank (\d) starts at step (\d+) from (\S+)", text[a], flags=re.M)
        assert sorted(int(r) for r, _, _ in starts) == [0, 1, 2, 3], (a, starts)
        steps = {int(s) for _, s, _ in starts}
        assert len(steps) == 1, (a, starts)  # every rank on every node: the same step
        start = steps.pop()
        if a == 1:
            assert start == 0, starts
        else:
            assert {f for _, _, f in starts} == {f"checkpoint-{start}"}, starts
            if a in (2, 3):  # a clean stop: the last checkpoint saved is where every rank goes on
                assert start == saved_before[-1], (a, start, saved_before[-3:])
            else:  # a node died: at most its last save
                assert start in saved_before[-2:], (a, start, saved_before[-3:])
        saved = [int(s) for s in re.findall(r"^saved checkpoint-(\d+)", text[a], flags=re.M)]
        published = {int(e["checkpoint"].split("-")[1]) for e in publishes(a)}
        if a in (1, 2, 5):  # a clean end: every checkpoint saved was published, the last at the end
            assert set(saved) <= published, (a, sorted(set(saved) - published))
        versions = next(e for e in ev if e.get("kind") == "restore-versions" and e["attempt"] == a)
        assert versions["agree"] and sorted(versions["nodes"]) == ["0", "1"], versions
        spawn = next(e["t"] for e in ev if e.get("kind") == "spawn" and e["attempt"] == a)
        assert not [e for e in ev if e.get("kind") == "sync-deferred" and e["attempt"] == a and e["t"] > spawn]
        lags = sorted(e["lag_s"] for e in publishes(a) if e.get("lag_s") is not None)
        log(f"attempt {a}: starts at {start}, {len(saved)} saved, {len(published)} published, "
            f"lag max {lags[-1] if lags else None}s")
        saved_before += saved
    assert ends[5]["reason"] == "child-exit" and ends[5]["not_durable"] == [], ends[5]
    final = dst / f"checkpoint-{MAX_STEPS}"
    assert sorted(p.name for p in final.glob("rng_state_*.pth")) == [f"rng_state_{r}.pth" for r in range(4)]

    # the replay: the same training, uninterrupted, on one machine with the same world size
    replay = tmp_path / "replay"
    replay.mkdir()
    proc = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node=4", str(TRAIN), str(MAX_STEPS),
                           str(SAVE_STEPS), str(int(each))], cwd=replay, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "STEP_SLEEP": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = safetensors.load_file(final / "model.safetensors")
    want = safetensors.load_file(replay / "out" / f"checkpoint-{MAX_STEPS}" / "model.safetensors")
    assert sorted(got) == sorted(want)
    differ = {k: float((got[k] - want[k]).abs().max()) for k in got if not bool((got[k] == want[k]).all())}
    assert not differ, differ
    log("the final weights equal the replay's")
