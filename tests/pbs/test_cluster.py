"""The PBS test cluster itself: a job of the job user sees PBS as supervise reads it, and
``pbs-down.sh`` leaves nothing behind (no namespace, no PBS daemon, no PostgreSQL, no PBS_HOME)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.pbs import DOWN, UP, PbsCluster, why_not
from tests.support.supervise import pid_alive


def test_a_two_node_job_of_the_job_user_is_read_as_pbs(pbs: PbsCluster) -> None:
    work = pbs.workdir("env")
    jobid = pbs.qsub(work, script=f"""#!/bin/bash
#PBS -l select=2:ncpus=1
#PBS -l place=scatter
#PBS -l walltime=00:10:00
#PBS -j oe
#PBS -o {work}/env.out
id -u
{pbs.supervise_line()} env
""")
    info = pbs.wait_state(jobid, "F", timeout=60)
    out = (work / "env.out").read_text()
    assert info["Exit_status"] == 0, out
    lines = dict(line.split(":", 1) for line in out.splitlines()[1:] if ":" in line)
    assert out.splitlines()[0] == "2001"                       # the job user, not root
    assert lines["scheduler"].strip() == "pbs"
    assert lines["nodes"].split() == ["2:", "n1", "n2"]        # from the real PBS_NODEFILE
    assert "0h09m left" in lines["end time"] or "0h10m left" in lines["end time"], lines["end time"]


def _ours(pfx: str) -> list[str]:
    """Processes and namespaces of the cluster with prefix ``pfx`` still on the machine."""
    found = [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
             if ns.startswith(pfx)]
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if pfx in cmd:
            found.append(f"{proc.name}: {cmd[:120]}")
    return found


def test_down_leaves_no_namespace_daemon_or_postgres() -> None:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="supervise-pbs-down-", dir="/var/tmp"))
    try:
        up = subprocess.run(["bash", str(UP), str(root)], capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == f"export PBS_TEST_CLUSTER={root}"
        env = dict(line.split("=", 1) for line in (root / "pbs.env").read_text().splitlines())
        pfx, home = env["PFX"], Path(env["PHOME"])
        # it runs: a server, a datastore and the mom answer; every daemon is in our namespaces
        assert "postgres" in " ".join(_ours(pfx)) and "state = free" in subprocess.run(
            [str(root / "in-cluster"), "pbsnodes", "-a"], capture_output=True, text=True).stdout
        pids = {int(p) for ns in (f"{pfx}-sw", f"{pfx}-n1") for p in subprocess.run(
            ["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()}
        names = {Path(f"/proc/{p}/comm").read_text().strip() for p in pids}
        assert {"pbs_server.bin", "pbs_sched", "pbs_comm", "pbs_mom", "postgres"} <= names, names
        subprocess.run(["bash", str(DOWN), str(root)], capture_output=True, text=True, timeout=180, check=True)
        assert _ours(pfx) == [] and not home.exists()
        assert [p for p in pids if pid_alive(p)] == []  # zombies of the anchors may wait for init
    finally:
        subprocess.run(["bash", str(DOWN), str(root)], capture_output=True, timeout=180)
        subprocess.run(["rm", "-rf", str(root)])
