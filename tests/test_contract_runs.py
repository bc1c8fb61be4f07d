"""Real `supervise` runs for journal kinds and notifications that no other test's run produces
(the contract of tests/test_contract.py, checked after a whole run by tests/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from supervisor.journal import read_journal
from tests.support.supervise import run_supervise
from tests.support.webhook import Server


def kinds(run: Path) -> list[str]:
    return [e["kind"] for e in read_journal(run).events]


def script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "train.py"
    path.write_text("import os, sys, time, shutil\nfrom pathlib import Path\n" + textwrap.dedent(body))
    return [sys.executable, str(path)]


def test_a_checkpoint_that_keeps_changing_while_copied_is_deferred(tmp_path: Path) -> None:
    """Replaced (written beside, renamed in) every few milliseconds after its marker, so no file
    of the checkpoint is ever open: every copy's re-scan differs, three times in a pass, so the
    pass defers it rather than publish a mix. (Rewritten in place, the file was open at nearly
    every scan, "being written", and the pass copied it too seldom to defer it: 1 run in 14
    published it without a deferral.)"""
    local, run = tmp_path / "local", tmp_path / "run"
    cmd = script(tmp_path, f"""
        d = Path({str(local)!r}) / "step_1"; d.mkdir(parents=True)
        (d / ".metadata").write_text("m")
        end = time.time() + 4
        n = 0
        while time.time() < end:
            with open(d.parent / "shard.tmp", "wb") as f:
                f.write(bytes([n % 256]) * (4 << 20))
            os.replace(d.parent / "shard.tmp", d / "shard.bin")
            n += 1
    """)
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), str(tmp_path / "p"), "--gpu-every", "0",
                      "--sync-backend", "python", "--", *cmd, timeout=90)
    assert r.returncode == 0, r.stderr
    assert "sync-deferred" in kinds(run)


def test_a_restore_that_cannot_write_the_local_side_is_journaled_and_the_run_goes_on(tmp_path: Path) -> None:
    if subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip() != "0":
        pytest.skip("needs root to mount a read-only tmpfs as the local side")
    persist, local, run = tmp_path / "p", tmp_path / "ro", tmp_path / "run"
    (persist / "step_1").mkdir(parents=True)
    (persist / "step_1" / ".metadata").write_text("m")
    local.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(local)], capture_output=True, text=True)
    if m.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {m.stderr.strip()}")
    try:
        r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--restore",
                          "--gpu-every", "0", "--", "true", timeout=60)
    finally:
        subprocess.run(["umount", str(local)], check=False)
    assert r.returncode == 0, r.stderr
    assert "restore-failed" in kinds(run)
    assert "restore failed" in r.stderr


def test_a_hang_is_notified(server: Server, tmp_path: Path) -> None:
    run = tmp_path / "run"
    r = run_supervise("--run-dir", str(run), "--gpu-every", "0", "--hang-after", "1s", "--hang-action", "stop",
                      "--notify", server.url("json"), "--", "sleep", "30", timeout=60)
    sent = [json.loads(h["body"])["event"] for h in server.hits("json")]
    assert "hang" in sent and "hang" in kinds(run), (sent, r.stderr)
    assert json.loads((run / "events.jsonl").read_text().splitlines()[-1])["reason"] == "hang"


def test_parts_that_disagree_are_a_conflict_and_a_changed_part_is_withdrawn(tmp_path: Path, reaper: list[int]) -> None:
    """Two real processes, a leader and a node agent, each with its own local side."""
    from tests.support.journal import events
    from tests.support.two_nodes import TwoNodeJob

    job = TwoNodeJob(tmp_path, "python", reaper)
    for node, content in ((0, b"zero"), (1, b"one!")):
        d = job.local[node] / "step_1"
        d.mkdir(parents=True)
        (d / "shard.bin").write_bytes(b"s" * 10 + bytes([node]))
        (d / "config.json").write_bytes(content)  # the same path, different contents
    (job.local[0] / "step_1" / ".metadata").write_text("m")
    job.start_node()
    job.start_leader()
    job.wait_ready()
    deadline = time.monotonic() + 30
    while not events(job.leader_journal, "part-conflict") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert events(job.leader_journal, "part-conflict")
    (job.local[1] / "step_1" / "config.json").write_bytes(b"zero")  # node 1 changes its part: withdrawn, recopied
    while not events(job.node_journal, "part-withdrawn") and time.monotonic() < deadline + 30:
        time.sleep(0.1)
    assert events(job.node_journal, "part-withdrawn")
    job.stop_leader()


def test_a_webhook_that_keeps_failing_is_journaled_and_the_run_goes_on(server: Server, tmp_path: Path) -> None:
    run = tmp_path / "run"
    r = run_supervise("--run-dir", str(run), "--gpu-every", "0", "--notify", server.url("fail"), "--", "true",
                      timeout=60)
    assert r.returncode == 0, r.stderr
    assert "notify-failed" in kinds(run)
