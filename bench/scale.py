"""Scale (issue 33): supervise over N nodes of the multi-node test cluster, what grows with N.

For each N (``--nodes``, default 4 16 64): ``scripts/slurm-up.sh ROOT --nodes N`` (timed),
then one job over all N nodes: the leader ``supervise`` with a per-node checkpoint pair
(``--nodes N``), its node agents on every other node (``srun --overlap``, started by the
leader), and a light training (``bench/_scale_writer.py``: one process per node writing its
shard every ``--every`` s, node 0 the DCP marker last, no torch), for ``--saves`` checkpoints.
Printed per N, from the journals and /proc:

- node agents: the leader's wait for all of them (``node-agents`` ``seconds``) and each agent's
  ready time after the launch (``ready_s``: p50, max);
- publish latency: the leader's ``publish`` of a checkpoint after the last node's ``part`` of it
  (p50, max), and staleness: that publish after the training's marker (p50, max);
- CPU (% of one core) of one node agent and of the leader over an idle stretch between two
  checkpoints, and over the whole run;
- shared-storage file operations of one node agent (``strace -f -e trace=%file,getdents64`` on
  it, counting calls whose path is on the shared directory), per checkpoint and per idle second;
- resident memory of one agent and of the leader; the cluster's start and stop.

Ratios are against the smallest N of the invocation (what grows with N). Runs by hand, as root:

    .venv/bin/python bench/scale.py                   # N = 4, 16, 64
    .venv/bin/python bench/scale.py --nodes 16 --saves 4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
WRITER = REPO / "bench" / "_scale_writer.py"
HZ = os.sysconf("SC_CLK_TCK")

JOB = """#!/bin/bash
#SBATCH --nodes={n}
#SBATCH --ntasks-per-node=1
#SBATCH --output={shared}/job.out
cd {repo}
exec {python} -m supervisor --run-dir {shared}/run --gpu-every 0 --sync-every 10m \\
  --checkpoints {local}/ckpt {shared}/persist/ckpt --nodes {n} -- \\
  srun --ntasks-per-node=1 {python} {writer} {local}/ckpt --barrier {shared}/barrier \\
  --marks {shared}/marks.jsonl --every {every} --saves {saves}
"""


def wait(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def events(path: Path, kind: str | None = None) -> list[dict[str, Any]]:
    out = []
    try:
        for line in path.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if kind is None or e.get("kind") == kind:
                out.append(e)
    except OSError:
        pass
    return out


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pids_in(pfx: str, node: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", f"{pfx}-{node}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def supervise_pid(pfx: str, node: str, agent: bool) -> int | None:
    """The leader's supervise (on n1) or a node agent (not srun) on ``node``."""
    for pid in pids_in(pfx, node):
        cmd = cmdline(pid)
        if "supervisor" not in " ".join(cmd[:3]) or "srun" in cmd[0]:
            continue
        if ("node-agent" in cmd) == agent:
            return pid
    return None


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def one(n: int, a: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="supervise-scale-", dir="/var/tmp"))
    t0 = time.monotonic()
    up = subprocess.run(["bash", str(SCRIPTS / "slurm-up.sh"), str(root), "--nodes", str(n)], capture_output=True,
                        text=True, timeout=600)
    up_s = time.monotonic() - t0
    if up.returncode != 0:
        raise RuntimeError(f"slurm-up.sh --nodes {n}: {up.stderr[-2000:]}")
    pfx = dict(line.split("=", 1) for line in (root / "multinode.env").read_text().splitlines() if "=" in line)["PFX"]
    shared, local = root / "shared", root / "local"
    try:
        script = shared / "scale.sh"
        script.write_text(JOB.format(n=n, shared=shared, local=local, repo=REPO, python=sys.executable, writer=WRITER,
                                     every=a.every, saves=a.saves))
        sub = subprocess.run([str(root / "in-cluster"), "sbatch", "--parsable", str(script)], capture_output=True,
                             text=True, check=True)
        jobid = sub.stdout.strip().split(";")[0]
        run = shared / "run"
        agents = wait(lambda: events(run / "events.jsonl", "node-agents"), 300, "the node agents")[0]
        leader = wait(lambda: supervise_pid(pfx, "n1", agent=False), 30, "the leader's pid")
        agent = wait(lambda: supervise_pid(pfx, "n2", agent=True), 30, "node 1's agent")
        # one agent under strace for the run's middle checkpoints; an idle stretch measured inside it
        trace = root / "agent.strace"
        strace = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=%file,getdents64", "-o", str(trace),
                                   "-p", str(agent)], stderr=subprocess.DEVNULL)
        first = wait(lambda: [e for e in events(run / "events.jsonl", "publish") if not e.get("pointer")], 300,
                     "the first publish", 0.05)
        traced_from = first[-1]["t"]
        # idle: just after a publish, for half the interval (no checkpoint is written then)
        idle = a.every / 2
        c_agent, c_leader, t_idle = cpu_s(agent), cpu_s(leader), time.monotonic()
        time.sleep(idle)
        idle_agent = (cpu_s(agent) - c_agent) / (time.monotonic() - t_idle) * 100
        idle_leader = (cpu_s(leader) - c_leader) / (time.monotonic() - t_idle) * 100
        # the traced window: until 3 more checkpoints are published
        wait(lambda: len([e for e in events(run / "events.jsonl", "publish") if not e.get("pointer")]) >= len(first) + 3,
             a.every * 6 + 120, "3 more publishes", 0.2)
        traced_to = time.time()
        rss_agent, rss_leader = rss_mib(agent), rss_mib(leader)
        total_agent, total_leader = cpu_s(agent), cpu_s(leader)
        strace.terminate()
        strace.wait(timeout=30)
        subprocess.run([str(root / "in-cluster"), "scancel", jobid], capture_output=True)
        wait(lambda: events(run / "events.jsonl", "end"), 180, "the leader's end")
        start = events(run / "events.jsonl", "start")[0]
        run_s = events(run / "events.jsonl", "end")[-1]["t"] - start["t"]

        # publish latency and staleness, per checkpoint
        publishes = {e["checkpoint"]: e["t"] for e in events(run / "events.jsonl", "publish") if not e.get("pointer")}
        parts: dict[str, list[float]] = {}
        for j in [run / "events.jsonl", *sorted((run / "nodes").glob("node-*/events.jsonl"))]:
            for e in events(j, "part"):
                parts.setdefault(e["checkpoint"], []).append(e["t"])
        marks = {f"step_{m['step']:06d}": m["marker_at"] for m in events(shared / "marks.jsonl")}
        latency = [publishes[c] - max(ts) for c, ts in parts.items() if c in publishes and len(ts) == n]
        stale = [publishes[c] - marks[c] for c in publishes if c in marks]
        # the agent's shared-storage file operations, in the traced window
        ops = [line for line in trace.read_text(errors="replace").splitlines() if str(shared) in line]
        kinds: dict[str, int] = {}
        for line in ops:
            m = re.match(r"\d+\s+(\w+)\(", line)
            if m:
                kinds[m[1]] = kinds.get(m[1], 0) + 1
        window = traced_to - traced_from
        ckpts = max(1, len([c for c, t in publishes.items() if traced_from < t <= traced_to]))
        ready = list((agents.get("ready_s") or {}).values())
        return {"n": n, "up_s": up_s, "agents_wait_s": agents.get("seconds"), "missing": agents.get("missing"),
                "ready_p50": pct(ready, 0.5), "ready_max": max(ready) if ready else float("nan"),
                "latency_p50": pct(latency, 0.5), "latency_max": max(latency) if latency else float("nan"),
                "stale_p50": pct(stale, 0.5), "stale_max": max(stale) if stale else float("nan"),
                "checkpoints": len(latency), "idle_agent_pct": idle_agent, "idle_leader_pct": idle_leader,
                "run_agent_pct": total_agent / run_s * 100, "run_leader_pct": total_leader / run_s * 100,
                "ops": len(ops), "ops_per_ckpt": len(ops) / ckpts, "ops_per_s": len(ops) / window, "op_kinds": kinds,
                "rss_agent": rss_agent, "rss_leader": rss_leader}
    finally:
        t1 = time.monotonic()
        subprocess.run(["bash", str(SCRIPTS / "slurm-down.sh"), str(root), "--nodes"], capture_output=True, timeout=600)
        print(f"  N={n}: cluster up {up_s:.1f}s, down {time.monotonic() - t1:.1f}s", flush=True)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[4, 16, 64])
    p.add_argument("--every", type=float, default=5.0, help="seconds between checkpoints")
    p.add_argument("--saves", type=int, default=8)
    a = p.parse_args()
    rows = []
    for n in a.nodes:
        print(f"N={n} ...", flush=True)
        rows.append(one(n, a))
        print(json.dumps(rows[-1], default=str), flush=True)
    base = rows[0]
    print(f"\n{'N':>4} {'up':>6} {'wait':>6} {'ready p50/max':>14} {'publish p50/max':>16} {'stale p50/max':>14} "
          f"{'agent%':>7} {'leader%':>8} {'ops/ckpt':>9} {'ops/s':>6} {'agent MiB':>9} {'leader MiB':>10}")
    for r in rows:
        print(f"{r['n']:>4} {r['up_s']:>5.1f}s {r['agents_wait_s'] or 0:>5.1f}s "
              f"{r['ready_p50']:>6.2f}/{r['ready_max']:<6.2f}s {r['latency_p50']:>7.2f}/{r['latency_max']:<7.2f}s "
              f"{r['stale_p50']:>6.2f}/{r['stale_max']:<6.2f}s {r['idle_agent_pct']:>6.2f} {r['idle_leader_pct']:>7.2f} "
              f"{r['ops_per_ckpt']:>9.1f} {r['ops_per_s']:>6.1f} {r['rss_agent']:>9.1f} {r['rss_leader']:>10.1f}")
    for r in rows[1:]:
        print(f"N={r['n']} / N={base['n']}: nodes x{r['n'] / base['n']:.0f}, leader idle CPU "
              f"x{r['idle_leader_pct'] / max(base['idle_leader_pct'], 1e-9):.2f}, leader memory "
              f"x{r['rss_leader'] / base['rss_leader']:.2f}, agents' wait x{(r['agents_wait_s'] or 0) / max(base['agents_wait_s'] or 0, 1e-9):.2f}, "
              f"publish p50 x{r['latency_p50'] / max(base['latency_p50'], 1e-9):.2f}")
    print("\nstatistics: " + json.dumps({"ops_kinds_last": rows[-1]["op_kinds"],
                                         "median_ops_per_s": statistics.median(r["ops_per_s"] for r in rows)}))


if __name__ == "__main__":
    main()
