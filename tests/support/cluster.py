"""What the two many-node test clusters share: ``scripts/slurm-up.sh ROOT --nodes N``
(docs/multinode.md) and ``scripts/pbs-up.sh ROOT --nodes N`` (docs/pbs.md).

Each node is a real daemon (``slurmd``, ``pbs_mom``) in its own network + UTS + mount namespace
(own hostname, own address on a bridge, own ``/tmp`` and node-local ``ROOT/local``, which the
machine sees at ``ROOT/nodes/NODE/local``); ``ROOT/shared`` is the persistent storage every node
sees. The script writes the names it chose to an env file in ROOT: ``PFX`` prefixes the nodes'
namespaces (``PFX-n1``). ROOT is under /var/tmp, not /tmp: every node hides the machine's /tmp
behind its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support.wait import wait_for


class NodeCluster:
    """A running many-node cluster: its directories, and a node's processes and death."""

    ENV_FILE = ""  # the file in ROOT where the cluster's script wrote PFX=…
    HOSTS = "hosts"  # the file in ROOT where it wrote every host's address (the nodes' /etc/hosts)

    def __init__(self, root: Path, nodes: int) -> None:
        self.root, self.n = root, nodes
        self.shared, self.local = root / "shared", root / "local"
        env = dict(line.split("=", 1) for line in (root / self.ENV_FILE).read_text().splitlines() if "=" in line)
        self.pfx = env["PFX"]

    @property
    def head(self) -> str:
        """The head's address: the switch namespace's (``PFX-sw``), which every node reaches."""
        return next(line.split()[0] for line in (self.root / self.HOSTS).read_text().splitlines()
                    if line.split()[1:] == ["head"])

    def own(self, *paths: Path) -> None:
        """Hand files a test wrote to the job user: none here (the Slurm cluster's jobs run as root)."""

    def node_local(self, node: str) -> Path:
        """What ``ROOT/local`` is on that node (the machine sees it here)."""
        return self.root / "nodes" / node / "local"

    def node_pids(self, node: str) -> list[int]:
        """Every process in the node's network namespace (its daemon, its jobs' tasks)."""
        return [int(p) for p in subprocess.run(["ip", "netns", "pids", f"{self.pfx}-{node}"], capture_output=True,
                                               text=True).stdout.split()]

    def _kill(self, node: str, pids: list[int], left: list[int], interval: float) -> list[int]:
        """SIGKILL ``pids`` (by pid), wait until the node's namespace holds ``left`` only, and empty
        its local disk: the node died with everything on it. Returns the pids killed."""
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        wait_for(lambda: self.node_pids(node) == left, 20, f"every process of {node} gone", interval=interval)
        for child in self.node_local(node).iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        return pids
