"""A node's death to training again, in phases: inside the allocation on a spare, and by requeue,
side by side on the same cluster and the same job (issue 41, docs/multinode.md "Spare nodes").

The job is the DDP tutorial's pattern (``tests/multinode/ddp_tutorial.py``: rank 0 rewrites
``snapshot.pt`` every epoch, every rank loads it from its own disk) under ``srun torchrun
--nnodes 2 --nproc-per-node 2`` on the 4-node test cluster (``scripts/slurm-up.sh``), killed on
its non-batch node n2 once three epochs are published:

* **spare**: ``#SBATCH --nodes=3 --no-kill``, ``spare_nodes = 1``: the job goes on on n3;
* **requeue**: ``#SBATCH --nodes=2 --requeue``, ``requeue = true``: Slurm ends the job and
  requeues it; the bench releases it at once (``StartTime=now``, as an admin would: the test
  cluster is otherwise idle), so the requeue column holds no queue wait. On a real cluster the
  requeue path adds the queue wait for a whole new allocation, which ``supervise report``
  measures per attempt.

Phases, from the kill (wall clock) and the leader's journal, each run's own:

* detection: the kill → the attempt's ``stop`` (``node-failed``, seen by the node watch; spare
  only: a requeued job's leader dies with its job, so nothing of it is separate);
* stop: → the attempt's ``end`` (spare only);
* restart: → the next attempt's ``start`` (spare: from the end, a new plan in the same process;
  requeue: from the kill, Slurm calling the node down, ending and requeueing the job, the
  release, the new batch script, supervise's start);
* restore: → its ``restore-versions`` (node agents up, every node offered, chose, restored);
* launch: → its ``spawn``;
* training: → the first epoch line after the resume (torchrun and four ranks starting).

    .venv/bin/python bench/recovery.py            # both, 40 epochs of 1 s

Needs root (namespaces), Slurm and torch; the cluster lives under /var/tmp and is torn down after.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.slurm import SlurmCluster, down, up  # noqa: E402
from tests.support.tutorial_job import tutorial_job  # noqa: E402
from tests.support.wait import wait_for  # noqa: E402



def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def one(c: SlurmCluster, kind: str) -> dict[str, float | None]:
    spare = kind == "spare"
    name = f"{kind}-{time.time_ns()}"
    run, cfg, out = c.shared / name / "run", c.shared / name / "run.toml", c.shared / name / "job.out"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(f'requeue = true\n{"spare_nodes = 1" if spare else ""}\n\n'
                   f'[[sync]]\nname = "ckpt"\nfrom = "{c.local}/{name}/ckpt"\nto = "{c.shared / name / "persist"}"\n'
                   'nodes = "auto"\nsettle = "1s"\nrestore = true\n')
    directives = ["--nodes=3", "--no-kill"] if spare else ["--nodes=2"]
    directives += ["--ntasks-per-node=1", "--requeue", "--open-mode=append"]
    job = c.submit(tutorial_job(directives, cfg=cfg, run=run, local=f"{c.local}/{name}", epochs=40), "-o", str(out))
    leader = run / "events.jsonl"
    wait_for(lambda: len([e for e in events(leader) if e.get("kind") == "publish"]) >= 3, 300,
             lambda: f"three publishes; {out.read_text()[-2000:] if out.exists() else ''}")
    before = out.read_text()
    killed = time.time()
    if spare:
        c.kill_node("n2")
    else:
        c.node_dies(job, "n2")  # Slurm requeues; released at once

    def again() -> float | None:
        tail = out.read_text()[len(before):]
        at = [m.end() for m in re.finditer(r"^Resuming training from snapshot at Epoch \d+", tail, flags=re.M)]
        return time.time() if len(at) >= 4 and re.search(r"^\[GPU\d\] Epoch \d+ \|", tail[at[-1]:], flags=re.M) else None

    training = wait_for(again, 300, "training again", interval=0.1)
    ev = events(leader)

    def first(k: str, attempt: int) -> float:
        return next(e["t"] for e in ev if e.get("kind") == k and e["attempt"] == attempt)

    second = max(e["attempt"] for e in ev)
    first_attempt = min(e["attempt"] for e in ev)
    stop = next((e["t"] for e in ev if e.get("kind") == "stop" and e["attempt"] == first_attempt), None)
    end = next((e["t"] for e in ev if e.get("kind") == "end" and e["attempt"] == first_attempt), None)
    start = first("start", second)
    if spare:
        assert stop is not None and end is not None, "the spare run's first attempt has a stop and an end"
    phases: dict[str, float | None] = {
              "detection": stop - killed if spare and stop else None,  # requeued: the job dies with the node
              "stop": end - stop if spare and stop and end else None,
              "restart": start - (end if spare and end else killed),
              "restore": first("restore-versions", second) - start,
              "launch": first("spawn", second) - first("restore-versions", second),
              "training": training - first("spawn", second)}
    phases["total"] = training - killed
    return phases


def main() -> None:
    c = up(4)
    try:
        rows = {}
        for kind in ("spare", "requeue"):
            rows[kind] = one(c, kind)
            print(f"{kind}: " + ", ".join(f"{k} {_s(v)}" for k, v in rows[kind].items()), flush=True)
            if kind == "spare":  # n2 back for the requeue run
                down(c)
                c = up(4)
    finally:
        down(c)
    print(f"\n{'phase':<10} {'spare':>8} {'requeue':>8}")
    for k in rows["spare"]:
        print(f"{k:<10} {_s(rows['spare'][k]):>8} {_s(rows['requeue'][k]):>8}")
    spare_total, requeue_total = rows["spare"]["total"], rows["requeue"]["total"]
    assert spare_total and requeue_total
    print(f"\nratio (requeue / spare, total, no queue wait on this idle cluster): {requeue_total / spare_total:.2f}")


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}s"


if __name__ == "__main__":
    main()
