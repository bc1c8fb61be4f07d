"""The test Slurm clusters and what the tests do with them.

``Slurm``: a throwaway single-node Slurm 22.05 for the whole test session (``scripts/slurm-up.sh
ROOT`` installs it with apt-get and starts munged, slurmctld and slurmd under ROOT;
``scripts/slurm-down.sh`` stops them). ``SlurmCluster``: the multi-node cluster,
``scripts/slurm-up.sh ROOT --nodes N`` (docs/multinode.md; tests/support/cluster.py), clients
run through ``ROOT/in-cluster``; it needs root, iproute2, util-linux and Slurm. The fixtures
(tests/slurm/conftest.py, tests/multinode/conftest.py) skip with the reason where a cluster
cannot start (in CI, as root, none skips: REQUIRE_ALL_COMPONENTS turns a skip into a failure).
Helpers poll with generous bounds; nothing sleeps and hopes.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pytest

from tests.support.cluster import NodeCluster
from tests.support.paths import ROOT
from tests.support.wait import wait_for

UP = ROOT / "scripts" / "slurm-up.sh"
DOWN = ROOT / "scripts" / "slurm-down.sh"
SCRIPTS = ROOT / "scripts"  # the job-script templates
SITE_ONLY = re.compile(r"^#SBATCH --(gres|gpus-per-node|constraint|partition)\b")
# Job states in which a job is still in the queue (squeue lists it).
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
          "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}
# How often a test asks: each look at a job forks a Slurm client (scontrol, sacct).
SLURM_POLL = 0.2  # the single-node cluster
NODES_POLL = 0.1  # the multi-node cluster


# ----------------------------------------------------------------------------- one node

class Slurm:
    """A running single-node cluster and the few operations tests need."""

    def __init__(self, root: Path, conf: Path) -> None:
        self.root = root
        self.conf = conf
        self.env = {**os.environ, "SLURM_CONF": str(conf)}
        self.kill_wait = 5.0  # slurm-up.sh writes KillWait=5

    # -- commands
    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster (argv, no shell)."""
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def submit(self, script: str | Path, *sbatch_args: str, cwd: Path | None = None,
               env: dict[str, str] | None = None) -> str:
        """sbatch a script (its text, or a path) and return the job id."""
        if isinstance(script, str) and not script.startswith("/") and "\n" in script:
            fd, name = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.root)
            with os.fdopen(fd, "w") as f:
                f.write(script)
            path = Path(name)
        else:
            path = Path(script)
        proc = subprocess.run(["sbatch", "--parsable", *sbatch_args, str(path)],
                              env={**self.env, **(env or {})}, capture_output=True, text=True,
                              timeout=60, cwd=cwd or self.root, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise AssertionError(f"sbatch failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def cancel(self, jobid: str, *args: str) -> None:
        self.run("scancel", *args, jobid)

    def release(self, jobid: str, timeout: float = 60.0) -> None:
        """Skip the requeued job's BeginTime (end + 120 s): start it as soon as it can.

        Repeated until the job leaves PENDING: squeue can show PENDING while the requeue is
        still completing, and the requeue's own BeginTime then overwrites an early update.
        Not within the second of the requeue: slurmd compares credential times to the second
        and kills a relaunch in that same second ("Job credential revoked", state FAILED).
        """
        next_second = math.floor(time.time()) + 1.05
        while time.time() < next_second:  # a clock boundary, not a guess: at most ~1 s
            time.sleep(0.05)

        def started() -> bool:
            self.run("scontrol", "update", f"JobId={jobid}", "StartTime=now", check=False)
            try:
                wait_for(lambda: self.state(jobid) != "PENDING", 2.0, interval=0.1)
            except AssertionError:
                return False
            return True
        wait_for(started, timeout, lambda: f"job {jobid} still {self.state(jobid)} after StartTime=now", interval=SLURM_POLL)

    # -- state
    def show(self, jobid: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict; {} once the controller forgot the job."""
        proc = self.run("scontrol", "show", "job", "-o", jobid, check=False)
        if proc.returncode != 0:
            return {}
        return dict(re.findall(r"(\S+?)=(\S*)", proc.stdout))

    def sacct(self, jobid: str) -> dict[str, str]:
        """The job's ``sacct -c`` (jobcomp/filetxt) row, {} when it has none yet."""
        fields = "JobID,JobName,State,ExitCode,Start,End,NodeList"
        proc = self.run("sacct", "-c", "-j", jobid, "--parsable2", "--noheader", "-o", fields, check=False)
        rows = [dict(zip(fields.split(","), ln.split("|"))) for ln in proc.stdout.splitlines() if ln]
        rows = [r for r in rows if r.get("JobID") == jobid]
        return rows[-1] if rows else {}

    def state(self, jobid: str) -> str | None:
        """JobState from scontrol, else from sacct -c; None when neither knows the job."""
        st = self.show(jobid).get("JobState")
        if st:
            return st
        st = self.sacct(jobid).get("State")
        return st.split()[0] if st else None

    def wait_state(self, jobid: str, states: str | Iterable[str], timeout: float = 120.0) -> str:
        """Poll until the job is in one of ``states``; fail with the last state seen."""
        want = {states} if isinstance(states, str) else set(states)
        return wait_for(lambda: (s := self.state(jobid)) in want and s, timeout,
                        lambda: f"job {jobid} not in {sorted(want)}; last {self.state(jobid)}", interval=SLURM_POLL)

    def wait_gone(self, jobid: str, timeout: float = 180.0) -> str:
        """Poll until the job left the queue (a final state); returns that state."""
        def done() -> str | None:
            s = self.state(jobid)
            return s if s is not None and s not in ACTIVE else None
        return wait_for(done, timeout, lambda: f"job {jobid} still {self.state(jobid)}", interval=SLURM_POLL)


def model_digest(step_dir: Path) -> str:
    """sha256 over a checkpoint's model state_dict, as examples/ddp_train.py prints it."""
    torch = pytest.importorskip("torch")
    state = torch.load(step_dir / "model.pt", map_location="cpu", weights_only=False)["model"]
    h = hashlib.sha256()
    for name, t in state.items():
        h.update(name.encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def local_copy(name: str) -> str:
    """The template's text without the lines naming hardware this cluster lacks."""
    lines = (SCRIPTS / name).read_text().splitlines(keepends=True)
    kept = [ln for ln in lines if not SITE_ONLY.match(ln)]
    assert len(lines) - len(kept) <= 4
    return "".join(kept)


# ----------------------------------------------------------------------------- many nodes

def why_not() -> str | None:
    """Why this machine cannot run the multi-node cluster, or None."""
    if os.geteuid() != 0:
        return "the multi-node cluster needs root (network namespaces, bind mounts)"
    for tool in ("ip", "unshare", "nsenter", "munged", "slurmctld", "slurmd", "sbatch"):
        if shutil.which(tool) is None:
            return f"the multi-node cluster needs {tool} (scripts/setup.sh installs Slurm and munge)"
    return None


class SlurmCluster(NodeCluster):
    """A running multi-node cluster and what the tests do to it."""

    ENV_FILE = "multinode.env"

    def run(self, *argv: str, check: bool = True, timeout: float = 60,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.root / "in-cluster"), *argv], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def submit(self, script: str, *args: str, env: dict[str, str] | None = None) -> str:
        path = self.shared / f"job-{time.time_ns()}.sh"
        path.write_text(script)
        return self.run("sbatch", "--parsable", *args, str(path), env=env).stdout.strip().split(";")[0]

    def show(self, jobid: str) -> dict[str, str]:
        proc = self.run("scontrol", "show", "job", "-o", jobid, check=False)
        return dict(re.findall(r"(\S+?)=(\S*)", proc.stdout)) if proc.returncode == 0 else {}

    def state(self, jobid: str) -> str | None:
        return self.show(jobid).get("JobState")

    def node_state(self, node: str) -> str:
        """The controller's state of ``node``, lower case (``down+not_responding``). Not sinfo's
        ``%T``: while a requeued job still completes on a dead node, sinfo prints ``mixed*``
        for a node the controller has set DOWN (seen for 80 s and more)."""
        out = self.run("scontrol", "-o", "show", "node", node).stdout
        m = re.search(r"\bState=(\S+)", out)
        return m.group(1).lower() if m else "?"

    def is_down(self, node: str) -> bool:
        """Down, drained or failed, whatever else the state says (``mixed+down``)."""
        return any(w in self.node_state(node) for w in ("down", "drain", "fail"))

    def wait_down(self, node: str, timeout: float) -> bool:
        """Whether Slurm marked ``node`` down (or drained, failed) within ``timeout`` seconds."""
        try:
            wait_for(lambda: self.is_down(node), timeout, f"{node} down", interval=NODES_POLL)
        except AssertionError:
            return False
        return True

    def release(self, jobid: str, timeout: float = 60.0) -> None:
        """Start a requeued job now instead of at its BeginTime (not within the second of
        the requeue: slurmd would take the relaunch's credential for a revoked one)."""
        deadline = time.monotonic() + timeout
        time.sleep(1.1)
        # Until it runs (or ended): a requeue still completing sets its own BeginTime after an
        # early update, and the states on the way (REQUEUED, COMPLETING, PENDING) come and go.
        while (state := self.state(jobid)) not in ("RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            self.run("scontrol", "update", f"JobId={jobid}", "StartTime=now", check=False)
            if time.monotonic() > deadline:
                raise AssertionError(f"job {jobid} still {state} after StartTime=now")
            time.sleep(1.0)

    def hosts(self, jobid: str) -> list[str]:
        """The job's nodes now, expanded (``n[2,4]`` → n2, n4)."""
        return self.run("scontrol", "show", "hostnames", self.show(jobid)["NodeList"]).stdout.split()

    def requeue_off(self, jobid: str, node: str) -> None:
        """Requeue the job with ``node`` excluded, and start it at once (``requeuehold``: a
        plain requeue restarts at once, on the same nodes)."""
        self.run("scontrol", "requeuehold", jobid)
        self.run("scontrol", "update", f"JobId={jobid}", f"ExcNodeList={node}")
        self.run("scontrol", "release", jobid)
        self.release(jobid)

    def node_dies(self, jobid: str, node: str) -> None:
        """``node`` dies with everything on it; Slurm (or, late, the test as an admin would)
        marks it down, the job is requeued, and released at once onto the nodes left."""
        self.kill_node(node)
        if not self.wait_down(node, 90):
            self.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=killed-by-the-test")
        restarts = int(self.show(jobid).get("Restarts", "0"))
        try:
            wait_for(lambda: self.state(jobid) in ("PENDING", "REQUEUED")
                     or int(self.show(jobid).get("Restarts", "0")) > restarts and self.state(jobid) != "COMPLETING",
                     30, "the requeued job done completing", interval=NODES_POLL)
        except AssertionError:
            self.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=killed-by-the-test")
        self.run("scontrol", "update", f"JobId={jobid}", "ExcNodeList=")
        self.release(jobid)

    def time_limit_passes(self, jobid: str, minutes: int, timeout: float = 240,
                          while_queued: Callable[[], None] | None = None) -> None:
        """The job runs into its time limit (a short ``#SBATCH --time``): supervise stops it
        ahead of the end and requeues it itself; then the next attempt gets ``minutes``
        (``TimeLimit``, set while it waits) and is started at once. ``while_queued`` runs
        between the two (the previous attempt has ended, the next one not begun)."""
        restarts = int(self.show(jobid).get("Restarts", "0"))
        wait_for(lambda: int(self.show(jobid).get("Restarts", "0")) > restarts, timeout,
                 lambda: f"job {jobid} requeued by supervise at its time limit ({self.show(jobid).get('JobState')})",
                 interval=0.5)
        self.run("scontrol", "update", f"JobId={jobid}", f"TimeLimit={minutes}")
        if while_queued is not None:
            while_queued()
        self.release(jobid)

    def four_interruptions(self, jobid: str, published: Callable[[int], int], said: Callable[[], str],
                           log: Callable[[str], None], timeout: float = 300,
                           requeued: tuple[Callable[[], None], Callable[[], None]] | None = None) -> list[list[str]]:
        """What a multi-node job meets, one an attempt, each once the attempt has published
        (``published(attempt)``) a version (the time limit's) or two (the others): the time limit (a job submitted with
        ``--time=1`` and ``requeue = true``: supervise stops ahead and requeues it; then it gets
        30 minutes), a requeue onto other nodes, its non-batch node's death, its batch node's
        death (the leader with it); attempt 5 runs to the end. The nodes of each attempt.
        ``requeued``: what runs while the time limit's requeue waits in the queue, and what
        runs once attempt 2 is started (before its publishes are waited for)."""
        def after(attempt: int, versions: int) -> list[str]:
            wait_for(lambda: published(attempt) >= versions, timeout,
                     lambda: f"{versions} versions published in attempt {attempt}; {said()}", interval=0.5)
            return self.hosts(jobid)

        first = after(1, 1)  # the limit itself ends attempt 1: in CI Lightning saved twice before it
        assert first == ["n1", "n2"], first
        self.time_limit_passes(jobid, minutes=30, while_queued=requeued[0] if requeued else None)
        log("requeued at the time limit")
        if requeued:
            requeued[1]()
        second = after(2, 2)
        self.requeue_off(jobid, second[0])
        log(f"requeued off {second[0]}")
        third = after(3, 2)
        assert second[0] not in third, (second, third)
        log(f"{third[1]} dies")
        self.node_dies(jobid, third[1])
        fourth = after(4, 2)
        assert third[1] not in fourth, (third, fourth)
        log(f"{fourth[0]} dies")
        self.node_dies(jobid, fourth[0])
        wait_for(lambda: self.state(jobid) == "COMPLETED", timeout, lambda: f"job {jobid} completed; {said()}", interval=0.5)
        fifth = self.hosts(jobid)
        log(f"completed; nodes {[first, second, third, fourth, fifth]}")
        return [first, second, third, fourth, fifth]

    def agent_pids(self, node: str) -> list[int]:
        """The node agents (not their srun) running on ``node``."""
        out = []
        for pid in self.node_pids(node):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"node-agent" in cmd and b"srun" not in cmd[0]:
                out.append(pid)
        return out

    def kill_node(self, node: str) -> list[int]:
        """The node dies: its slurmd and every process in its namespaces are SIGKILLed (by pid),
        and its local disk is gone."""
        pids = self.node_pids(node)
        bg = self.root / "run" / f"slurmd-{node}.bg"
        if bg.exists():
            pids.append(int(bg.read_text()))
        return self._kill(node, pids, [], NODES_POLL)

    def leftovers(self) -> list[str]:
        """Namespaces, processes and mounts of this cluster still there."""
        out = [f"netns {n}" for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
               if n.startswith(self.pfx)]
        me = os.getpid()
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == me:
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            if str(self.root) in cmd and ") Z " not in stat:
                out.append(f"process {pid}: {cmd[:120]}")
        for line in Path("/proc/mounts").read_text().splitlines():
            if str(self.root) in line or f"netns/{self.pfx}" in line:
                out.append(f"mount {line}")
        return out


def attempts_of(out: str) -> dict[int, str]:
    """A job's output (``--open-mode=append``), cut at each attempt's first line, which its
    script prints as ``attempt ${SLURM_RESTART_COUNT:-0} on …``: attempt 1 is the first run."""
    parts = re.split(r"^attempt (\d+) on .*$", out, flags=re.M)
    return {int(parts[i]) + 1: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def up(nodes: int, sshd: bool = False) -> SlurmCluster:
    """Start a cluster (skips with the reason when this machine cannot); ``sshd``: an sshd on
    every node, root's key and the nodes' host key known there (``SSHD=1 slurm-up.sh``)."""
    reason = why_not()
    if not reason and sshd and not Path("/usr/sbin/sshd").exists():
        reason = "the cluster's sshd needs openssh-server (scripts/setup.sh installs it)"
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="supervise-mn-", dir="/var/tmp"))
    proc = subprocess.run(["bash", str(UP), str(root), "--nodes", str(nodes)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "SSHD": "1" if sshd else "0"})
    if proc.returncode != 0 or "export SLURM_CONF=" not in proc.stdout:
        subprocess.run(["bash", str(DOWN), str(root), "--nodes"], capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"slurm-up.sh --nodes {nodes} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return SlurmCluster(root, nodes)


def down(cluster: SlurmCluster) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(DOWN), str(cluster.root), "--nodes"], capture_output=True, text=True,
                          timeout=120)


def cluster_for_test(nodes: int, sshd: bool = False) -> Iterator[SlurmCluster]:
    """A cluster for one test, always torn down (its logs kept with SUPERVISE_KEEP_SLURM=1)."""
    c = up(nodes, sshd)
    try:
        yield c
    finally:
        down(c)
        if not os.environ.get("SUPERVISE_KEEP_SLURM"):
            shutil.rmtree(c.root, ignore_errors=True)
