"""The PBS test cluster: ``scripts/pbs-up.sh ROOT --nodes 3`` (docs/pbs.md, "The test cluster";
what it shares with the Slurm one: tests/support/cluster.py).

A real OpenPBS 23.06 (built by scripts/build-openpbs.sh from ../shared/vendor/): server,
scheduler, comm and PostgreSQL on a head, one pbs_mom per node (n1, n2, n3), each in its own
network + UTS + mount namespace with its own hostname, address, ``/tmp`` and node-local
``ROOT/local``; ``ROOT/shared`` is the persistent storage every node sees. Jobs are submitted
by the non-root job user ``alice`` (pbs_mom ignores uid-0 processes: a root job is never
signalled nor killed), the way a user submits them. One cluster serves every PBS test, one
test after another (the xdist group ``pbs``); each test sets the queue's ``kill_delay`` and
the operators it needs. It needs root and OpenPBS in /opt/pbs; elsewhere the tests skip with
the reason (in CI none skips: REQUIRE_ALL_COMPONENTS turns a skip into a failure).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.cluster import NodeCluster
from tests.support.paths import ROOT
from tests.support.wait import INTERVAL, wait_for

UP = ROOT / "scripts" / "pbs-up.sh"
DOWN = ROOT / "scripts" / "pbs-down.sh"
PBS_EXEC = Path(os.environ.get("PBS_EXEC", "/opt/pbs"))
JOB_UID = 2001
FINAL = {"F", "X"}  # finished (job history), or an array subjob's end


def why_not() -> str | None:
    """Why this machine cannot run the PBS cluster, or None."""
    if os.geteuid() != 0:
        return "the PBS cluster needs root (network namespaces, bind mounts, PBS daemons)"
    if not (PBS_EXEC / "sbin" / "pbs_server").exists():
        return f"the PBS cluster needs OpenPBS in {PBS_EXEC} (scripts/setup.sh builds it as root)"
    for tool in ("ip", "unshare", "nsenter", "setpriv"):
        if shutil.which(tool) is None:
            return f"the PBS cluster needs {tool}"
    return None


class PbsCluster(NodeCluster):
    """A running PBS cluster and what the tests do with it, as its user and as its admin."""

    ENV_FILE = "pbs.env"
    HOSTS = "conf/hosts"

    # ---- clients
    def admin(self, *argv: str, check: bool = True, timeout: float = 60,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """A PBS client (or any command) as root on the head."""
        return self._run("in-cluster", argv, check, timeout, cwd)

    def user(self, *argv: str, check: bool = True, timeout: float = 60,
             cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """A command as the job user on the head: how a user submits, signals and deletes."""
        return self._run("as-user", argv, check, timeout, cwd)

    def _run(self, wrapper: str, argv: tuple[str, ...], check: bool, timeout: float,
             cwd: Path | None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.root / wrapper), *argv], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, cwd=cwd or self.shared)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def qmgr(self, *commands: str) -> None:
        for command in commands:
            self.admin("qmgr", "-c", command)

    # ---- a test's directory and job
    def workdir(self, name: str) -> Path:
        """A directory of the shared storage that the job user owns (the job's submit dir)."""
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.shared))
        os.chown(path, JOB_UID, JOB_UID)
        path.chmod(0o755)
        return path

    def own(self, *paths: Path) -> None:
        """Hand files a test wrote as root to the job user."""
        for path in paths:
            for p in [path, *(path.rglob("*") if path.is_dir() else [])]:
                os.chown(p, JOB_UID, JOB_UID)

    def qsub(self, workdir: Path, *args: str, script: str | None = None) -> str:
        """Submit as the job user from ``workdir``: a script job (``script``) or whatever
        ``args`` say (``--`` and an executable). Returns the job id."""
        argv = list(args)
        if script is not None:
            path = workdir / f"job-{time.time_ns()}.pbs"
            path.write_text(script)
            self.own(path)
            argv.append(str(path))
        return self.user("qsub", *argv, cwd=workdir).stdout.strip()

    def job(self, jobid: str) -> dict:
        """``qstat -x -f -F json`` of the job (finished ones included); {} when unknown."""
        proc = self.admin("qstat", "-x", "-f", "-F", "json", jobid, check=False)
        if proc.returncode != 0:
            return {}
        try:
            return next(iter(json.loads(proc.stdout).get("Jobs", {}).values()), {})
        except json.JSONDecodeError:
            return {}

    def state(self, jobid: str) -> str | None:
        return self.job(jobid).get("job_state")

    def wait_state(self, jobid: str, states: set[str] | str, timeout: float = 60) -> dict:
        states = {states} if isinstance(states, str) else states
        return wait_for(lambda: (j := self.job(jobid)) and j.get("job_state") in states and j, timeout,
                        lambda: f"job {jobid} in {sorted(states)} (now {self.state(jobid)})", interval=0.2)

    # ---- a node's death and return
    def _anchor(self, node: str) -> int:
        return int((self.root / "run" / f"{node}.anchor").read_text())

    def kill_node(self, node: str) -> list[int]:
        """The node dies: its mom and every process in its namespaces are SIGKILLed (by pid; the
        namespaces' anchor is kept, so the node can come back), and its local disk is emptied.
        Returns the pids killed."""
        keep = self._anchor(node)
        return self._kill(node, [p for p in self.node_pids(node) if p != keep], [keep], INTERVAL)

    def revive_node(self, node: str) -> None:
        """A new mom on the node (PBS's own init script in its namespaces), cleared and free again."""
        subprocess.run(["nsenter", "-t", str(self._anchor(node)), "-n", "-m", "-u", "--wd=/", "--",
                        str(PBS_EXEC / "libexec" / "pbs_init.d"), "start"], capture_output=True, timeout=60,
                       env={**os.environ, "PBS_CONF_FILE": str(self.root / "conf" / f"pbs.conf.{node}")})
        self.admin("pbsnodes", "-c", node, check=False)
        wait_for(lambda: "state = free" in self.admin("pbsnodes", node, check=False).stdout, 60, f"{node} free again")

    def supervise_line(self) -> str:
        """How a job starts this checkout's supervise: the project's Python, this tree's package
        first (a worktree shares the main checkout's venv)."""
        return f"env PYTHONPATH={ROOT} {sys.executable} -m supervisor"


def keep_journals(root: Path, into: Path) -> int:
    """Copy every journal the cluster's jobs wrote (the leaders' and the node agents') under
    ``into``, where the whole run's journal contract looks (tests/conftest.py): the cluster's
    directory is under /var/tmp, not pytest's, and goes when the session ends."""
    kept = 0
    for journal in (root / "shared").rglob("events.jsonl"):
        if journal.is_file() and not journal.is_symlink():
            target = into / journal.relative_to(root / "shared")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(journal, target)
            kept += 1
    return kept
