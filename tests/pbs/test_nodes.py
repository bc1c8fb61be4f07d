"""Multi-node jobs under a real OpenPBS (issue 31): the leader starts its node agents itself.

Each test is a real ``qsub -l select=2:ncpus=1 -l place=scatter`` script job of the job user
on the session's 3-mom cluster, with this tree's ``supervise`` leading and the training
launched across both nodes as a PBS user does it: OpenMPI ``mpirun --hostfile $PBS_NODEFILE
--map-by node`` over ``pbs_tmrsh`` (``tests/pbs/tmrsh``), each rank a small torch (gloo, CPU)
training whose MPI rank variables ``ompi_rank.py`` maps to torch's. No agent line is in the
job script: the leader starts one ``supervise node-agent`` per other node with ``pbsdsh -o
-h HOST`` (conduct/fleet.py), a TM task of that node's mom.

* ``test_shards_rerun_and_a_dead_sister``: DCP, every rank saves its shard to its node's
  ``ROOT/local``; each step is published only once both nodes' parts are there; an admin's
  ``qrerun`` restores the newest and the training resumes from it; then the sister n2 dies
  (every process in its namespaces killed): a node failure (``node-failed``: PBS calls n2
  down), supervise requeues itself with ``qrerun`` (alice an operator; ``requeue = true``
  alone, the documented config), the rerun runs on n1+n3 (n2 offline), journals
  ``node-lost`` n2, restores the newest whole checkpoint on the new node and finishes with
  the uninterrupted run's weights.
* ``test_rank0_in_place_moves_node_then_qdel``: the PyTorch DDP tutorial's pattern (rank 0
  rewrites ``snapshot.pt`` on its node, every rank loads it from its own disk): a rerun onto
  n2+n3 (n1 offline), so rank 0's node changes and n3 starts empty, and every rank resumes
  from the same newest epoch; then ``qdel``: PBS TERMs only the first node, and the rank on
  the sister node still gets TERM (supervise's stop through mpirun) before PBS's KILL, with
  the last saved epoch published before supervise's ``end``.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.journal import events
from tests.support.paths import ROOT
from tests.support.pbs import PbsCluster
from tests.support.pbs_jobs import kinds, number, pbs_torch, setup_job
from tests.support.tutorial_job import resumed_epochs, saved_epochs
from tests.support.wait import wait_for

def test_shards_rerun_and_a_dead_sister(pbs: PbsCluster) -> None:
    pbs_torch()
    torch = pytest.importorskip("torch")
    from tests.multinode.train_dcp import reference

    t0, w0 = time.monotonic(), time.time()
    pbs.qmgr("set queue workq kill_delay = 5", "set server operators = alice@*")
    steps = 36
    work, local = setup_job(
        pbs, "shards", "persist", f"{ROOT}/tests/multinode/train_dcp.py --out {{local}}/ckpt --steps {steps} "
        "--save-every 3 --step-sleep 0.25 --progress {work}/progress.jsonl --final {work}/final.pt", port=501,
        # the documented config, no requeue_on_failure; max_requeues above PBS's run_count, which also counts
        # starts that never reached the script (3 for the second run of it, seen under load)
        extra='grace = "3s"\nrequeue = true\nmax_requeues = 6\n')
    script = (work / "job.pbs").read_text()  # train_dcp.py loads what supervise restored, on every node
    (work / "job.pbs").write_text(script.replace("-x EPOCH_SLEEP", "-x EPOCH_SLEEP -x SUPERVISE_RESTORED_FROM"))
    jobid = pbs.qsub(work, str(work / "job.pbs"))
    leader, persist = work / "run" / "events.jsonl", work / "persist"
    progress = work / "progress.jsonl"

    def said() -> str:
        out = [f"job {pbs.state(jobid)}"]
        for p in (work / "runs.txt", progress, work / "job.out", *sorted((work / "run").glob("supervise.log"))):
            if p.exists():
                out.append(f"--- {p.name}\n{p.read_text()[-2500:]}")
        return "\n".join(out)

    def published(attempt: int) -> list[str]:
        """What the attempt's training saved and the leader published (not what its start
        offered: a previous attempt's last save)."""
        return [e["checkpoint"] for e in kinds(events(leader), "publish", attempt)
                if e.get("pair") == "ckpt" and e.get("trigger") != "offer"]

    # attempt 1 on n1+n2: every published step holds both ranks' shards
    wait_for(lambda: len(published(1)) >= 2, 90, lambda: f"two steps published in attempt 1: {said()}")
    pbs.admin("qrerun", jobid)
    wait_for(lambda: published(2), 90, lambda: f"a step published in attempt 2: {said()}")
    # then the sister dies; an operator marks it offline, so PBS never reruns the job there
    pbs.admin("pbsnodes", "-o", "-C", "test: n2 died", "n2")
    t_kill = time.time()
    pbs.kill_node("n2")
    try:
        info = pbs.wait_state(jobid, "F", timeout=150)
    finally:
        pbs.revive_node("n2")
    evs = events(leader)
    starts = kinds(evs, "start")
    assert [s["nodes"] for s in starts] == [["n1", "n2"], ["n1", "n2"], ["n1", "n3"]], said()
    assert info.get("Exit_status") == 0 and int(info.get("run_count", 0)) >= 3, (info.get("Exit_status"), said())

    # every attempt: the agent on the other node was started by the leader and ready before the spawn
    agents = kinds(evs, "node-agents")
    assert [a["ready"] for a in agents] == [[1], [1], [1]] and all(a["launcher"] == "pbsdsh" for a in agents), agents
    for a in (1, 2, 3):
        ag = kinds(evs, "node-agents", a)[0]
        spawn = kinds(evs, "spawn", a)
        assert spawn and spawn[0]["t"] >= ag["t"], (a, ag, spawn)
    node1 = events(work / "run" / "nodes" / "node-1" / "events.jsonl")
    assert [e["host"] for e in kinds(node1, "node-start")] == ["n2", "n2", "n3"], kinds(node1, "node-start")

    # (a) every published step has both ranks' shards and rank 0's metadata, and none was partial
    pubs = [e for e in kinds(evs, "publish") if e.get("pair") == "ckpt"]
    assert pubs and all(e["why"] == "all 2 parts" for e in pubs), pubs
    for e in pubs:
        d = persist / e["checkpoint"]
        assert {p.name for p in d.iterdir()} >= {".metadata", "__0_0.distcp", "__1_0.distcp"}, (d, list(d.iterdir()))
    # each attempt resumed from the newest step published before it started
    runs = [json.loads(line) for line in progress.read_text().splitlines()]
    begun = [r for r in runs if r["what"] == "start"]
    assert len(begun) == 3, runs
    for a, r in zip((2, 3), begun[1:]):
        before = sorted(e["checkpoint"] for e in pubs if e["t"] < kinds(evs, "start", a)[0]["t"])
        assert r["step"] == int(before[-1].split("_")[1]) and r["restored"].endswith(before[-1]), (a, r, before)
        rv = kinds(evs, "restore-versions", a)[0]
        assert rv["agree"] and rv["choice"] == {"ckpt": before[-1]}, rv
    # (c) the dead sister: a node failure (issue 42: PBS as Slurm, seen by the node watch or the stop's
    # `nodes` step), supervise requeued itself with `requeue = true` alone, named n2
    end2 = kinds(evs, "end", 2)[0]
    assert end2["reason"] == "node-failed" and "n2" in end2["detail"] and end2["t"] > t_kill - 1, end2
    requeue = [e for e in kinds(evs, "stop-step", 2) if e["step"] == "requeue"]
    assert requeue and requeue[0]["requeued"] and requeue[0]["t"] < end2["t"], requeue
    lost = kinds(evs, "node-lost", 3)
    assert [(x["node"], x["index"], x["in_attempt"], x["scheduler"]) for x in lost] == [("n2", 1, number(evs, 2), "pbs")], lost
    assert "offline" in lost[0]["state"], lost
    # the job ends with the weights of an uninterrupted run
    end3 = kinds(evs, "end", 3)
    assert [(e["reason"], e["exit_status"], e["not_durable"]) for e in end3] == [("child-exit", 0, [])], end3
    assert torch.equal(torch.load(work / "final.pt"), reference(steps, world=2)), said()
    print(f"\nshards: agents ready {[a['seconds'] for a in agents]} s; publish lag "
          f"{sorted(e['lag_s'] for e in pubs if e.get('lag_s') is not None)}; killed n2 at +{t_kill - w0:.1f}s; "
          f"attempt 2 ended {end2['t'] - t_kill:.1f}s after the kill; test {time.monotonic() - t0:.0f} s")


def test_rank0_in_place_moves_node_then_qdel(pbs: PbsCluster) -> None:
    pbs_torch()
    torch = pytest.importorskip("torch")
    t0 = time.monotonic()
    # the stop's budget after qdel is the kill delay less MoM's early KILL (with 5: 2.8 s, measured), too
    # little for the ranks' last save after their TERM, grace 3 s and the last flush; with 10 it fits
    pbs.qmgr("set queue workq kill_delay = 10")
    work, local = setup_job(pbs, "ddp", "persist", f"--chdir {{local}}/ckpt --term-after 1 {ROOT}/tests/multinode/ddp_tutorial.py 400 1",
                            port=502, extra='grace = "3s"\n')
    jobid = pbs.qsub(work, str(work / "job.pbs"))
    leader, logs = work / "run" / "events.jsonl", work / "logs"

    def said() -> str:
        out = [f"job {pbs.state(jobid)}"]
        for p in (work / "runs.txt", work / "job.out", logs / "rank-0.out", logs / "rank-1.out", work / "run" / "supervise.log"):
            if p.exists():
                out.append(f"--- {p.name}\n{p.read_text()[-2000:]}")
        return "\n".join(out)

    def published(attempt: int) -> list[dict]:
        return [e for e in kinds(events(leader), "publish", attempt)
                if e.get("checkpoint") == "snapshot.pt" and e.get("trigger") != "offer"]

    def attempts(rank: int) -> list[str]:
        """The rank's output, one item per attempt (ompi_rank.py heads each with ``=== rank``)."""
        return (logs / f"rank-{rank}.out").read_text().split("=== rank ")[1:]

    wait_for(lambda: len(published(1)) >= 3, 90, lambda: f"three epochs published in attempt 1: {said()}")
    pbs.admin("pbsnodes", "-o", "-C", "test: n1 taken out", "n1")  # the rerun lands on n2+n3: rank 0 moves to n2
    try:
        pbs.admin("qrerun", jobid)
        wait_for(lambda: len(published(2)) >= 2, 90, lambda: f"two epochs published in attempt 2: {said()}")
        t_qdel = time.time()
        pbs.user("qdel", jobid)
        info = pbs.wait_state(jobid, "F", timeout=60)
    finally:
        pbs.admin("pbsnodes", "-c", "n1", check=False)
    evs = events(leader)
    assert [s["nodes"] for s in kinds(evs, "start")] == [["n1", "n2"], ["n2", "n3"]], said()
    assert [a["ready"] for a in kinds(evs, "node-agents")] == [[1], [1]], kinds(evs, "node-agents")
    # each agent's ready time after the launch, within the leader's wait (bench/scale.py reads it)
    assert all(list(a["ready_s"]) == ["1"] and 0 < a["ready_s"]["1"] <= a["seconds"]
               for a in kinds(evs, "node-agents")), kinds(evs, "node-agents")
    # under PBS too, every agent was on the leader's line (conduct/link.py) before it was ready
    assert [a["linked"] for a in kinds(evs, "node-agents")] == [[1], [1]], kinds(evs, "node-agents")

    # (b) attempt 1: rank 0 on n1 rewrote snapshot.pt there; attempt 2: rank 0 on n2, n3 new, and
    # every rank loaded the same, newest epoch: the last one rank 0 saved before the rerun
    saved = [saved_epochs(a) for a in attempts(0)]
    resumed = {r: [resumed_epochs(a) for a in attempts(r)] for r in (0, 1)}
    hosts = {r: [a.split()[2] for a in attempts(r)] for r in (0, 1)}
    assert hosts == {0: ["n1", "n2"], 1: ["n2", "n3"]}, hosts
    assert resumed[0][0] == resumed[1][0] == [], resumed
    assert resumed[0][1] == resumed[1][1] == [saved[0][-1]], (resumed, saved[0][-3:])
    rv = kinds(evs, "restore-versions", 2)[0]
    assert rv["agree"] and rv["choice"] == {"ckpt": "snapshot.pt"} and set(rv["nodes"]) == {"0", "1"}, rv
    assert all(e["why"] == "whole on node 0" for e in published(1)) and all(e["why"] == "whole on node 0" for e in published(2))

    # (d) qdel: PBS TERMs only n2 (the first node); the rank on n3 got TERM too, from supervise's
    # node agent there (the leader journals ``nodes-signal``, the agent sends it to the job's rank
    # on its node and names the pid), while it was alive: before PBS's KILL (which no handler logs);
    # the last saved epoch was published before supervise's end
    sigs = [json.loads(line) for line in (logs / "signals.jsonl").read_text().splitlines()]
    term = {s["host"]: s["t"] - t_qdel for s in sigs if s["what"] == "SIGTERM" and s["t"] > t_qdel}
    assert "n2" in term, (sigs, said())  # rank 0, the first node: mpirun's TERM after supervise's
    assert "n3" in term and term["n3"] < 10, (sigs, said())  # the sister's rank, by supervise's agent on n3, within kill_delay
    sister = [s for s in sigs if s["what"] == "start" and s["host"] == "n3" and s["t"] > kinds(evs, "start", 2)[0]["t"]]
    asked = kinds(evs, "nodes-signal", 2)
    assert [(a["signal"], a["nodes"]) for a in asked] == [("SIGTERM", [1])], asked
    answered = [e for e in kinds(events(work / "run" / "nodes" / "node-1" / "events.jsonl"), "node-signal")
                if e["request"] == asked[0]["request"]]
    assert [(e["signal"], e["pids"]) for e in answered] == [("SIGTERM", [sister[-1]["pid"]])], (answered, sister)
    stopped = [e for e in kinds(evs, "stop-step", 2) if e["step"] == "stop-child"]
    assert stopped[0]["nodes_signalled"]["nodes"] == {"1": {"host": "n3", "pids": [sister[-1]["pid"]]}}, stopped
    end = kinds(evs, "end", 2)
    assert end and end[0]["not_durable"] == [], (end, said())
    last = torch.load(work / "persist" / "snapshot.pt")["EPOCHS_RUN"]
    assert last == saved[1][-1], (last, saved[1][-3:])
    stop = kinds(evs, "stop", 2)[0]
    print(f"\nddp: agents ready {[a['seconds'] for a in kinds(evs, 'node-agents')]} s; publish lag "
          f"{sorted(e['lag_s'] for e in published(1) + published(2))}; qdel → supervise's stop {stop['t'] - t_qdel:.2f}s, "
          f"TERM on {({h: round(v, 2) for h, v in term.items()})}, end {end[0]['t'] - t_qdel:.2f}s; "
          f"Exit_status {info.get('Exit_status')}; test {time.monotonic() - t0:.0f} s")
