"""docs/slurm.md, "Starting a requeued job sooner": what it says about
``scontrol update JobId=N StartTime=now``, tried on the local cluster."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from tests.support.slurm import SLURM_POLL, Slurm
from tests.support.wait import wait_for

pytestmark = pytest.mark.slurm


def test_starttime_now_after_the_requeues_second_restarts_the_job(slurm: Slurm, tmp_path: Path) -> None:
    """Requeue, then wait for the next second and for PENDING, then StartTime=now (repeated until
    the job leaves PENDING): the job runs again at once with SLURM_RESTART_COUNT=1, not FAILED."""
    out = tmp_path / "out.txt"
    script = ("#!/bin/bash\necho \"attempt ${SLURM_RESTART_COUNT:-0}\"\n"
              "if [ -z \"$SLURM_RESTART_COUNT\" ]; then exec sleep 300; fi\n")
    jobid = slurm.submit(script, "--requeue", "--open-mode=append", "-o", str(out))
    slurm.wait_state(jobid, "RUNNING", timeout=60)
    wait_for(lambda: "attempt 0" in (out.read_text() if out.exists() else ""), 60, "the first attempt's line",
             interval=SLURM_POLL)
    slurm.run("scontrol", "requeue", jobid)
    requeued = time.time()
    slurm.wait_state(jobid, "PENDING", timeout=60)
    assert time.time() >= math.floor(requeued)  # release() itself waits for the next second
    t0 = time.monotonic()
    slurm.release(jobid, timeout=60)
    assert time.monotonic() - t0 < 60, "StartTime=now did not skip the 120 s requeue delay"
    assert slurm.wait_gone(jobid, timeout=120) == "COMPLETED", (slurm.sacct(jobid), out.read_text())
    assert "attempt 1" in out.read_text()
