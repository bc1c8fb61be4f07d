"""Scale on one machine (issue 44): the real leader ``supervise`` against N simulated node agents.

Real node agents at 1,024 nodes do not fit one machine, so ``bench/_sim_nodes.py`` speaks the
leader's line as N-1 node agents would, in one process; the leader is the real, unmodified
``python -m supervisor``. For each N (``--nodes``, default 64 256 1024) the leader runs as node 0
of a Slurm batch job as far as its environment says (``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``
``sim[0000-…]``, ``SLURMD_NODENAME``, ``SLURM_JOB_END_TIME``), with a per-node checkpoint pair
(``--checkpoints LOCAL SHARED --nodes N``) and, first on its PATH, stubs: ``srun`` execs the load
generator (the leader's only srun: its agents' launch), ``scontrol`` answers ``show config``,
``show job`` and ``show node`` (DOWN for a node the simulation killed), refuses a requeue;
``squeue``/``scancel`` answer nothing. Every call of a stub is counted. The training is
``_sim_nodes.py train`` on node 0 alone: its shard and the DCP marker every ``--every`` s.
Each simulated node stages its part (``--size`` bytes, its manifest last) after the leader's
``go``, spread over ``--jitter`` s, and says ``part``. Measured, per N:

- node agents: the leader's wait for all of them (its ``node-agents`` ``seconds``: the start of
  srun to every agent ready; a simulated agent imports nothing and restores nothing, so this is
  the leader's own part of it plus the load generator's: its start, every connection and offer,
  ``sim_offered_s``), and how many joined its line (``linked``);
- publish latency: the leader's ``publish`` of a checkpoint after the last node's ``part`` of it
  (the simulation's time, or the leader's own ``part`` for node 0), p50 and max, over the
  checkpoints published without a tracer (``--untraced``) and, apart, those under strace;
- the leader's CPU seconds (utime+stime of every thread, /proc/PID/stat) per checkpoint over the
  untraced ones, and its idle rate (% of one core) once the saves are done, to subtract;
- the leader's memory: VmHWM and VmRSS (/proc/PID/status) after the saves;
- the leader's shared-storage operations per checkpoint (``strace -f -y -e
  trace=%file,getdents64`` on every thread, calls naming a path under the shared directory, as
  bench/scale.py counts them) over the traced checkpoints, total and per node, by call;
- ``--death node`` (the default): node N-1 dies once the saves are done, as Slurm reports a node
  failure (scontrol calls it DOWN from then on, its connection drops, the agents' step is killed:
  srun's error lines, srun exits 1): the seconds until the leader's ``stop`` with reason
  ``node-failed``, and the ``scontrol show node`` calls it made from then to its end;
- ``--death task``: only node N-1's agent dies (its connection dropped, srun's ``task K: Killed``
  line; srun goes on, the node stays up), a few seconds before the training exits by itself:
  how long the leader's last flush then waits for that agent's answer (``--end-wait`` at most).

It checks that every checkpoint was published with all N parts and lists the leader's error
events. The shared and local directories are on ``--root`` (default /dev/shm, a tmpfs: file
operations are cheap there, their counts are what carries to a parallel filesystem). Ratios are
against the smallest N. Runs by hand, without Slurm (strace needs the right to trace the leader:
root, or kernel.yama.ptrace_scope = 0):

    .venv/bin/python bench/scale_sim.py --nodes 64 256 1024
    .venv/bin/python bench/scale_sim.py --nodes 64 --untraced 2 --traced 2 --death none
    .venv/bin/python bench/scale_sim.py --nodes 64 1024 --death none --restart   # and the restart path
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import HZ, cpu_s, events, pct, shared_ops, tids, wait  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SIM = REPO / "bench" / "_sim_nodes.py"

STUBS = {
    "srun": '#!/bin/sh\necho "srun $*" | cut -c1-200 >> {root}/calls.log\nexec {python} {sim} srun "$@"\n',
    "scontrol": """#!/bin/sh
echo "scontrol $*" >> {root}/calls.log
case "$*" in
  "show config") echo "KillWait                = 30 sec" ;;
  "-o show node "*) echo "$4" | tr , '\n' | awk -v down={root}/down '  # a line per node asked, as Slurm prints them
    BEGIN {{ while ((getline l < down) > 0) d[l] = 1 }}
    {{ if ($0 in d) print "NodeName=" $0 " State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-01-01T00:00:00]"
      else print "NodeName=" $0 " State=ALLOCATED" }}' ;;
  "show job"*) echo "JobId=424242 JobState=RUNNING Restarts=0 StartTime=2026-01-01T00:00:00 TimeLimit=02:00:00" ;;
  requeue*) echo "scontrol: error: Requeue of job is presently disabled" >&2; exit 1 ;;
  *) exit 1 ;;
esac
""",
    "squeue": '#!/bin/sh\necho "squeue $*" >> {root}/calls.log\nexit 1\n',
    "scancel": '#!/bin/sh\necho "scancel $*" >> {root}/calls.log\nexit 0\n',
}


def status_kib(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def op_class(call: str, line: str, shared: Path) -> str:
    """A traced call with its path made generic (node K, step N, fd numbers): what it is done to."""
    path = line.split(str(shared), 1)[1].split('"', 1)[0].split(">", 1)[0]
    path = re.sub(r"node-\d+", "node-K", re.sub(r"__\d+_0", "__K_0", re.sub(r"step_\d+", "step_N", path)))
    return f"{call} {path}"


def by_call(ops: list[tuple[float, str, str]], shared: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Traced calls counted by call, and by call and generic path (``op_class``)."""
    kinds: dict[str, int] = {}
    paths: dict[str, int] = {}
    for _t, k, line in ops:
        kinds[k] = kinds.get(k, 0) + 1
        c = op_class(k, line, shared)
        paths[c] = paths.get(c, 0) + 1
    return kinds, paths


def publishes(run: Path) -> list[dict[str, Any]]:
    return [e for e in events(run / "events.jsonl", "publish") if not e.get("pointer")]


def one(n: int, a: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="supervise-sim-", dir=a.root))
    shared, local, run, bin_ = root / "shared", root / "local", root / "shared" / "run", root / "bin"
    for d in (shared / "persist", local, bin_):
        d.mkdir(parents=True)
    (root / "calls.log").touch()
    for name, text in STUBS.items():
        (bin_ / name).write_text(text.format(root=root, python=sys.executable, sim=SIM))
        (bin_ / name).chmod(0o755)
    saves = a.untraced + a.traced + 1
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "SUPERVISE_"))}
    env.update(PATH=f"{bin_}:{env['PATH']}", PYTHONPATH=str(REPO), SLURM_JOB_ID="424242", SLURM_JOB_NAME="scale-sim",
               SLURM_JOB_NODELIST=f"sim[0000-{n - 1:04d}]", SLURM_JOB_NUM_NODES=str(n), SLURM_NNODES=str(n),
               SLURM_NODEID="0", SLURMD_NODENAME="sim0000", SLURM_NTASKS=str(n), SLURM_NTASKS_PER_NODE="1",
               SLURM_JOB_END_TIME=str(int(time.time()) + 7200), SIM_SIZE=str(a.size), SIM_JITTER=str(a.jitter),
               SIM_OUT=str(root / "sim.jsonl"), SIM_KILL=str(root / "kill"), SIM_DOWN=str(root / "down"),
               SIM_DEATH=a.death)
    # the training idles through the idle measure, and through the node's death; not after a task's
    idle = a.idle + 3 + {"node": 120, "task": 10, "none": 10}[a.death]
    argv = [sys.executable, "-m", "supervisor", "--run-dir", str(run), "--gpu-every", "0", "--sync-every", "10m",
            "--checkpoints", str(local / "ckpt"), str(shared / "persist" / "ckpt"), "--nodes", str(n), "--restore", "--",
            sys.executable, str(SIM), "train", str(local / "ckpt"), "--every", str(a.every), "--saves", str(saves),
            "--size", str(a.size), "--idle", str(idle), "--marks", str(shared / "marks.jsonl")]
    out: dict[str, Any] = {"n": n}
    t_start = time.time()
    with open(root / "leader.out", "w") as log:
        leader = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        pid = leader.pid
        agents = wait(lambda: events(run / "events.jsonl", "node-agents") or leader.poll() is not None, 300,
                      "the node agents")
        if leader.poll() is not None:
            raise RuntimeError(f"the leader exited {leader.returncode}: {(root / 'leader.out').read_text()[-3000:]}")
        agents = agents[0]
        limit = a.every * (saves + 4) + 120
        wait(lambda: publishes(run), limit, "the first publish", 0.05)
        sim = int(agents["pid"])
        c0, w0, s0 = cpu_s(pid), time.monotonic(), cpu_s(sim)
        wait(lambda: len(publishes(run)) >= 1 + a.untraced, limit, f"{1 + a.untraced} publishes", 0.05)
        c1, w1, s1 = cpu_s(pid), time.monotonic(), cpu_s(sim)
        trace = root / "leader.strace"
        tracer = subprocess.Popen(["strace", "-f", "-qq", "-ttt", "-y", "-e", "trace=%file,getdents64", "-o", str(trace),
                                   *[x for t in tids(pid) for x in ("-p", str(t))]], stderr=subprocess.DEVNULL)
        traced_from = time.time()
        wait(lambda: len(publishes(run)) >= saves, limit, f"all {saves} publishes", 0.2)
        traced_to = time.time()
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=60)
        time.sleep(3.0)  # the last checkpoint's tail
        out.update(hwm_mib=status_kib(pid, "VmHWM") / 1024, rss_mib=status_kib(pid, "VmRSS") / 1024)
        c2, w2 = cpu_s(pid), time.monotonic()
        time.sleep(a.idle)
        c3, w3 = cpu_s(pid), time.monotonic()
        if a.death != "none":
            calls_before = (root / "calls.log").read_text().count("show node")
            (root / "kill.tmp").write_text(f"{n - 1}\n")
            os.replace(root / "kill.tmp", root / "kill")
        if a.death == "node":
            died = wait(lambda: [e for e in events(run / "events.jsonl", "stop") if e.get("reason") == "node-failed"]
                        or leader.poll() is not None, 120, "the leader's node-failed stop", 0.05)
            death = next((e for e in events(root / "sim.jsonl", "death")), None)
            if isinstance(died, list) and death is not None:
                out["death_s"] = died[0]["t"] - death["t"]
        try:
            leader.wait(timeout=a.end_wait if a.death == "task" else 180)
        except subprocess.TimeoutExpired:
            out["leader_termed"] = True  # still running: TERMed (its srun too: the same session)
            os.killpg(pid, signal.SIGTERM)
            leader.wait(timeout=60)
        out["leader_rc"] = leader.returncode
        if a.death == "task":
            flush = [e for e in events(run / "events.jsonl", "stop-step") if e.get("step") == "final-flush"]
            out["task_death_flush_s"] = flush[0]["seconds"] if flush else None  # None: still waiting, killed
            out["task_death_end"] = next((e.get("reason") for e in events(run / "events.jsonl", "end")), None)
        if a.death != "none":
            out["death_scontrol_calls"] = (root / "calls.log").read_text().count("show node") - calls_before
        out["leader_s"] = round(time.time() - t_start, 1)

        # every checkpoint with all N parts; latency against the last part of each
        pub = publishes(run)
        parts: dict[str, list[float]] = {}
        for e in events(root / "sim.jsonl", "part"):
            parts.setdefault(e["checkpoint"], []).append(e["t"])
        for e in events(run / "events.jsonl", "part"):
            parts.setdefault(e["checkpoint"], []).append(e["t"])
        lat = {e["checkpoint"]: e["t"] - max(parts[e["checkpoint"]]) for e in pub
               if len(parts.get(e["checkpoint"], [])) == n}
        untraced = [lat[e["checkpoint"]] for e in pub[1:1 + a.untraced] if e["checkpoint"] in lat]
        traced = [lat[e["checkpoint"]] for e in pub if traced_from < e["t"] <= traced_to and e["checkpoint"] in lat]
        ops = [(t, k, line) for t, k, line in shared_ops(trace, shared) if traced_from <= t <= traced_to]
        ckpts = max(1, len([e for e in pub if traced_from < e["t"] <= traced_to]))
        kinds, paths = by_call(ops, shared)
        bad = [e for e in events(run / "events.jsonl") if e.get("kind") in ("error", "part-conflict", "sync-error",
                                                                            "guard", "restore-failed")]
        sim_words = next((e["words"] for e in events(root / "sim.jsonl", "words")), {})
        offered = next((e for e in events(root / "sim.jsonl", "offered")), {})
        calls: dict[str, int] = {}
        for line in (root / "calls.log").read_text().splitlines():
            key = " ".join(line.split()[:2 if not line.startswith("scontrol -o") else 4])
            calls[key] = calls.get(key, 0) + 1
        out.update(agents_wait_s=agents.get("seconds"), missing=len(agents.get("missing") or []),
                   linked=len(agents.get("linked") or []), sim_linked=offered.get("linked"),
                   sim_offered_s=offered.get("since_start"),
                   published=len(pub), all_parts=all(len(e.get("parts") or {}) == n and e.get("nodes") == n for e in pub),
                   lat_p50=pct(untraced, 0.5), lat_max=max(untraced, default=float("nan")),
                   lat_traced_p50=pct(traced, 0.5), lat_traced_max=max(traced, default=float("nan")),
                   cpu_per_ckpt=(c1 - c0) / max(1, a.untraced), cpu_window_s=w1 - w0,
                   sim_cpu_per_ckpt=(s1 - s0) / max(1, a.untraced),
                   idle_pct=(c3 - c2) / (w3 - w2) * 100, ops_per_ckpt=len(ops) / ckpts,
                   ops_per_node=len(ops) / ckpts / n, op_kinds=kinds,
                   op_paths={c: round(v / ckpts / n, 2) for c, v in sorted(paths.items(), key=lambda kv: -kv[1])[:12]}, traced_checkpoints=ckpts,
                   errors=[{k: e.get(k) for k in ("kind", "error", "name", "detail") if k in e} for e in bad][:5],
                   sim_words=sim_words, journal_kib=(run / "events.jsonl").stat().st_size / 1024,
                   parts_waiting_per_ckpt=len(events(run / "events.jsonl", "parts-waiting")) / max(1, len(pub)), stub_calls=calls, root=str(root), hz=HZ)
        out["cpu_net_per_ckpt"] = out["cpu_per_ckpt"] - out["idle_pct"] / 100 * out["cpu_window_s"] / max(1, a.untraced)
        if a.restart:
            out.update(restart(n, a, root, env, argv))
        return out
    finally:
        if leader.poll() is None:
            os.killpg(leader.pid, signal.SIGKILL)
        sim_pid = next((e.get("pid") for e in events(run / "events.jsonl", "node-agents")), None)
        try:  # the load generator ends on the leader's end (a look a second), or now
            wait(lambda: not Path(f"/proc/{sim_pid}").exists(), 5, "the load generator's end")
        except RuntimeError:
            os.kill(int(sim_pid), signal.SIGKILL)
        except TypeError:
            pass  # no node-agents event: no load generator started
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)


def restart(n: int, a: argparse.Namespace, root: Path, env: dict[str, str], argv: list[str]) -> dict[str, Any]:
    """The next attempts of the same job, requeued onto new nodes (every local disk empty: the
    newest published version comes from persistent storage on every node): from the leader's
    exec to every agent ready and every node restored (``restore-versions``) and to the
    training's spawn, its CPU until then, and its ``scontrol`` calls; then once more under
    strace, for its shared-storage calls from exec to the spawn, by call."""
    run, shared = root / "shared" / "run", root / "shared"
    argv = [*argv[:argv.index("--saves") + 1], "1", *argv[argv.index("--saves") + 2:]]
    argv[argv.index("--idle") + 1] = "2"
    out: dict[str, Any] = {}
    for traced in (False, True):
        shutil.rmtree(root / "local" / "ckpt", ignore_errors=True)  # new nodes: nothing on their disks
        for f in ("kill", "down"):
            (root / f).unlink(missing_ok=True)
        calls0 = (root / "calls.log").read_text().count("\n")
        attempt = len(events(run / "events.jsonl", "start")) + 1
        trace = root / f"restart-{attempt}.strace"
        pre = ["strace", "-f", "-qq", "-ttt", "-y", "-e", "trace=%file,getdents64", "-o", str(trace)] if traced else []
        t0 = time.time()
        with open(root / f"leader-{attempt}.out", "w") as log:
            leader = subprocess.Popen([*pre, *argv], cwd=REPO, env={**env, "SIM_DEATH": "none"}, stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            ours = lambda kind: [e for e in events(run / "events.jsonl", kind) if e.get("attempt") == attempt]  # noqa: E731
            spawn = wait(lambda: ours("spawn") or leader.poll() is not None, 600, f"attempt {attempt}'s spawn", 0.05)
            if leader.poll() is not None and not ours("spawn"):
                raise RuntimeError(f"attempt {attempt}'s leader exited {leader.returncode}: "
                                   f"{(root / f'leader-{attempt}.out').read_text()[-3000:]}")
            cpu = cpu_s(leader.pid) if not traced else None
            leader.wait(timeout=180)
        finally:
            if leader.poll() is None:
                os.killpg(leader.pid, signal.SIGKILL)
        agents, versions = ours("node-agents")[0], ours("restore-versions")[0]
        start = ours("start")[0]
        if not traced:
            out.update(restart_agents_s=round(agents["t"] - t0, 2), restart_agents_wait_s=agents.get("seconds"),
                       restart_restored_s=round(versions["t"] - t0, 2), restart_spawn_s=round(spawn[0]["t"] - t0, 2),
                       restart_exec_to_start_s=round(start["t"] - t0, 2), restart_cpu_s=cpu,
                       restart_agree=versions.get("agree"), restart_choice=versions.get("choice"),
                       restart_missing=len(versions.get("missing") or []),
                       restart_calls=(root / "calls.log").read_text().splitlines()[calls0:][:8],
                       restart_rc=leader.returncode)
        else:
            upto = spawn[0]["t"]
            execs = [line for line in trace.read_text(errors="replace").splitlines() if "execve(" in line]
            sims = {line.split()[0] for line in execs if "_sim_nodes.py" in line}  # the load generator, the training
            copiers = {line.split()[0] for line in execs if "rsync" in line}  # node 0's restore: its copy, as every node's
            traced_ops = [(t, k, line) for t, k, line in shared_ops(trace, shared) if t <= upto and line.split()[0] not in sims]
            ops = [op for op in traced_ops if op[2].split()[0] not in copiers]
            out["restart_copy_ops"] = len(traced_ops) - len(ops)
            kinds, paths = by_call(ops, shared)
            out.update(restart_ops=len(ops), restart_ops_per_node=round(len(ops) / n, 2), restart_op_kinds=kinds,
                       restart_op_paths={c: round(v / n, 2) for c, v in sorted(paths.items(), key=lambda kv: -kv[1])[:12]},
                       restart_traced_agree=versions.get("agree"))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--every", type=float, default=5.0, help="seconds between checkpoints")
    p.add_argument("--untraced", type=int, default=3, help="checkpoints measured without strace (latency, CPU)")
    p.add_argument("--traced", type=int, default=3, help="checkpoints measured under strace (operations)")
    p.add_argument("--size", type=int, default=64 << 10, help="bytes of each node's shard")
    p.add_argument("--jitter", type=float, default=0.5, help="each node's part after the go: a delay in [0, JITTER] s")
    p.add_argument("--idle", type=float, default=8.0, help="seconds of the idle CPU measure, after the saves")
    p.add_argument("--death", choices=("node", "task", "none"), default="node",
                   help="at the end, node N-1 fails (node), or only its agent (task), or nothing")
    p.add_argument("--end-wait", type=float, default=90.0, help="--death task: seconds to wait for the leader's end")
    p.add_argument("--root", default="/dev/shm", help="where the shared and local directories go")
    p.add_argument("--keep", action="store_true", help="keep each run's directory")
    p.add_argument("--restart", action="store_true",
                   help="then requeue the job onto new nodes twice: the restart's times, then its calls under strace")
    a = p.parse_args()
    rows = []
    for n in a.nodes:
        print(f"N={n} ...", flush=True)
        rows.append(one(n, a))
        print(json.dumps(rows[-1], default=str), flush=True)
    base = rows[0]
    print(f"\n{'N':>5} {'agents':>7} {'linked':>6} {'published':>9} {'publish p50/max':>16} {'traced p50/max':>15} "
          f"{'CPU/ckpt':>8} {'net':>6} {'idle%':>6} {'HWM MiB':>7} {'RSS MiB':>7} {'ops/ckpt':>8} {'ops/node':>8} "
          f"{'death':>6}")
    for r in rows:
        print(f"{r['n']:>5} {r['agents_wait_s'] or 0:>6.2f}s {r['linked']:>6} {r['published']:>5}{'' if r['all_parts'] else '!':1}"
              f"{'':>3} {r['lat_p50']:>7.2f}/{r['lat_max']:<7.2f}s {r['lat_traced_p50']:>6.2f}/{r['lat_traced_max']:<7.2f}s "
              f"{r['cpu_per_ckpt']:>7.2f}s {r['cpu_net_per_ckpt']:>5.2f}s {r['idle_pct']:>6.2f} {r['hwm_mib']:>7.1f} "
              f"{r['rss_mib']:>7.1f} {r['ops_per_ckpt']:>8.0f} {r['ops_per_node']:>8.2f} "
              f"{r.get('death_s', float('nan')):>5.2f}s")
    for r in rows:
        if "task_death_flush_s" in r:
            print(f"N={r['n']}: node {r['n'] - 1}'s agent died (srun went on): the leader's last flush took "
                  f"{r['task_death_flush_s']}s" + (f", still waiting when TERMed after --end-wait {a.end_wait:.0f}s"
                                                   if r.get("leader_termed") else "") + f", end {r['task_death_end']}")
    for r in rows[1:]:
        print(f"N={r['n']} / N={base['n']}: nodes x{r['n'] / base['n']:.0f}, agents' wait "
              f"x{(r['agents_wait_s'] or 0) / max(base['agents_wait_s'] or 0, 1e-9):.2f}, publish p50 "
              f"x{r['lat_p50'] / max(base['lat_p50'], 1e-9):.2f}, CPU per checkpoint "
              f"x{r['cpu_per_ckpt'] / max(base['cpu_per_ckpt'], 1e-9):.2f}, memory x{r['hwm_mib'] / base['hwm_mib']:.2f}, "
              f"ops per checkpoint x{r['ops_per_ckpt'] / max(base['ops_per_ckpt'], 1e-9):.2f}")
    for r in rows:
        if "restart_spawn_s" in r:
            print(f"N={r['n']} restart onto new nodes: exec to every agent ready {r['restart_agents_s']:.2f}s "
                  f"(srun to ready {r['restart_agents_wait_s']}s), every node restored {r['restart_restored_s']:.2f}s, "
                  f"the training spawned {r['restart_spawn_s']:.2f}s, leader CPU {r['restart_cpu_s']:.2f}s, "
                  f"agree {r['restart_agree']}, the leader's shared-storage calls to the spawn {r.get('restart_ops')} "
                  f"({r.get('restart_ops_per_node')} per node; its restore's copier {r.get('restart_copy_ops')} more)")
    print("\nleader ops by call, per checkpoint: " + json.dumps(
        {r["n"]: {k: round(v / r["traced_checkpoints"], 1) for k, v in sorted(r["op_kinds"].items())} for r in rows}))
    print(f"leader ops per checkpoint per node at N={rows[-1]['n']}, by call and path (the most): "
          + json.dumps(rows[-1]["op_paths"], indent=1))


if __name__ == "__main__":
    main()
