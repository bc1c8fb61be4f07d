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
- CPU (% of one core) of one node agent and of the leader once the saves are done and the
  training idles (``--idle`` seconds, no tracer attached);
- shared-storage file operations of one node agent and of the leader (``strace -f -y -e
  trace=%file,getdents64`` on every thread of each, counting calls that name a path on the
  shared directory), per checkpoint while the saves go on, and per second while idle;
- whether every agent joined the leader's line (conduct/link.py: ``node-agents`` ``linked``);
- resident memory of one agent and of the leader; the cluster's start and stop.

Ratios are against the smallest N of the invocation (what grows with N). Runs by hand, as root:

    .venv/bin/python bench/scale.py                   # N = 4, 16, 64
    .venv/bin/python bench/scale.py --nodes 16 --saves 4
    .venv/bin/python bench/scale.py --nodes 64 --restart    # and the restart path on emptied nodes
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
  --checkpoints {local}/ckpt {shared}/persist/ckpt --nodes {n} --restore -- \\
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


def tids(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def publishes(run: Path) -> list[dict[str, Any]]:
    return [e for e in events(run / "events.jsonl", "publish") if not e.get("pointer")]


def shared_ops(trace: Path, shared: Path) -> list[tuple[float, str, str]]:
    """(time, call, line) of each traced call that names a path on the shared directory."""
    out = []
    for line in trace.read_text(errors="replace").splitlines():
        m = re.match(r"\d+\s+([\d.]+)\s+(\w+)\(", line)
        if m and str(shared) in line:
            out.append((float(m[1]), m[2], line))
    return out


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
        start_cpu = cpu_s(agent)  # its start to ready, and little after: what one node spends to join
        wait(lambda: publishes(run), 300, "the first publish", 0.05)
        # every thread of one agent and of the leader under strace (their worker threads exist already)
        traces = {who: root / f"{who}.strace" for who in ("agent", "leader")}
        tracers = [subprocess.Popen(["strace", "-f", "-qq", "-ttt", "-y", "-e", "trace=%file,getdents64", "-o", str(t),
                                     *[a for tid in tids(pid) for a in ("-p", str(tid))]], stderr=subprocess.DEVNULL)
                   for pid, t in ((agent, traces["agent"]), (leader, traces["leader"]))]
        traced_from = time.time()
        last = wait(lambda: (got := publishes(run)) and len(got) >= a.saves and got, a.every * (a.saves + 4) + 120,
                    f"all {a.saves} publishes", 0.2)
        ckpt_to = time.time()
        time.sleep(3.0)  # the last checkpoint's tail (its parts tidied away)
        idle_from = time.time()
        time.sleep(a.idle)  # the saves done: nothing to publish, the training idle
        idle_to = time.time()
        for t in tracers:
            t.terminate()
            t.wait(timeout=30)
        # idle CPU without strace (it slows every traced call)
        c_agent, c_leader, t_idle = cpu_s(agent), cpu_s(leader), time.monotonic()
        time.sleep(a.idle)
        idle_agent = (cpu_s(agent) - c_agent) / (time.monotonic() - t_idle) * 100
        idle_leader = (cpu_s(leader) - c_leader) / (time.monotonic() - t_idle) * 100
        rss_agent, rss_leader = rss_mib(agent), rss_mib(leader)
        subprocess.run([str(root / "in-cluster"), "scancel", jobid], capture_output=True)
        wait(lambda: events(run / "events.jsonl", "end"), 180, "the leader's end")
        restarted = restart(root, script, run) if a.restart else {}

        # publish latency and staleness, per checkpoint
        published = {e["checkpoint"]: e["t"] for e in last}
        parts: dict[str, list[float]] = {}
        for j in [run / "events.jsonl", *sorted((run / "nodes").glob("node-*/events.jsonl"))]:
            for e in events(j, "part"):
                parts.setdefault(e["checkpoint"], []).append(e["t"])
        marks = {f"step_{m['step']:06d}": m["marker_at"] for m in events(shared / "marks.jsonl")}
        latency = [published[c] - max(ts) for c, ts in parts.items() if c in published and len(ts) == n]
        stale = [published[c] - marks[c] for c in published if c in marks]
        ckpts = max(1, len([c for c, t in published.items() if traced_from < t <= ckpt_to]))
        ops = {who: shared_ops(t, shared) for who, t in traces.items()}
        linked = events(run / "events.jsonl", "node-agents")[0].get("linked")
        ready = list((agents.get("ready_s") or {}).values())
        out = {"n": n, "up_s": up_s, "agents_wait_s": agents.get("seconds"), "missing": agents.get("missing"),
               "linked": len(linked) if isinstance(linked, list) else None,
               "ready_p50": pct(ready, 0.5), "ready_max": max(ready) if ready else float("nan"),
               "latency_p50": pct(latency, 0.5), "latency_max": max(latency) if latency else float("nan"),
               "stale_p50": pct(stale, 0.5), "stale_max": max(stale) if stale else float("nan"),
               "checkpoints": len(latency), "traced_checkpoints": ckpts, "agent_start_cpu_s": start_cpu,
               "idle_agent_pct": idle_agent, "idle_leader_pct": idle_leader,
               "rss_agent": rss_agent, "rss_leader": rss_leader, **restarted}
        for who, got in ops.items():
            during = [k for t, k, _ in got if traced_from <= t <= ckpt_to]
            idle = [k for t, k, _ in got if idle_from < t <= idle_to]
            out[f"{who}_idle_sample"] = [line[:160] for t, _, line in got if idle_from < t <= idle_to][:8]
            out[f"{who}_ops_per_ckpt"] = len(during) / ckpts
            out[f"{who}_idle_ops_per_s"] = len(idle) / max(1e-9, idle_to - idle_from)
            kinds: dict[str, int] = {}
            for k in during:
                kinds[k] = kinds.get(k, 0) + 1
            out[f"{who}_op_kinds"] = kinds
        return out
    finally:
        t1 = time.monotonic()
        subprocess.run(["bash", str(SCRIPTS / "slurm-down.sh"), str(root), "--nodes"], capture_output=True, timeout=600)
        print(f"  N={n}: cluster up {up_s:.1f}s, down {time.monotonic() - t1:.1f}s", flush=True)
        shutil.rmtree(root, ignore_errors=True)


def restart(root: Path, script: Path, run: Path) -> dict[str, Any]:
    """The same job again, requeued onto new nodes (every node's local disk emptied: each
    restores the newest published version from persistent storage): from the leader's
    ``start`` to every agent ready (``node-agents``), to every node restored
    (``restore-versions``, and whether they agree) and to the training's ``spawn``; then
    cancelled."""
    for d in (root / "nodes").glob("*/local"):
        shutil.rmtree(d / "ckpt", ignore_errors=True)
    # a node slurmd drained at the cancel ("Kill task failed": 64 steps torn down on two loaded
    # cores) would hold the job; on a real cluster the requeue lands on other nodes instead
    drained = subprocess.run([str(root / "in-cluster"), "sinfo", "-h", "-t", "drain", "-o", "%N"], capture_output=True,
                             text=True).stdout.strip()
    if drained:
        subprocess.run([str(root / "in-cluster"), "scontrol", "update", f"nodename={drained}", "state=resume"],
                       capture_output=True)
    attempt = len(events(run / "events.jsonl", "start")) + 1
    sub = subprocess.run([str(root / "in-cluster"), "sbatch", "--parsable", str(script)], capture_output=True,
                         text=True, check=True)
    ours = lambda kind: [e for e in events(run / "events.jsonl", kind) if e.get("attempt") == attempt]  # noqa: E731
    spawn = wait(lambda: ours("spawn"), 600, f"attempt {attempt}'s spawn", 0.1)[0]
    subprocess.run([str(root / "in-cluster"), "scancel", sub.stdout.strip().split(";")[0]], capture_output=True)
    wait(lambda: ours("end"), 180, f"attempt {attempt}'s end")
    start, agents, versions = ours("start")[0], ours("node-agents")[0], ours("restore-versions")[0]
    ready = list((agents.get("ready_s") or {}).values())
    return {"restart_agents_s": agents["t"] - start["t"], "restart_agents_wait_s": agents.get("seconds"),
            "restart_ready_p50": pct(ready, 0.5), "restart_ready_max": max(ready) if ready else float("nan"),
            "restart_restored_s": versions["t"] - start["t"], "restart_spawn_s": spawn["t"] - start["t"],
            "restart_agree": versions.get("agree"), "restart_choice": versions.get("choice"),
            "restart_missing": versions.get("missing")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[4, 16, 64])
    p.add_argument("--every", type=float, default=5.0, help="seconds between checkpoints")
    p.add_argument("--saves", type=int, default=6)
    p.add_argument("--idle", type=float, default=10.0, help="seconds of each idle measure, after the saves")
    p.add_argument("--restart", action="store_true", help="then the job again on emptied nodes: the restart path")
    a = p.parse_args()
    # supervise's modules byte-compiled first, as a wheel's install (and scripts/setup.sh) does:
    # with PYTHONDONTWRITEBYTECODE set and no .pyc, every agent compiled them at each start
    # (0.34 against 0.18 CPU-seconds of imports; issue 44)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "supervisor")], check=True,
                   stdout=subprocess.DEVNULL)
    rows = []
    for n in a.nodes:
        print(f"N={n} ...", flush=True)
        rows.append(one(n, a))
        print(json.dumps(rows[-1], default=str), flush=True)
    base = rows[0]
    print(f"\n{'N':>4} {'up':>6} {'wait':>6} {'linked':>6} {'ready p50/max':>14} {'publish p50/max':>16} "
          f"{'stale p50/max':>14} {'agent%':>7} {'leader%':>8} {'agent ops/ckpt':>14} {'agent ops/s':>11} "
          f"{'leader ops/ckpt':>15} {'leader ops/s':>12} {'agent MiB':>9} {'leader MiB':>10} {'start CPU':>9}")
    for r in rows:
        print(f"{r['n']:>4} {r['up_s']:>5.1f}s {r['agents_wait_s'] or 0:>5.1f}s {r['linked'] or 0:>6} "
              f"{r['ready_p50']:>6.2f}/{r['ready_max']:<6.2f}s {r['latency_p50']:>7.2f}/{r['latency_max']:<7.2f}s "
              f"{r['stale_p50']:>6.2f}/{r['stale_max']:<6.2f}s {r['idle_agent_pct']:>6.2f} {r['idle_leader_pct']:>7.2f} "
              f"{r['agent_ops_per_ckpt']:>14.1f} {r['agent_idle_ops_per_s']:>11.2f} {r['leader_ops_per_ckpt']:>15.1f} "
              f"{r['leader_idle_ops_per_s']:>12.2f} {r['rss_agent']:>9.1f} {r['rss_leader']:>10.1f} {r['agent_start_cpu_s']:>8.2f}s")
    for r in rows:
        if "restart_spawn_s" in r:
            print(f"N={r['n']} restart on emptied nodes, from the leader's start: every agent ready "
                  f"{r['restart_agents_s']:.2f}s (its srun to ready {r['restart_agents_wait_s']}s; each agent "
                  f"p50/max {r['restart_ready_p50']:.2f}/{r['restart_ready_max']:.2f}s), every node restored "
                  f"{r['restart_restored_s']:.2f}s (agree {r['restart_agree']}, {r['restart_choice']}), "
                  f"the training spawned {r['restart_spawn_s']:.2f}s")
    for r in rows[1:]:
        print(f"N={r['n']} / N={base['n']}: nodes x{r['n'] / base['n']:.0f}, leader ops per checkpoint "
              f"x{r['leader_ops_per_ckpt'] / max(base['leader_ops_per_ckpt'], 1e-9):.2f}, leader memory "
              f"x{r['rss_leader'] / base['rss_leader']:.2f}, agents' wait "
              f"x{(r['agents_wait_s'] or 0) / max(base['agents_wait_s'] or 0, 1e-9):.2f}, "
              f"publish p50 x{r['latency_p50'] / max(base['latency_p50'], 1e-9):.2f}")
    print("\nstatistics: " + json.dumps({"agent_op_kinds_last": rows[-1]["agent_op_kinds"],
                                         "leader_op_kinds_last": rows[-1]["leader_op_kinds"],
                                         "median_agent_ops_per_ckpt": statistics.median(r["agent_ops_per_ckpt"] for r in rows)}))

if __name__ == "__main__":
    main()
