"""Per-node rows of ``supervise report`` on a multi-node run directory (docs/report.md, "Nodes").

The run directory is planted in the documented shape of a 3-attempt, 2-node job (the bar
test's story, tests/multinode/test_bar.py, which checks the same rows on a real cluster):
attempt 1 on n1+n2, attempt 2 on n2+n3 (n1 left out), n3 dies in attempt 2 (its agent
leaves no ``end``; attempt 3 journals ``node-lost``), attempt 3 on n1+n2. The leader's
``gpu.csv``/``host.csv`` hold node 0's samples, ``nodes/node-1/`` node 1's, which is n2, then
n3, then n2 again: every row must land on the host that held the rank at its time. The
report runs as the real CLI (``python -m supervisor report``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.report import facts_of

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000.0
GPU_HEAD = "time,gpu,uuid,util_gpu_pct,mem_used_mib,mem_total_mib,proc_mem_mib,power_w,temp_c,energy_j,clock_events\n"
HOST_HEAD = "time,nprocs,cpu_pct,rss_mib,node_mem_total_mib,node_mem_available_mib,load1\n"
# (attempt, nodes, start, end or None: killed)
ATTEMPTS = [(1, ["n1", "n2"], 0.0, 100.0), (2, ["n2", "n3"], 200.0, 300.0), (3, ["n1", "n2"], 400.0, 500.0)]
UTIL = {"n1": 80.0, "n2": 40.0, "n3": 10.0}  # each host's GPU utilisation, wherever its rank was
AVAIL = {"n1": 5000, "n2": 3000, "n3": 1000}


def ev(t: float, attempt: int, kind: str, **kw: object) -> str:
    return json.dumps({"v": 1, "t": T0 + t, "attempt": attempt, "kind": kind, **kw}) + "\n"


def samples(where: Path, rows: list[tuple[float, str]]) -> None:
    """Four GPU and host rows per (time, host), 10 s apart, with that host's figures."""
    gpu, host = [GPU_HEAD], [HOST_HEAD]
    for t, h in rows:
        for i in range(4):
            ts = T0 + t + 10 * i
            gpu.append(f"{ts},0,GPU-{h},{UTIL[h]},100,80000,,200,50,{1000 * i},\n")
            host.append(f"{ts},0,,0,16000,{AVAIL[h] - i},1.5\n")
    (where / "gpu.csv").write_text("".join(gpu))
    (where / "host.csv").write_text("".join(host))


def plant(run: Path, lost: dict | None = None) -> None:
    node1 = run / "nodes" / "node-1"
    node1.mkdir(parents=True)
    leader, agent = [], []
    for a, nodes, t, end in ATTEMPTS:
        leader.append(ev(t, a, "start", host=nodes[0], nodes=nodes, job_id="7", scheduler="slurm",
                         restart_count=a - 1))
        if a == 3:
            leader.append(ev(t + 0.5, a, "node-lost", node="n3", index=1, in_attempt=2, lost=["step_00030"],
                             **(lost or {"state": "DOWN+NOT_RESPONDING", "reason": "Not responding"})))
        leader.append(ev(t + 1, a, "node-agents", started=True, nodes=nodes, ready=[1], missing=[], seconds=0.8))
        leader.append(ev(t + 2, a, "spawn", pid=10 + a, argv=["srun", "torchrun"]))
        agent.append(ev(t + 1, a, "node-start", node=1, nodes=2, host=nodes[1], pid=20 + a))
        if a == 2:
            agent.append(ev(t + 60, a, "sync-failed", pair="ckpt", error="No space left on device"))
            continue  # n3 dies: neither its agent nor the leader's attempt journals an end
        leader.append(ev(end, a, "end", reason="child-exit" if a == 3 else "preempted", exit_status=0,
                         seconds=end - t, not_durable=[]))
        agent.append(ev(end, a, "end", node=1, reason="leader-ended", seconds=end - t - 1))
    (run / "events.jsonl").write_text("".join(leader))
    (node1 / "events.jsonl").write_text("".join(agent))
    samples(run, [(t + 5, nodes[0]) for _, nodes, t, _ in ATTEMPTS])
    samples(node1, [(t + 5, nodes[1]) for _, nodes, t, _ in ATTEMPTS])


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "report", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"})


def test_one_row_per_node_with_its_samples_and_what_became_of_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    plant(run)
    out = report(str(run))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    section = text.split("\nNodes", 1)[1].split("\n\n", 1)[0]
    lines = section.splitlines()[1:]
    assert [ln.split(":")[0].strip() for ln in lines[::2]] == ["node n1", "node n2", "node n3"], section
    n1, n2, n3 = (lines[i] + "\n" + lines[i + 1] for i in (0, 2, 4))
    assert "attempts 1 (node 0), 3 (node 0)" in n1 and "not in attempt 2" in n1, n1
    # n2 was node 1, then node 0, then node 1: its samples from both directories, 3 × 4 rows
    assert "attempts 1 (node 1), 2 (node 0), 3 (node 1)" in n2 and "· ok" in n2, n2
    assert "12 GPU samples (1 GPU), util 40% mean" in n2 and "12 host samples" in n2, n2
    assert "memory available ≥ 2.9 GiB of 15.6 GiB" in n2, n2
    # the node that died: named, with what it took along, its agent's missing end and its failed copy
    assert "attempts 2 (node 1)" in n3 and "LOST in attempt 2 (Slurm: DOWN+NOT_RESPONDING, Not responding); "\
        "never published: step_00030" in n3, n3
    assert "left no end in attempt 2" in n3 and "sync failed" in n3, n3
    assert "4 GPU samples (1 GPU), util 10% mean" in n3 and "not in" not in n3, n3
    assert "8 GPU samples (1 GPU), util 80% mean" in n1, n1

    js = json.loads(report(str(run), "--json").stdout)
    rows = {r["node"]: r for r in js["nodes"]}
    assert rows["n3"]["lost"] and not rows["n2"]["lost"] and rows["n3"]["roles"] == [[2, 1]]
    assert rows["n1"]["util_mean_pct"] == 80.0 and rows["n1"]["gpu_samples"] == 8 and rows["n1"]["host_samples"] == 8
    assert rows["n2"]["mem_min_available_mib"] == 2997 and rows["n2"]["load1_mean"] == 1.5

    html = tmp_path / "r.html"
    out = report(str(run), "--html", str(html))
    assert out.returncode == 0, out.stderr
    page = html.read_text()
    nodes_table = page.split("<h2>Nodes</h2>", 1)[1].split("</table>", 1)[0]
    assert "<td>n3</td>" in nodes_table and "LOST in attempt 2" in nodes_table and "<td>2 (node 1)</td>" in nodes_table


@pytest.mark.parametrize("scheduler, state, reason, said", [
    ("slurm", "DOWN+NOT_RESPONDING", "Not responding", "(Slurm: DOWN+NOT_RESPONDING, Not responding)"),
    ("pbs", "down,offline", "test: n3 died", "(PBS: down,offline, test: n3 died)"),
])
def test_a_lost_node_is_named_by_the_scheduler_that_called_it_down(tmp_path: Path, scheduler: str, state: str,
                                                                    reason: str, said: str) -> None:
    """``node-lost`` says which scheduler called the node down (pbsnodes' state under PBS,
    not Slurm's); a journal from before the field is Slurm's (the test above)."""
    run = tmp_path / "run"
    plant(run, lost={"scheduler": scheduler, "state": state, "reason": reason})
    out = report(str(run))
    assert out.returncode == 0, out.stderr
    n3 = out.stdout.split("\nNodes", 1)[1].split("node n3", 1)[1].split("\n\n", 1)[0]
    assert f"LOST in attempt 2 {said}; never published: step_00030" in n3, n3
    other = "PBS" if scheduler == "slurm" else "Slurm"
    assert f"({other}:" not in out.stdout, out.stdout


def test_a_gpu_fault_on_a_node_agent_makes_its_host_suspect(tmp_path: Path) -> None:
    """An XID journaled by node 1's agent in attempt 2 is n3's, not node 1's of another attempt."""
    run = tmp_path / "run"
    plant(run)
    with open(run / "nodes" / "node-1" / "events.jsonl", "a") as f:
        f.write(ev(250, 2, "gpu-xid", uuid="GPU-n3", xid=79, gpu=0))
    f, _ = facts_of(run)
    rows = {r.node: r for r in f.nodes}
    assert rows["n3"].suspect and not rows["n2"].suspect
    assert "GPU fault: XID 79 (suspect)" in rows["n3"].problems


def test_a_single_node_run_has_no_node_rows(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "events.jsonl").write_text(ev(0, 1, "start", host="vm") + ev(5, 1, "end", reason="finished", exit_status=0))
    out = report(str(run))
    assert out.returncode == 0 and "\nNodes" not in out.stdout, out.stdout
    assert json.loads(report(str(run), "--json").stdout)["nodes"] == []


def test_the_report_says_plainly_when_the_nodes_held_different_versions(tmp_path: Path) -> None:
    """``restore-versions`` (the leader's, before the spawn): one line per attempt and pair,
    "every node … the same" or, when they differed, which node held what, as a bad note."""
    run = tmp_path / "run"
    run.mkdir()
    same = {"name": "snapshot.pt", "bytes": 1300, "mtime_ns": 1, "sha256": "a" * 64}
    other = {**same, "sha256": "b" * 64}
    (run / "events.jsonl").write_text("".join([
        ev(0, 1, "start", host="n1", nodes=["n1", "n2"], job_id="7", scheduler="slurm"),
        ev(0.5, 1, "sync-start", backend="rsync", pairs=[{"name": "ckpt", "kind": "checkpoint", "from": "/l", "to": "/p",
                                                          "nodes": 2, "profile": "auto"}]),
        ev(1, 1, "restore-versions", choice={"ckpt": "snapshot.pt"}, nodes={"0": {"ckpt": same}, "1": {"ckpt": same}},
           agree=True, missing=[]),
        ev(2, 1, "spawn", pid=10, argv=["srun"]),
        ev(50, 1, "end", reason="preempted", exit_status=0, seconds=50, not_durable=[]),
        ev(60, 2, "start", host="n2", nodes=["n2", "n3"], job_id="7", scheduler="slurm", restart_count=1),
        ev(61, 2, "restore-versions", choice={"ckpt": "snapshot.pt"}, nodes={"0": {"ckpt": same}, "1": {"ckpt": other}},
           agree=False, missing=[]),
        ev(62, 2, "end", reason="supervisor-error", exit_status=1, seconds=2, not_durable=[]),
    ]))
    r = report(str(run))
    assert r.returncode == 0, r.stderr
    assert "attempt 1: every node (0, 1) resumed from the same snapshot.pt (sha256 aaaaaaaaaaaa)" in r.stdout, r.stdout
    assert ("attempt 2: the nodes held DIFFERENT versions (node 0: snapshot.pt (sha256 aaaaaaaaaaaa); "
            "node 1: snapshot.pt (sha256 bbbbbbbbbbbb)); the training was not started") in r.stdout, r.stdout
    assert "Restore, attempt 2: the nodes held DIFFERENT versions" in r.stdout, r.stdout  # a note, not only a line


def test_a_node_whose_agent_left_no_end_but_stayed_up_is_never_called_killed(tmp_path: Path) -> None:
    """Issue 30, 6: "killed with its node?" was said of every agent that left no ``end``,
    a node that stayed up too. n2's agent of attempt 1 ends without its line (stopped, hung),
    and n2 serves attempts 2 and 3: not killed. n3, which Slurm calls down, was."""
    run = tmp_path / "run"
    plant(run)
    agent = run / "nodes" / "node-1" / "events.jsonl"
    lines = [ln for ln in agent.read_text().splitlines(keepends=True)
             if not ('"kind": "end"' in ln and '"attempt": 1,' in ln)]
    agent.write_text("".join(lines))
    text = report(str(run)).stdout
    section = text.split("\nNodes", 1)[1].split("\n\n", 1)[0]
    n2 = next(ln for ln in section.splitlines() if "n2" in ln) + section.split("node n2", 1)[1].split("node n3", 1)[0]
    n3 = section.split("node n3", 1)[1]
    assert "left no end in attempt 1" in n2 and "killed" not in n2 and "stayed up" in n2, n2
    assert "left no end in attempt 2 (killed with its node)" in n3, n3
