"""A sister node dies under a real OpenPBS, the job goes on on a spare (issue 41).

An ezpz-style job as a PBS user writes it: ``qsub -l select=3:ncpus=1 -l place=scatter -W
tolerate_node_failures=all``, ``mpirun --hostfile $PBS_NODEFILE -np 2 --map-by node`` over the
DDP tutorial's pattern (``ddp_tutorial.py`` through ``ompi_rank.py``: rank 0 rewrites
``snapshot.pt`` on its node, every rank loads it from its own disk), ``spare_nodes = 1``. The
sister n2 dies (its mom and every process in its namespaces killed; nobody marks it offline):

* the job is not rerun for it (one run of the script holds attempts 1 and 2);
* attempt 2 runs on n1 and the spare n3: supervise's nodefile for it names n1 and n3 only, and the
  command's ``$PBS_NODEFILE`` is that file (``node-replaced``);
* every rank of attempt 2 resumes from the same epoch, the newest saved before the kill;
* training runs again within 60 s of the kill;
* then the spare n3 dies too: no spare is left (``replace`` says so), the job is requeued with
  ``qrerun`` as without spares, and the rerun (attempt 3, n2 and n3 back) finishes, exit status 0.
"""

from __future__ import annotations

import time

import pytest

from tests.support.journal import events
from tests.support.paths import ROOT
from tests.support.pbs import PbsCluster
from tests.support.pbs_jobs import kinds, pbs_torch, setup_job
from tests.support.tutorial_job import TRAINING, resumed_epochs, saved_epochs
from tests.support.wait import wait_for

AGAIN_WITHIN_S = 60.0


def test_a_dead_sister_is_replaced_by_the_spare_without_a_rerun(pbs: PbsCluster) -> None:
    pbs_torch()
    pytest.importorskip("torch")
    t0 = time.monotonic()
    pbs.qmgr("set queue workq kill_delay = 10", "set server operators = alice@*")  # qrerun, once no spare is left
    work, local = setup_job(pbs, "spare", "persist", f"--chdir {{local}}/ckpt {ROOT}/tests/multinode/ddp_tutorial.py 40 1",
                            port=503, extra='grace = "3s"\nrequeue = true\nspare_nodes = 1\n')
    script = (work / "job.pbs").read_text()
    script = script.replace("#PBS -l select=2:ncpus=1", "#PBS -l select=3:ncpus=1\n#PBS -W tolerate_node_failures=all")
    script = script.replace("#PBS -l walltime=00:01:00", "#PBS -l walltime=00:10:00")
    (work / "job.pbs").write_text(script)
    jobid = pbs.qsub(work, str(work / "job.pbs"))
    leader, logs = work / "run" / "events.jsonl", work / "logs"

    def said() -> str:
        out = [f"job {pbs.state(jobid)}"]
        for p in (work / "job.out", logs / "rank-0.out", logs / "rank-1.out", work / "run" / "supervise.log"):
            if p.exists():
                out.append(f"--- {p.name}\n{p.read_text()[-2500:]}")
        return "\n".join(out)

    def log(what: str) -> None:
        print(f"pbs spare: {time.monotonic() - t0:.1f}s {what}", flush=True)

    def published(nth: int) -> list[dict]:
        """What the leader's ``nth`` attempt published (under PBS its number can skip: ``kinds``)."""
        return [e for e in kinds(events(leader), "publish", nth) if e.get("checkpoint") == "snapshot.pt"
                and e.get("trigger") != "offer"]

    def attempts(rank: int) -> list[str]:
        path = logs / f"rank-{rank}.out"
        return path.read_text().split("=== rank ")[1:] if path.exists() else []

    wait_for(lambda: len(published(1)) >= 3, 120, lambda: f"three epochs published in attempt 1: {said()}")
    start = kinds(events(leader), "start")[0]
    assert start["nodes"] == ["n1", "n2"] and start["spares"] == ["n3"], start
    killed = time.monotonic()
    try:
        pbs.kill_node("n2")
        log("n2 killed")

        def training_again() -> float | None:
            a = [x for r in (0, 1) for x in attempts(r)[1:2]]
            ok = len(a) == 2 and all(TRAINING.search(x) for x in a)
            return time.monotonic() if ok else None

        again = wait_for(training_again, 180, lambda: f"both ranks training again: {said()}", interval=0.2)
        log(f"training again {again - killed:.1f}s after the kill")
        # then the spare dies too: no spare is left, so the job is requeued (qrerun) as without spares
        pbs.revive_node("n2")
        wait_for(lambda: len(published(2)) >= 2, 120, lambda: f"two epochs published on n1+n3: {said()}")
        pbs.kill_node("n3")
        log("n3 killed: no spare left")
        wait_for(lambda: [e for e in kinds(events(leader), "stop-step") if e["step"] == "requeue" and e.get("requeued")],
                 120, lambda: f"the job requeued after n3's death: {said()}")
        pbs.revive_node("n3")
        info = pbs.wait_state(jobid, "F", timeout=300)
    finally:
        pbs.revive_node("n2")
        pbs.revive_node("n3")
    log("finished")
    assert info.get("Exit_status") == 0, (info.get("Exit_status"), said())
    evs = events(leader)
    replaced = kinds(evs, "node-replaced")
    assert len(replaced) == 1 and list(replaced[0]["lost"]) == ["n2"] and replaced[0]["nodes"] == ["n1", "n3"], replaced
    # the first death was absorbed by the first attempt's job run (no rerun between attempts 1 and 2: the same
    # batch script, one `start` of the script in runs.txt for both); the second, with no spare, was requeued
    runs = (work / "runs.txt").read_text().splitlines()
    starts = kinds(evs, "start")
    assert len(starts) == 3 and len(runs) == 2, (starts, runs)
    assert [s["nodes"] for s in starts] == [["n1", "n2"], ["n1", "n3"], ["n1", "n2"]], [s["nodes"] for s in starts]
    refused = [e for e in kinds(evs, "stop-step") if e["step"] == "replace" and not e.get("replaced")]
    assert [e["why"] for e in refused] == ["no spare node left"], refused
    nodefile = work / "run" / "nodes" / "nodefile-n1-n3"
    assert nodefile.read_text().split() == ["n1", "n3"], nodefile.read_text()
    assert str(nodefile) in replaced[0]["argv"], replaced[0]["argv"]
    ends = {e["attempt"]: e for e in kinds(evs, "end")}
    first, second, third = sorted(ends)
    assert [ends[a]["reason"] for a in (first, second, third)] == ["node-failed", "node-failed", "child-exit"], ends
    assert ends[third]["exit_status"] == 0 and ends[third]["not_durable"] == [], ends[third]
    hosts = {r: [a.split()[2] for a in attempts(r)] for r in (0, 1)}
    assert sorted(h[1] for h in hosts.values()) == ["n1", "n3"], hosts
    saved = [e for r in (0, 1) for a in attempts(r)[:1] for e in saved_epochs(a)]
    resumed = [resumed_epochs(attempts(r)[1]) for r in (0, 1)]
    assert resumed[0] == resumed[1] and len(resumed[0]) == 1 and resumed[0][0] in sorted(saved)[-2:], (resumed, saved)
    rv = kinds(evs, "restore-versions", 2)[0]
    assert rv["agree"] and set(rv["nodes"]) == {"0", "1"}, rv
    assert again - killed <= AGAIN_WITHIN_S, f"training again {again - killed:.1f}s after the kill (bar {AGAIN_WITHIN_S}s)"
    log(f"resumed at {resumed[0][0]} on {hosts}; node-replaced seconds {replaced[0]['seconds']}; "
        f"stop reason {ends[first]['detail']}")
