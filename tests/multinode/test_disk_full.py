"""A node's local disk fills (issue 21): the 2-node torchrun DCP job on n1+n2, where n2's
node-local directory is a 20 KiB tmpfs mounted inside n2's own mount namespace (its
slurmd's), so two checkpoints of ranks 2-3 fit and the third cannot be written.

What must hold: every checkpoint on persistent storage holds every rank's shards and none is
ever seen partial (the one n2 could not write is never published), the job ends by itself
well inside a bound (no wait for a part that cannot come), and the journals name n2.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.multinode._dcp_job import SHARDS, PublishedWatch, submit_job
from tests.support.journal import events
from tests.support.slurm import NODES_POLL, SlurmCluster
from tests.support.wait import wait_for


def slurmd_pid(c: SlurmCluster, node: str) -> int:
    return int((c.root / "run" / f"slurmd-{node}.bg").read_text())


def in_node(c: SlurmCluster, node: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in ``node``'s mount namespace (where its local directory is)."""
    return subprocess.run(["nsenter", "-t", str(slurmd_pid(c, node)), "-m", *argv], capture_output=True, text=True,
                          timeout=30)


def test_a_full_local_disk_on_one_node_publishes_nothing_partial(cluster3: SlurmCluster, tmp_path: Path) -> None:
    c = cluster3
    t0 = time.monotonic()
    mount = in_node(c, "n2", "mount", "-t", "tmpfs", "-o", "size=20k", "tmpfs", str(c.local))
    assert mount.returncode == 0, mount.stderr
    job, run, progress, _final = submit_job(c)
    leader = run / "events.jsonl"
    watch = PublishedWatch(c)

    def ended() -> bool:
        watch()
        return c.state(job) not in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING", None) \
            or any(e.get("kind") == "end" for e in events(leader))

    wait_for(ended, 180, lambda: f"the job's end; job {c.state(job)}", interval=0.2)
    print(f"disk-full: {time.monotonic() - t0:.1f}s job {c.state(job)}", flush=True)
    wait_for(lambda: any(e.get("kind") == "end" for e in events(leader)), 30, "the leader's end", interval=NODES_POLL)
    ev = events(leader)
    node1 = events(run / "nodes" / "node-1" / "events.jsonl")

    # n2 could not write ranks 2-3's shards of a checkpoint: the training died (DCP raises on every rank)
    end = next(e for e in ev if e.get("kind") == "end")
    assert end["reason"] == "child-failed", end
    saved = [e["step"] for e in map(json.loads, progress.read_text().splitlines()) if e["what"] == "saved"]
    assert saved and max(saved) < 40, saved
    broken = f"step_{max(saved) + 5:05d}"
    # nothing partial was ever published: the checkpoint n2 could not hold is not, the earlier ones are whole
    now = watch()
    assert not watch.torn, watch.torn
    assert broken not in now and sorted(now) == [f"step_{s:05d}" for s in saved], (broken, now)
    assert all(files == SHARDS for files in now.values()), now
    assert any(broken in str(x) for x in end.get("not_durable") or []), end
    # the stop did not wait for a part that cannot come: the training's exit → the leader's end in seconds
    exit_t = next(e["t"] for e in ev if e.get("kind") == "child-exit")
    assert end["t"] - exit_t < 10.0, (exit_t, end)
    assert sum(float(e.get("seconds") or 0) for e in ev if e.get("kind") == "stop-step") < 5.0
    # node 1's journal named its node and host before the save that failed (the next one would not fit)
    full = [e for e in node1 if e.get("kind") == "local-disk-full"]
    assert len(full) == 1 and full[0]["node"] == 1 and full[0]["host"] == "n2", full
    assert full[0]["free_bytes"] < full[0]["need_bytes"] and full[0]["t"] < exit_t, full
    # and the report's row for n2 says so
    report = subprocess.run([sys.executable, "-m", "supervisor", "report", str(run)], capture_output=True, text=True,
                            timeout=60)
    assert report.returncode == 0, report.stderr
    n2 = report.stdout.split("\nNodes", 1)[1].split("node n2:", 1)[1].split("\n", 1)[0]
    assert "local disk full in attempt 1" in n2, report.stdout
    shutil.copytree(run, tmp_path / "run")  # the journals where the contract check reads every real run's
    print(f"disk-full: {time.monotonic() - t0:.1f}s", flush=True)
