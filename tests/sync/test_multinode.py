"""Multi-node mirroring: every node writes its shards to its own local disk; a checkpoint is
published on persistent storage only once every node's part is durable.

Real processes on this machine: the leader is a real ``supervise`` (node 0) and node 1 a real
``supervise node-agent``, each with its own local directory, both writing to one persistent
directory; a watcher thread checks all along that nothing partial is ever visible under a
final name. Both copy backends.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import anyio
import pytest

from supervisor.config import SyncPair, build_config
from supervisor.errors import ConfigError
from supervisor.journal import read_journal
from supervisor.plan import make_plan
from supervisor.sync import Mirror
from supervisor.sync._parts import PARTS_DIR
from tests.support.checkpoints import SHARD, pattern, write_shard
from tests.support.journal import events
from tests.support.two_nodes import TwoNodeJob
from tests.support.wait import wait_for, wait_for_async

SIZE = 192 << 10
NODE_SHARDS = {0: (0, 1), 1: (2, 3)}  # global rank → shard, two ranks a node
ALL_SHARDS = (0, 1, 2, 3)


def write_part(local: Path, name: str, node: int, *, delay: float = 0.002) -> None:
    """Node ``node``'s shards of ``name``; node 0 (global rank 0) also writes DCP's
    ``.metadata`` last, by rename, as torch.distributed.checkpoint's coordinator does."""
    d = local / name
    d.mkdir(parents=True, exist_ok=True)
    for i in NODE_SHARDS[node]:
        write_shard(d / SHARD.format(i), pattern(name, i, SIZE), chunk=16 << 10, delay=delay)
    if node == 0:
        (d / ".metadata.tmp").write_bytes(b"meta:" + name.encode())
        os.replace(d / ".metadata.tmp", d / ".metadata")


def incomplete(d: Path) -> list[str]:
    """What is wrong with a checkpoint visible under its final name (empty: nothing)."""
    bad = []
    try:
        inside = set(os.listdir(d))
    except FileNotFoundError:
        return ["missing"]
    for i in ALL_SHARDS:
        try:
            data = (d / SHARD.format(i)).read_bytes()
        except FileNotFoundError:
            bad.append(f"{SHARD.format(i)} missing")
            continue
        if data != pattern(d.name, i, SIZE):
            bad.append(f"{SHARD.format(i)} torn ({len(data)} of {SIZE} bytes)")
    if ".metadata" not in inside:
        bad.append("no .metadata")
    if any(n.startswith(".supervise") or n.endswith(".supervise-tmp") for n in inside):
        bad.append("staging debris inside")
    return bad


class Watcher(threading.Thread):
    """Looks at the persistent side continuously: every visible checkpoint must be whole, and
    a pointer may only name a whole one."""

    def __init__(self, dst: Path) -> None:
        super().__init__(daemon=True)
        self.dst = dst
        self.stop = threading.Event()
        self.violations: list[str] = []
        self.seen: set[str] = set()
        self.looks = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                names = [n for n in os.listdir(self.dst) if not n.startswith(".")]
            except FileNotFoundError:
                names = []
            for name in names:
                if name == "latest":
                    try:
                        target = (self.dst / name).read_text().strip()
                    except FileNotFoundError:
                        continue
                    bad = [f"latest -> {target}: {b}" for b in incomplete(self.dst / target)]
                else:
                    bad = [f"{name}: {b}" for b in incomplete(self.dst / name)]
                    self.seen.add(name)
                self.violations += [b for b in bad if b not in self.violations]
            self.looks += 1


def published(journal: Path, name: str) -> list[dict]:
    return [e for e in events(journal, "publish") if e.get("checkpoint") == name]


def waiting_for(journal: Path, name: str, missing: list[int]) -> bool:
    return any(e.get("checkpoint") == name and e.get("missing") == missing for e in events(journal, "parts-waiting"))


def test_published_only_after_both_parts_land(tmp_path, backend, reaper):
    job = TwoNodeJob(tmp_path, backend, reaper)
    job.start_node()
    job.start_leader()
    job.wait_ready()
    watcher = Watcher(job.persist)
    watcher.start()
    try:
        # step_001: node 1 first (no marker there: its part is complete once quiet for settle),
        # then node 0, whose .metadata is the checkpoint's completion signal.
        write_part(job.local[1], "step_001", 1)
        wait_for(lambda: [e for e in events(job.node_journal, "part") if e["checkpoint"] == "step_001"],
                 timeout=30, what="node 1's part of step_001")
        wait_for(lambda: waiting_for(job.leader_journal, "step_001", [0]), timeout=30,
                 what="the leader to see node 1's part and wait for node 0's")
        assert not (job.persist / "step_001").exists()
        write_part(job.local[0], "step_001", 0)
        wait_for(lambda: published(job.leader_journal, "step_001"), timeout=30, what="step_001 published")
        assert incomplete(job.persist / "step_001") == []

        # step_002 the other way round: node 0 complete (and its pointer written) first.
        write_part(job.local[0], "step_002", 0)
        (job.local[0] / "latest").write_text("step_002")
        wait_for(lambda: waiting_for(job.leader_journal, "step_002", [1]), timeout=30,
                 what="the leader waiting for node 1's part of step_002")
        assert not (job.persist / "step_002").exists()
        assert not (job.persist / "latest").exists(), "the pointer landed before its checkpoint"
        write_part(job.local[1], "step_002", 1, delay=0.01)
        wait_for(lambda: published(job.leader_journal, "step_002"), timeout=30, what="step_002 published")
        wait_for(lambda: (job.persist / "latest").exists(), timeout=30, what="the pointer after step_002")
        assert (job.persist / "latest").read_text() == "step_002"
        end = job.stop_leader()
    finally:
        watcher.stop.set()
        watcher.join(10)
    assert watcher.violations == []
    assert {"step_001", "step_002"} <= watcher.seen and watcher.looks > 10
    ev = published(job.leader_journal, "step_002")[0]
    assert ev["nodes"] == 2 and ev["parts"] == {"0": 3, "1": 2} and ev["files"] == 5
    assert end["not_durable"] == []
    # the node agent ends on its own once the leader has journaled its end
    assert job.node is not None
    job.node.communicate(timeout=90)
    # the leader released the parts it published; node 1 tidied its own part directories
    assert not (job.persist / PARTS_DIR / "step_001").exists()
    assert not (job.persist / PARTS_DIR / "step_002").exists()
    (node_end,) = events(job.node_journal, "end")
    assert node_end["reason"] == "leader-ended" and node_end["node"] == 1
    assert json.loads(job.leader_journal.read_text().splitlines()[-1])["kind"] == "end"


def test_killed_node_agent_means_not_published(tmp_path, backend, reaper):
    job = TwoNodeJob(tmp_path, backend, reaper)
    node = job.start_node()
    job.start_leader()
    job.wait_ready()
    watcher = Watcher(job.persist)
    watcher.start()
    try:
        node.send_signal(signal.SIGKILL)
        node.communicate(timeout=10)
        write_part(job.local[1], "step_001", 1)  # on node 1's disk, with nobody to mirror it
        write_part(job.local[0], "step_001", 0)
        wait_for(lambda: [e for e in events(job.leader_journal, "part")
                          if e["checkpoint"] == "step_001" and e["node"] == 0],
                 timeout=30, what="the leader's own part of step_001")
        wait_for(lambda: waiting_for(job.leader_journal, "step_001", [1]), timeout=30,
                 what="the leader naming node 1 as missing")
        end = job.stop_leader()
    finally:
        watcher.stop.set()
        watcher.join(10)
    assert watcher.violations == []
    assert not (job.persist / "step_001").exists()
    assert published(job.leader_journal, "step_001") == []
    assert "ckpt: step_001 (waiting for parts: node 1 missing)" in end["not_durable"], end["not_durable"]
    # node 0's part stays, durable, for the next attempt
    assert (job.persist / PARTS_DIR / "step_001" / "node-0.json").exists()


def test_restarted_node_agent_completes_the_checkpoint(tmp_path, backend, reaper):
    """A node agent killed mid-run and started again: its part lands, the leader publishes."""
    job = TwoNodeJob(tmp_path, backend, reaper)
    node = job.start_node()
    job.start_leader()
    job.wait_ready()
    node.send_signal(signal.SIGKILL)
    node.communicate(timeout=10)
    write_part(job.local[0], "step_001", 0)
    write_part(job.local[1], "step_001", 1)
    wait_for(lambda: waiting_for(job.leader_journal, "step_001", [1]), timeout=30, what="waiting for node 1")
    job.start_node()
    wait_for(lambda: published(job.leader_journal, "step_001"), timeout=30, what="step_001 published")
    assert incomplete(job.persist / "step_001") == []
    end = job.stop_leader()
    assert end["not_durable"] == []
    assert job.node is not None
    job.node.communicate(timeout=90)
    assert len(read_journal(job.node_journal).attempts) == 2  # the restarted agent is attempt 2
    (node_end,) = events(job.node_journal, "end")
    assert node_end["reason"] == "leader-ended" and node_end["not_durable"] == []


# ---- in-process: the rule for paths several parts hold, and the configuration -----------------

def _pair(local: Path, dst: Path) -> SyncPair:
    return SyncPair("ckpt", "checkpoint", local, dst, settle=0.5, nodes=2)


async def _two_nodes(tmp_path: Path, backend: str, write, until) -> tuple[list, list]:
    ev0: list = []
    ev1: list = []

    def rec(into):
        return lambda kind, durable=False, **f: into.append({"kind": kind, **f}) or f

    dst = tmp_path / "persist"
    m0 = Mirror([_pair(tmp_path / "n0", dst)], emit=rec(ev0), backend=backend, parts_poll=0.1)
    m1 = Mirror([_pair(tmp_path / "n1", dst)], emit=rec(ev1), backend=backend, node_rank=1)
    async with anyio.create_task_group() as tg:
        await tg.start(m0.run)
        await tg.start(m1.run)
        await anyio.to_thread.run_sync(write)
        await wait_for_async(lambda: until(ev0), timeout=30, what="the leader's verdict")
        tg.cancel_scope.cancel()
    return ev0, ev1


@pytest.mark.asyncio
@pytest.mark.parametrize("same", [True, False], ids=["identical", "different"])
async def test_a_path_in_two_parts_must_be_identical(tmp_path, backend, same):
    """DeepSpeed with node-local storage writes some files on every node: the same bytes are
    published once; different bytes in halves of one checkpoint (the marker on node 0 only,
    as DCP writes it) are a conflict and nothing is published."""
    def write() -> None:
        for node in (0, 1):
            d = tmp_path / f"n{node}" / "step_001"
            d.mkdir(parents=True)
            (d / f"rank{node}.bin").write_bytes(b"x" * 1000)
            (d / "config.json").write_text("{}" if same or node == 0 else '{"lr": 1}')
            (d / "done").write_text("ok")
            if same or node == 0:
                (d / ".metadata").write_text("meta")

    if same:
        ev0, _ = await _two_nodes(tmp_path, backend, write, lambda ev: [e for e in ev if e["kind"] == "publish"])
        (pub,) = [e for e in ev0 if e["kind"] == "publish"]
        assert pub["files"] == 5 and "config.json" in pub["shared"] and ".metadata" in pub["shared"]
        assert sorted(os.listdir(tmp_path / "persist" / "step_001")) == [".metadata", "config.json", "done",
                                                                         "rank0.bin", "rank1.bin"]
    else:
        ev0, _ = await _two_nodes(tmp_path, backend, write, lambda ev: [e for e in ev if e["kind"] == "part-conflict"])
        (c,) = [e for e in ev0 if e["kind"] == "part-conflict"]
        assert c["path"] == "config.json" and c["nodes"] == [0, 1]
        assert not (tmp_path / "persist" / "step_001").exists()


def test_nodes_key(tmp_path):
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text('[[sync]]\nfrom = "/l/ckpt"\nto = "/p/ckpt"\nnodes = "auto"\n')
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[01-03]", "SLURM_JOB_NUM_NODES": "3"}
    cfg = build_config(flags={"run_dir": str(tmp_path / "r")}, command=("true",), config_file=cfg_file, env=env)
    assert cfg.sync[0].nodes == 0  # auto: the plan knows the job, config does not
    assert make_plan(cfg, env).cfg.sync[0].nodes == 3
    assert make_plan(cfg, {}).cfg.sync[0].nodes == 1
    cfg = build_config(flags={"run_dir": str(tmp_path / "r")}, flag_pairs=[("checkpoint", "/l/a", "/p/a"),
                       ("log", "/l/tb", "/p/tb")], command=("true",), env={}, flag_nodes="4")
    assert [p.nodes for p in cfg.sync] == [4, 1]
    bad = tmp_path / "bad.toml"
    bad.write_text('[[sync]]\nkind = "log"\nfrom = "/l/tb"\nto = "/p/tb"\nnodes = 2\n')
    with pytest.raises(ConfigError, match="only checkpoint pairs"):
        build_config(flags={"run_dir": str(tmp_path / "r")}, command=("true",), config_file=bad, env={})
    with pytest.raises(ConfigError, match="node count"):
        build_config(flags={"run_dir": str(tmp_path / "r")}, command=("true",), env={}, flag_nodes="0")
