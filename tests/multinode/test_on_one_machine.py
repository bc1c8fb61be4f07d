"""The leader and its node agents on one machine, srun played by a stand-in (issue 29).

``stand_in/srun`` runs the leader's agents as tasks of this machine, each in a mount
namespace of its own where the pair's local side (one path, as on every node of a cluster)
is that node's own directory; the leader runs in one too, over node 0's. No Slurm daemon:
the protocol between the leader and its agents, deterministic and in seconds, with the real
``supervise`` and the real ``supervise node-agent`` processes. (The real cluster runs the
same in tests/multinode/test_ddp_tutorial.py and test_mpi_rank0.py.)

* rank 0 on node 1 saves ``snapshot.pt`` in place, the last time a moment before the
  training exits: the leader's end waits for node 1's last part, and publishes it;
* at the next attempt node 1 holds a newer whole version never published (its leader was
  gone before its end) and node 0 an older one: the newer is published first, every node
  restores exactly it, and the older local one is set aside; ``restore-versions`` agree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.journal import events
from tests.support.node_mirrors import flip

STAND_IN = Path(__file__).parent / "stand_in"

TRAIN = """
import os, sys, time
local, node1 = sys.argv[1], sys.argv[2]
def epoch(path):
    try:
        return int(open(path, "rb").read().split(b"\\n", 1)[0].split(b"=")[1])
    except (OSError, IndexError, ValueError):
        return None
print("node 0 loads", epoch(os.path.join(local, "snapshot.pt")), "node 1 loads", epoch(os.path.join(node1, "snapshot.pt")),
      flush=True)
first = int(os.environ.get("FIRST", "0"))
for e in range(first, first + 3):
    with open(os.path.join(node1, "snapshot.pt"), "wb") as f:   # rank 0 is on node 1
        f.write(f"EPOCHS_RUN={e}\\n".encode() * 100)
    time.sleep(1.2 if e < first + 2 else 0)                      # the last save, then exit at once
"""


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "the stand-in's nodes are mount namespaces: needs root"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    return None


def epoch(path: Path) -> int | None:
    try:
        return int(path.read_bytes().split(b"\n", 1)[0].split(b"=")[1])
    except (OSError, IndexError, ValueError):
        return None


class Machine:
    """Two nodes' (or ``n``) local directories, the persistent one, the run directory, and a leader."""

    def __init__(self, root: Path, n: int = 2) -> None:
        self.root = root
        self.local = root / "local"          # the pair's local side: one path, each node's own disk
        self.nodes = [root / f"node{k}" for k in range(n)]
        self.hosts = ["vm", *(f"vm{k + 1}" for k in range(1, n))]
        self.persist = root / "persist"
        self.run_dir = root / "run"
        for d in (self.local, *self.nodes, self.persist):
            d.mkdir(parents=True, exist_ok=True)
        self.cfg = root / "run.toml"
        self.cfg.write_text(f'[[sync]]\nname = "ckpt"\nfrom = "{self.local}"\nto = "{self.persist}"\n'
                            'nodes = "auto"\nsettle = "1s"\nrestore = true\n')
        (root / "train.py").write_text(TRAIN)

    def leader(self, first: int = 0, argv: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PATH": f"{STAND_IN}:{os.environ['PATH']}", "STAND_IN_NODES": str(self.root),
               "STAND_IN_LOCAL": str(self.local), "SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": str(len(self.nodes)),
               "SLURM_JOB_NODELIST": ",".join(self.hosts), "FIRST": str(first)}
        env.pop("SLURM_STEP_ID", None)
        argv = [sys.executable, "-m", "supervisor", "--config", str(self.cfg), "--run-dir", str(self.run_dir),
                "--gpu-every", "0", "--", sys.executable, str(self.root / "train.py"), str(self.local), str(self.nodes[1]), *argv]
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                               'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh", str(self.nodes[0]),
                               str(self.local), *argv],
                              env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    return Machine(tmp_path)


def test_the_leaders_end_waits_for_node_1s_last_part(machine: Machine) -> None:
    m = machine
    t0 = time.monotonic()
    r = m.leader()
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    ev = events(m.run_dir / "events.jsonl")
    end = next(e for e in ev if e.get("kind") == "end")
    assert end["not_durable"] == [], end
    assert epoch(m.persist / "snapshot.pt") == 2, r.stderr[-2000:]   # saved a moment before the exit
    published = [e for e in ev if e.get("kind") == "publish" and e.get("checkpoint") == "snapshot.pt"]
    assert len(published) == 3 and all(e["parts"] == {"1": 1} for e in published), published
    ask = next(e for e in ev if e.get("kind") == "nodes-flush")
    assert ask["exited"] is True and ask["nodes"] == [1], ask
    node1 = events(m.run_dir / "nodes" / "node-1" / "events.jsonl")
    answer = next(e for e in node1 if e.get("kind") == "node-flush" and e.get("request") == ask["request"])
    assert answer["ok"] and answer["not_durable"] == [], answer
    assert took < 60, took  # nothing waited out a bound


def test_every_node_restores_the_newest_version_anywhere(machine: Machine) -> None:
    m = machine
    assert m.leader().returncode == 0
    assert epoch(m.persist / "snapshot.pt") == 2
    # node 1's rank saved epoch 3 after its leader's end (killed before publishing it); node 0
    # holds an older copy of its own (epoch 1)
    for node, e, age in ((1, 3, 0), (0, 1, -60)):
        path = m.nodes[node] / "snapshot.pt"
        path.write_bytes(f"EPOCHS_RUN={e}\n".encode() * 100)
        t = time.time() + age
        os.utime(path, (t, t))
    r = m.leader(first=4)
    assert r.returncode == 0, r.stderr[-3000:]  # 74 while node 0's restored epoch 3 counted as owed
    ends = [e for e in events(m.run_dir / "events.jsonl") if e.get("kind") == "end"]
    assert ends[-1]["not_durable"] == [], ends[-1]  # node 0's older copy is superseded by node 1's newer versions
    assert "node 0 loads 3 node 1 loads 3" in r.stdout, r.stdout
    ev = events(m.run_dir / "events.jsonl")
    versions = [e for e in ev if e.get("kind") == "restore-versions" and e["attempt"] == 2][0]
    assert versions["agree"] and versions["choice"] == {"ckpt": "snapshot.pt"}, versions
    held = {k: v["ckpt"] for k, v in versions["nodes"].items()}
    assert sorted(held) == ["0", "1"] and held["0"] == held["1"] and held["0"]["name"] == "snapshot.pt", held
    aside = [e for e in ev if e.get("kind") == "part-set-aside" and e["attempt"] == 2]
    assert [(e["checkpoint"], e["node"]) for e in aside] == [("snapshot.pt", 0)], aside
    assert epoch(m.nodes[0] / ".supervise-set-aside" / "snapshot.pt") == 1
    assert epoch(m.persist / "snapshot.pt") == 6  # and the new attempt's versions after it
    report = subprocess.run([sys.executable, "-m", "supervisor", "report", str(m.run_dir)], capture_output=True,
                            text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    sha = held["0"]["sha256"][:12]
    assert f"attempt 2: every node (0, 1) resumed from the same snapshot.pt (sha256 {sha})" in report.stdout, report.stdout


TRAIN_NAMED = """
import os, sys, time
local, node1, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
def epoch(path):
    try:
        return int(open(path, "rb").read().split(b"\\n", 1)[0].split(b"=")[1])
    except (OSError, IndexError, ValueError, TypeError):
        return None
held = sorted(n for n in os.listdir(node1) if n.startswith("epoch_"))
print("node 0 loads", epoch(os.environ.get("SUPERVISE_RESTORED_FROM")), "node 1 holds", held, flush=True)
for e in range(first, first + 3):
    with open(os.path.join(node1, f"epoch_{e}.pt"), "wb") as f:   # rank 0 is on node 1: a file an epoch
        f.write(f"EPOCHS_RUN={e}\\n".encode() * 100)
    time.sleep(1.2 if e < first + 2 else 0)
"""


def test_a_version_that_verifies_nowhere_is_passed_over_on_every_node(machine: Machine) -> None:
    """Every node new (nothing on their disks) and one byte of the newest published version
    flipped on persistent storage: neither node can verify it, so the leader chooses again
    without it, and every node restores the next newest (issue 43: never a mix, never nothing
    while a version verifies). Before, each node journaled the failure and the training
    started from nothing, though two older versions were whole."""
    m = machine
    (m.root / "train.py").write_text(TRAIN_NAMED)
    m.cfg.write_text(m.cfg.read_text().replace('restore = true\n', 'restore = true\npeer_copies = 0\n'))
    r = m.leader(argv=("0",))
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in m.persist.glob("epoch_*.pt")) == ["epoch_0.pt", "epoch_1.pt", "epoch_2.pt"]
    for node in m.nodes:  # new nodes: nothing of the last attempt's on their disks
        shutil.rmtree(node)
        node.mkdir()
    flip(m.persist / "epoch_2.pt")
    r = m.leader(argv=("3",))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "node 0 loads 1 node 1 holds ['epoch_1.pt']" in r.stdout, (r.stdout, r.stderr[-3000:])
    ev = events(m.run_dir / "events.jsonl")
    choices = [e for e in ev if e.get("kind") == "restore-choice" and e["attempt"] == 2]
    assert [c["checkpoint"] for c in choices] == ["epoch_2.pt", "epoch_1.pt"], choices
    assert choices[1]["excluded"] == ["epoch_2.pt"], choices[1]
    failed = [e for e in ev if e.get("kind") == "restore-verify" and e["attempt"] == 2 and e["result"] == "failed"]
    assert [e["checkpoint"] for e in failed] == ["epoch_2.pt"] and failed[0]["failed"][0]["from"] == "persistent", failed
    node1 = events(m.run_dir / "nodes" / "node-1" / "events.jsonl")
    assert [e["checkpoint"] for e in node1 if e.get("kind") == "restore-verify" and e["attempt"] == 2] \
        == ["epoch_2.pt", "epoch_1.pt"], node1
    versions = next(e for e in ev if e.get("kind") == "restore-versions" and e["attempt"] == 2)
    assert versions["agree"] and versions["choice"] == {"ckpt": "epoch_1.pt"} and versions["rounds"] == 2, versions
    assert {v["ckpt"]["name"] for v in versions["nodes"].values()} == {"epoch_1.pt"}, versions
    assert versions["passed_over"] == {"ckpt": ["epoch_2.pt"]}, versions
    report = subprocess.run([sys.executable, "-m", "supervisor", "report", str(m.run_dir)], capture_output=True,
                            text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    assert "attempt 2: every node (0, 1) resumed from the same epoch_1.pt (sha256 " in report.stdout, report.stdout
    assert "passed over epoch_2.pt: no copy of it verified on some node" in report.stdout, report.stdout


TRAIN_AGENT_DIES = TRAIN.replace("for e in range(first, first + 3):", """
def kill_agent(node):  # the node's agent only: its node stays up, srun goes on (--kill-on-bad-exit=0)
    run_dir = os.path.join(os.path.dirname(node1), "run").encode()  # this test's agents, not another test's
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:  # this run's agents first: another process's environment is not read (it may hang on a busy one)
            argv = open(f"/proc/{pid}/cmdline", "rb").read()
            if b"node-agent" not in argv or run_dir not in argv.split(b"\\0"):
                continue
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")
        except OSError:
            continue
        if f"SLURM_NODEID={node}".encode() in env:
            os.kill(int(pid), 9)
            print("killed the agent of node", node, pid, flush=True)
for e in range(first, first + 3):
    if e == first + 1:
        kill_agent(2)""")


def test_the_last_flush_does_not_wait_for_an_agent_that_died(tmp_path: Path) -> None:
    """Node 2's agent is killed (its node stays up; srun says ``task 2: Killed`` and goes on
    with the others): the leader's last flush asks nodes 1 and 2, hears node 1, and gives up on
    node 2 as soon as srun has said its agent ended, naming why, instead of waiting out its
    whole bound for an answer that cannot come (issue 44)."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    m = Machine(tmp_path, n=3)
    (m.root / "train.py").write_text(TRAIN_AGENT_DIES)
    r = m.leader()
    assert "killed the agent of node 2" in r.stdout, (r.stdout, r.stderr[-3000:])
    assert "srun: error: vm3: task 2: Killed" in r.stderr, r.stderr[-3000:]  # srun's word reaches the job's error file
    ev = events(m.run_dir / "events.jsonl")
    ask = next(e for e in ev if e.get("kind") == "nodes-flush")
    assert ask["nodes"] == [1, 2], (ask, [e for e in ev if e.get("kind") in ("node-agents", "restore-versions")])
    final = next(e for e in ev if e.get("kind") == "stop-step" and e["step"] == "final-flush")
    nodes = final["nodes"]
    assert nodes["answered"] == [1] and nodes["missing"] == [2], nodes
    assert nodes["seconds"] < 5, nodes  # before: its whole bound (18.7 s here) for an agent srun had said was gone
    why = "node 2 (vm3): its agent ended (srun: vm3: task 2: Killed); its newest part may be missing"
    assert why in nodes["pending"], nodes
    end = next(e for e in ev if e.get("kind") == "end")
    assert why in end["not_durable"], end
    assert epoch(m.persist / "snapshot.pt") == 2, r.stderr[-2000:]  # node 1's last part is published all the same
