"""The shared suspect-node list (``suspect_nodes``, docs/slurm.md "The shared suspect-node list"),
through the real supervise: one run's suspect node is written to the list, the next run reads it
at its start and its requeue leaves the node out (under the test Slurm); entries expire; a list
that is a link, writable by everyone, binary or hostile is ignored with a warning; many writers
at once lose nothing."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor import suspects
from supervisor.journal import read_journal
from tests.support.journal import events
from tests.support.slurm import SLURM_POLL
from tests.support.supervise import run_supervise
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
FAKE_NVML = REPO / "tests" / "chaos" / "_fakenvml"
XID_79 = json.dumps({"gpus": [{"xids": [[0.5, 79]]}]})
NODE = os.uname().nodename.split(".")[0]  # this_node() outside Slurm


def _quick(tmp_path: Path, name: str, *flags: str) -> tuple[Path, str]:
    run = tmp_path / name
    r = run_supervise("--run-dir", str(run), "--gpu-every", "0", *flags, "--", "true", timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return run, r.stderr


def test_a_suspect_node_goes_on_the_list_and_the_next_run_reads_it_at_start(tmp_path: Path) -> None:
    listing = tmp_path / "shared" / "suspect-nodes.jsonl"
    env = {"PYTHONPATH": f"{FAKE_NVML}:{REPO}", "CHAOS_FAKE_NVML": XID_79}
    r = run_supervise("--run-dir", str(tmp_path / "a"), "--gpu-backend", "nvml", "--gpu-every", "0.5",
                      "--suspect-nodes", str(listing), "--checkpoints", str(tmp_path / "local"), str(tmp_path / "persist"),
                      "--time-limit", "4s", "--warn-before", "2s", "--grace", "3s", "--",
                      sys.executable, str(REPO / "tests" / "helpers" / "trainer.py"), str(tmp_path / "local"),
                      env=env, timeout=90)
    assert r.returncode == 75, r.stderr[-3000:]  # stopped at the time limit, not requeued: unfinished
    added = [e for e in events(tmp_path / "a", "suspect-nodes") if e["action"] == "added"]
    assert added and added[0]["node"] == NODE and added[0]["why"] == "XID 79 on GPU 0", events(tmp_path / "a", "suspect-nodes")
    entry = json.loads(listing.read_text().splitlines()[0])
    assert entry["node"] == NODE and entry["run_dir"] == str(tmp_path / "a")

    run, stderr = _quick(tmp_path, "b", "--suspect-nodes", str(listing))
    read = events(run, "suspect-nodes")[0]
    assert read["action"] == "read" and read["when"] == "start" and read["nodes"] == [NODE] and read["here"] is True
    assert f"this node, {NODE}, is on the shared suspect-node list" in stderr


def test_suspect_nodes_ttl_expires_an_entry_for_the_real_supervise(tmp_path: Path) -> None:
    listing = tmp_path / "suspect-nodes.jsonl"
    now = time.time()
    listing.write_text(json.dumps({"node": "old-node", "t": now - 2 * 3600, "why": "XID 79"}) + "\n"
                       + json.dumps({"node": "fresh-node", "t": now - 60, "why": "hang"}) + "\n")
    run, _ = _quick(tmp_path, "run", "--suspect-nodes", str(listing), "--suspect-nodes-ttl", "1h")
    read = events(run, "suspect-nodes")[0]
    assert read["nodes"] == ["fresh-node"] and read["expired"] == 1, read
    run, _ = _quick(tmp_path, "default", "--suspect-nodes", str(listing))  # 24 h by default: both hold
    assert events(run, "suspect-nodes")[0]["nodes"] == ["fresh-node", "old-node"]


def test_a_hostile_list_is_ignored_with_a_warning_and_never_followed(tmp_path: Path) -> None:
    now = time.time()
    good = json.dumps({"node": "n7", "t": now - 5, "why": "XID 79"})
    target = tmp_path / "authorized_keys"
    target.write_text("")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    run, stderr = _quick(tmp_path, "link", "--suspect-nodes", str(link))
    assert "symbolic link" in (events(run, "suspect-nodes")[0]["ignored"] or "") and "list ignored" in stderr
    assert target.read_text() == ""

    wide = tmp_path / "wide.jsonl"
    wide.write_text(good + "\n")
    wide.chmod(0o666)
    run, _ = _quick(tmp_path, "wide", "--suspect-nodes", str(wide))
    assert "writable by everyone" in events(run, "suspect-nodes")[0]["ignored"] and events(run, "suspect-nodes")[0]["nodes"] == []

    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(os.urandom(64) + b"\0")
    run, _ = _quick(tmp_path, "binary", "--suspect-nodes", str(binary))
    assert "binary" in events(run, "suspect-nodes")[0]["ignored"]

    hostile = tmp_path / "hostile.jsonl"
    bad = [{"node": "n[1-999]", "t": now}, {"node": "a,b", "t": now}, {"node": "n8", "t": now + 86400},
           {"node": "n9", "t": float("nan")}, {"node": "-x", "t": now}, [1, 2], "{not json"]
    hostile.write_text("\n".join(json.dumps(b) if not isinstance(b, str) else b for b in bad) + "\n" + good + "\n")
    run, stderr = _quick(tmp_path, "hostile", "--suspect-nodes", str(hostile))
    read = events(run, "suspect-nodes")[0]
    assert read["nodes"] == ["n7"] and read["bad_lines"] == len(bad) and read["ignored"] is None, read
    assert "7 line(s) ignored" in stderr


def test_a_link_planted_as_the_list_is_never_written_through(tmp_path: Path) -> None:
    """A suspect node's stop appends to the list: never through a link planted at its path."""
    target = tmp_path / "victim"
    target.write_text("keep\n")
    link = tmp_path / "suspect-nodes.jsonl"
    link.symlink_to(target)
    env = {"PYTHONPATH": f"{FAKE_NVML}:{REPO}", "CHAOS_FAKE_NVML": XID_79}
    r = run_supervise("--run-dir", str(tmp_path / "run"), "--gpu-backend", "nvml", "--gpu-every", "0.5",
                      "--suspect-nodes", str(link), "--time-limit", "3s", "--warn-before", "1s", "--grace", "2s", "--",
                      sys.executable, "-c", "import time; time.sleep(30)", env=env, timeout=60)
    assert r.returncode == 143, r.stderr[-2000:]  # the sleep died of the stop's TERM
    failed = [e for e in events(tmp_path / "run", "suspect-nodes") if e["action"] == "add-failed"]
    assert failed and "symbolic link" in failed[0]["error"], events(tmp_path / "run", "suspect-nodes")
    assert target.read_text() == "keep\n"


def _writer(path: str, k: int, n: int) -> None:
    for i in range(n):
        suspects.add(Path(path), suspects.Entry(f"w{k}-n{i}", time.time(), "XID 79 " + "x" * 150), ttl=3600)


def test_many_writers_at_once_lose_no_entry_across_compactions(tmp_path: Path) -> None:
    """Eight processes append at once onto a list already near the compaction size: every entry
    is there afterwards, every line whole, and the expired filler is gone."""
    listing = tmp_path / "suspect-nodes.jsonl"
    old = time.time() - 7200
    filler = "".join(json.dumps({"node": f"old{i}", "t": old, "why": "x" * 150}) + "\n" for i in range(1300))
    listing.write_text(filler)
    assert len(filler) > suspects.COMPACT_BYTES * 0.9
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(listing), k, 60)) for k in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    got = suspects.read(listing, ttl=3600)
    assert got.bad == 0 and got.ignored is None
    assert sorted(got.nodes) == sorted(f"w{k}-n{i}" for k in range(8) for i in range(60))
    assert "old0" not in listing.read_text(), "the compaction dropped the expired entries"


def _job(tmp_path: Path, name: str, listing: Path, extra_env: str) -> str:
    return f"""#!/bin/bash
#SBATCH --requeue
#SBATCH --output={tmp_path}/{name}.txt
for v in ${{!SUPERVISE_@}}; do unset "$v"; done
cd {REPO}
export PYTHONPATH={FAKE_NVML}:{REPO} {extra_env}
exec {sys.executable} -m supervisor --run-dir {tmp_path}/{name} --gpu-backend nvml --gpu-every 0.5 \\
    --suspect-nodes {listing} --checkpoints {tmp_path}/{name}-local {tmp_path}/{name}-persist \\
    --time-limit 6s --warn-before 3s --grace 3s --requeue -- \\
    {sys.executable} {REPO}/tests/helpers/trainer.py {tmp_path}/{name}-local
"""


def _requeue_step(run: Path) -> dict | None:
    return next((e for e in read_journal(run).events if e.get("kind") == "stop-step" and e.get("step") == "requeue"),
                None)


@pytest.mark.slurm
def test_the_list_written_by_one_job_excludes_the_node_in_another_jobs_requeue(slurm, tmp_path: Path) -> None:
    """Job A sees XID 79 and writes its node to the shared list; job B, on the same node with
    no fault of its own, reads the list at its start and its requeue excludes the node."""
    listing = tmp_path / "shared" / "suspect-nodes.jsonl"
    a = slurm.submit(_job(tmp_path, "a", listing, f"CHAOS_FAKE_NVML='{XID_79}'"))
    try:
        step = wait_for(lambda: _requeue_step(tmp_path / "a"), 120, lambda: (tmp_path / "a.txt").read_text()[-3000:],
                        interval=SLURM_POLL)
        node = step["excluded"][0]
        assert step["requeued"] is True and step["suspect"] == ["XID 79 on GPU 0"], step
    finally:
        slurm.cancel(a)
    assert json.loads(listing.read_text().splitlines()[0])["node"] == node

    b = slurm.submit(_job(tmp_path, "b", listing, "CHAOS_FAKE_NVML='{\"gpus\": [{}]}'"))
    try:
        step = wait_for(lambda: _requeue_step(tmp_path / "b"), 120, lambda: (tmp_path / "b.txt").read_text()[-3000:],
                        interval=SLURM_POLL)
        assert step["requeued"] is True and step["suspect"] == [], step
        assert step["listed"] == [node] and step["excluded"] == [node], step
        assert slurm.show(b).get("ExcNodeList") == node
        start = next(e for e in events(tmp_path / "b", "suspect-nodes") if e.get("when") == "start")
        assert start["nodes"] == [node] and start["here"] is True, start
        assert not any(e["kind"] == "gpu-xid" for e in read_journal(tmp_path / "b").events)
    finally:
        slurm.cancel(b)
    # The fleet view over both run directories: two requeued runs, and the node A's XID implicates.
    r = subprocess.run([sys.executable, "-m", "supervisor", "report", str(tmp_path / "a"), str(tmp_path / "b"), "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [(x["name"], x["state"]) for x in sorted(doc["runs"], key=lambda x: x["name"])] == [("a", "requeued"), ("b", "requeued")]
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert nodes[node]["suspect"] is True and nodes[node]["counts"]["xid"] >= 1 and nodes[node]["runs"] == ["a"]
