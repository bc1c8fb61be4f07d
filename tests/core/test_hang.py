"""Hangs learned and explained (docs/slurm.md, "Hangs"), end to end with torchrun and gloo:
one rank stops calling allreduce, the other blocks in it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from supervisor import stacks
from tests.support.journal import events
from tests.support.paths import HELPERS
from tests.support.supervise import run_supervise

TORCHRUN = Path(sys.executable).with_name("torchrun")
pytestmark = pytest.mark.skipif(stacks.py_spy() is None, reason="py-spy is not installed (scripts/setup.sh installs it)")


def test_a_rank_that_stops_calling_allreduce_is_caught_within_the_learned_bound_and_its_stack_dumped(tmp_path: Path):
    run, log, persist = tmp_path / "run", tmp_path / "log", tmp_path / "persist"
    r = run_supervise("--run-dir", str(run), "--logs", str(log), str(persist), "--hang-after", "5m", "--hang-floor", "10s",
                      "--hang-action", "stop", "--grace", "5s", "--gpu-every", "0", "--",
                      str(TORCHRUN), "--nproc-per-node", "2", "--master-port", "29531",
                      str(HELPERS / "hang_ddp.py"), str(log), "--hang-at", "40", timeout=240)
    hang = events(run, "hang")
    assert len(hang) == 1, r.stderr[-3000:]
    h = hang[0]
    assert h["bound_s"] < 300 and h["idle_s"] < 60, h        # learned, far under hang_after
    assert h["longest_gap_s"] is not None and h["bound_s"] >= h["longest_gap_s"]
    steps = {e["step"]: e for e in events(run, "stop-step")}
    assert steps["stacks"]["outcome"] == "dumped" and len(steps["stacks"]["dumped"]) >= 2, steps["stacks"]
    assert steps["checkpoint"]["skipped"].startswith("not wanted")    # the checkpoint-free path
    assert events(run, "end")[0]["reason"] == "hang"
    groups = stacks.group(run)
    blocked = [g for g in groups if any(f.startswith("sync_gradients ") for f in g["frames"])]
    stuck = [g for g in groups if any(f.startswith("stuck_elsewhere ") for f in g["frames"])]
    assert blocked and stuck, groups
    report = run_supervise("report", str(run), timeout=60)
    assert "sync_gradients" in report.stdout, report.stdout
