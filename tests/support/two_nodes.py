"""A two-node job on one machine: the leader, a real ``supervise`` (node 0), and node 1's real
``supervise node-agent``, each with its own local directory, both writing to one persistent
directory (tests/sync/test_multinode.py, tests/test_contract_runs.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tests.support.journal import events
from tests.support.supervise import start_supervise
from tests.support.wait import wait_for

TRAINING = (sys.executable, "-c", "import time; time.sleep(600)")


def write_config(path: Path, local: Path, persist: Path, backend: str) -> Path:
    path.write_text(
        f'sync_backend = "{backend}"\ngpu_every = 0\ncheckpoint_timeout = "1s"\ngrace = "3s"\n'
        f'[[sync]]\nname = "ckpt"\nfrom = "{local}"\nto = "{persist}"\nnodes = 2\nsettle = "1s"\n')
    return path


class TwoNodeJob:
    """A leader (``supervise``, node 0) and a node agent (node 1) on this machine."""

    def __init__(self, tmp: Path, backend: str, reaper: list[int]) -> None:
        self.tmp, self.backend, self.reaper = tmp, backend, reaper
        self.local = {0: tmp / "node0-local", 1: tmp / "node1-local"}
        self.persist = tmp / "persistent" / "ckpt"
        self.run = tmp / "run"
        self.leader_journal = self.run / "events.jsonl"
        self.node_journal = self.run / "nodes" / "node-1" / "events.jsonl"
        self.leader: subprocess.Popen | None = None
        self.node: subprocess.Popen | None = None

    def start_node(self) -> subprocess.Popen:
        cfg = write_config(self.tmp / "node1.toml", self.local[1], self.persist, self.backend)
        self.node = start_supervise("node-agent", "--config", str(cfg), "--run-dir", str(self.run),
                                    env={"SUPERVISE_NODE_RANK": "1"})
        self.reaper.append(self.node.pid)
        return self.node

    def start_leader(self) -> subprocess.Popen:
        cfg = write_config(self.tmp / "leader.toml", self.local[0], self.persist, self.backend)
        self.leader = start_supervise("--config", str(cfg), "--run-dir", str(self.run), "--", *TRAINING)
        self.reaper.append(self.leader.pid)
        return self.leader

    def wait_ready(self, *, node_started_at: int = 1) -> None:
        wait_for(lambda: any(e.get("trigger") == "start" for e in events(self.leader_journal, "sync")),
                 timeout=30, what="the leader's first sync pass")
        wait_for(lambda: len([e for e in events(self.node_journal, "sync") if e.get("trigger") == "start"])
                 >= node_started_at, timeout=30, what="the node agent's first sync pass")

    def stop_leader(self) -> dict:
        assert self.leader is not None
        self.leader.send_signal(signal.SIGTERM)
        try:
            self.leader.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.leader.kill()
            raise AssertionError("the leader did not end within 60 s of SIGTERM") from None
        (end,) = events(self.leader_journal, "end")
        return end
