"""A node dies, the job goes on (issue 41): recovery inside the allocation on a spare node.

The PyTorch DDP tutorial's multi-node pattern (``ddp_tutorial.py``: global rank 0 saves
``snapshot.pt`` in place every epoch on its node's disk, every rank loads it from its own) under
``srun torchrun --nnodes 2 --nproc-per-node 2``, in a job of three nodes on the 4-node cluster,
``spare_nodes = 1`` and ``#SBATCH --no-kill``: the job script and the training are the
documented ones but for those two lines. A non-batch node is killed mid-run (its slurmd and every
process in its namespaces). Then:

* the job is not requeued (Slurm's restart count stays 0), and it completes;
* attempt 2 runs on the batch node and the spare, and says so (``node-replaced``: the dead node,
  the spare, the new node list, the seconds of each phase; ``node-lost`` for the dead node);
* every rank of attempt 2 resumes from the same epoch, the newest published before the kill,
  and ``restore-versions`` agrees on both nodes, the spare included;
* training runs again (the first epoch line after the resume) within 60 s of the kill;
* the final weights equal a replay of the epochs trained, bit for bit.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.support.journal import events
from tests.support.slurm import SlurmCluster
from tests.support.tutorial_job import RESUMED, TRAINING, replay, resumed_epochs, saved_epochs, tutorial_job
from tests.support.wait import wait_for

EPOCHS = 40
AGAIN_WITHIN_S = 60.0  # the bar: training again within 60 s of the kill, here

DIRECTIVES = ["--nodes=3", "--ntasks-per-node=1", "--no-kill", "--requeue", "--open-mode=append"]


def test_a_dead_node_is_replaced_by_the_spare_without_a_requeue(cluster4: SlurmCluster, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    c = cluster4
    t0 = time.monotonic()
    dst = c.shared / "persist" / "ckpt"
    run, cfg, out = c.shared / "run", c.shared / "run.toml", c.shared / "job.out"
    cfg.write_text('requeue = true\nspare_nodes = 1\n\n'
                   f'[[sync]]\nname = "ckpt"\nfrom = "{c.local}/ckpt"\nto = "{dst}"\n'
                   'nodes = "auto"\nsettle = "1s"\nrestore = true\n')
    job = c.submit(tutorial_job(DIRECTIVES, cfg=cfg, run=run, local=str(c.local), epochs=EPOCHS), "-o", str(out))
    leader = run / "events.jsonl"

    def log(what: str) -> None:
        print(f"spare: {time.monotonic() - t0:.1f}s {what}", flush=True)

    def said() -> str:
        return f"job {c.state(job)}; {out.read_text()[-3000:] if out.exists() else ''}"

    def published(attempt: int) -> list[dict]:
        return [e for e in events(leader) if e.get("kind") == "publish" and e["attempt"] == attempt
                and e.get("checkpoint") == "snapshot.pt"]

    wait_for(lambda: len(published(1)) >= 3, 300, lambda: f"3 versions published in attempt 1; {said()}", interval=0.5)
    start = next(e for e in events(leader) if e.get("kind") == "start")
    assert start["nodes"] == ["n1", "n2"] and start["spares"] == ["n3"], start
    text_before = out.read_text()
    victim = "n2"
    c.kill_node(victim)
    killed, killed_wall = time.monotonic(), time.time()
    log(f"{victim} killed")

    def resumed_lines() -> list[int]:
        tail = out.read_text()[len(text_before):]
        return resumed_epochs(tail)

    def first_epoch_after_resume() -> float | None:
        tail = out.read_text()[len(text_before):]
        at = [m.end() for m in RESUMED.finditer(tail)]
        if len(at) < 4:
            return None
        return time.monotonic() if TRAINING.search(tail[at[-1]:]) else None

    again = wait_for(first_epoch_after_resume, 180, lambda: f"training again after {victim}'s death; {said()}", interval=0.2)
    log(f"training again {again - killed:.1f}s after the kill")
    wait_for(lambda: c.state(job) == "COMPLETED", 300, lambda: f"job {job} completed; {said()}", interval=0.5)
    log("completed")
    shown = c.show(job)
    assert shown.get("Restarts") == "0", shown  # never requeued: it went on inside the allocation
    ev = events(leader)
    text = out.read_text()
    assert "attempt 1 on" not in text, "the batch script ran again: the job was requeued"

    # what the journal says
    replaced = [e for e in ev if e.get("kind") == "node-replaced"]
    assert len(replaced) == 1, replaced
    r = replaced[0]
    assert r["attempt"] == 2 and list(r["lost"]) == [victim] and r["spares"] == ["n3"] and r["nodes"] == ["n1", "n3"], r
    assert "--nodelist=n1,n3" in r["argv"] and r["spares_left"] == [], r
    assert set(r["seconds"]) == {"stop", "between", "restore_launch", "total"}, r
    ends = {e["attempt"]: e for e in ev if e.get("kind") == "end"}
    assert ends[1]["reason"] == "node-failed" and ends[1]["replace"] == [victim], ends[1]
    assert ends[2]["reason"] == "child-exit" and ends[2]["not_durable"] == [], ends[2]
    lost = [e for e in ev if e.get("kind") == "node-lost" and e["attempt"] == 2]
    assert [e["node"] for e in lost] == [victim], lost
    starts = {e["attempt"]: e for e in ev if e.get("kind") == "start"}
    assert starts[2]["nodes"] == ["n1", "n3"] and starts[2]["lost"] == [victim] and starts[2]["spares"] == [], starts[2]

    # every rank resumed from the same epoch: the newest published before the kill
    resumed = resumed_lines()
    assert len(resumed) == 4 and len(set(resumed)) == 1, resumed
    # attempt 1's saves: everything printed before attempt 2's first "Resuming" line (rank 0 on the
    # survivor may save once more between the test's last look and the kill)
    attempt1 = text[:len(text_before) + text[len(text_before):].index("Resuming training from snapshot")]
    saved_before = saved_epochs(text_before)
    saved = saved_epochs(attempt1)
    assert resumed[0] >= saved_before[-1] and resumed[0] in saved[-2:], (resumed, saved_before, saved)  # at most the dead node's last save is lost
    versions = next(e for e in ev if e.get("kind") == "restore-versions" and e["attempt"] == 2)
    assert versions["agree"] and sorted(versions["nodes"]) == ["0", "1"], versions
    assert len({v["ckpt"]["sha256"] for v in versions["nodes"].values()}) == 1, versions
    assert again - killed <= AGAIN_WITHIN_S, f"training again {again - killed:.1f}s after the kill (bar: {AGAIN_WITHIN_S}s)"
    stop = next(e for e in ev if e.get("kind") == "stop" and e["attempt"] == 1)
    spawn = next(e for e in ev if e.get("kind") == "spawn" and e["attempt"] == 2)
    log(f"resumed at {resumed[0]} on n1+n3; kill → stop {stop['t'] - killed_wall:.1f}s ({stop['detail']}), "
        f"→ spawn {spawn['t'] - killed_wall:.1f}s, → training {again - killed:.1f}s; node-replaced seconds {r['seconds']}")

    # the final weights: a replay of the epochs trained (attempt 1 from 0 to the epoch resumed at, which the
    # tutorial trains again; attempt 2 from there to the end)
    final = torch.load(dst / "snapshot.pt")
    assert final["EPOCHS_RUN"] == EPOCHS - 1, final["EPOCHS_RUN"]
    trained = [*range(0, resumed[0] + 1), *range(resumed[0], EPOCHS)]
    want = replay(trained, tmp_path / "replay.pt")
    assert all(torch.equal(final["MODEL_STATE"][k], want[k]) for k in want), (trained, final["MODEL_STATE"], want)
    log(f"the final weights equal the replay of {len(trained)} epochs")
    shutil.copytree(run, tmp_path / "run")  # the journals where the contract check reads every real run's
