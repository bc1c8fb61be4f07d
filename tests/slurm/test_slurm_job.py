"""supervisor.sched (Slurm) against the real local Slurm: detection, end time, requeue refusals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from supervisor.sched import Job
from supervisor.sched._slurm_output import parse_slurm_time
from tests.support.slurm import Slurm

pytestmark = pytest.mark.slurm
JOBINFO = Path(__file__).with_name("jobinfo.py")


def _job_info(slurm: Slurm, tmp_path: Path, *sbatch: str) -> tuple[str, dict]:
    out = tmp_path / "info.json"
    script = f"#!/bin/bash\nexec {sys.executable} {JOBINFO} {out}\n"
    jobid = slurm.submit(script, "-J", "probe", "-o", str(tmp_path / "out.txt"), *sbatch)
    assert slurm.wait_gone(jobid, timeout=120) == "COMPLETED", (tmp_path / "out.txt").read_text()
    return jobid, json.loads(out.read_text())


def test_end_time_in_a_job_with_a_limit_is_start_plus_limit(slurm: Slurm, tmp_path: Path) -> None:
    jobid, info = _job_info(slurm, tmp_path, "--time=5")
    job = info["job"]
    assert job["scheduler"] == "slurm" and job["job_id"] == jobid and job["job_name"] == "probe"
    assert job["restart_count"] == 0 and job["env_end_time"] is None  # no SLURM_JOB_END_TIME on 22.05
    assert len(job["nodes"]) == 1 and job["ntasks"] in (None, 1)
    start = parse_slurm_time(slurm.show(jobid)["StartTime"])
    assert start is not None and info["end_time"] is not None
    assert abs(info["end_time"] - (start + 300)) <= 2, (info["end_time"], start)
    assert info["requeue_command"] == ["scontrol", "requeue", jobid]
    assert info["problems"] == []


def test_end_time_without_a_limit_is_none(slurm: Slurm, tmp_path: Path) -> None:
    _, info = _job_info(slurm, tmp_path, "--time=UNLIMITED")
    assert info["end_time"] is None and info["problems"] == []


def test_requeue_of_a_job_that_forbids_it_reports_why(slurm: Slurm, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    jobid = slurm.submit("#!/bin/bash\nexec sleep 300\n", "--no-requeue", "-o", str(tmp_path / "o.txt"))
    slurm.wait_state(jobid, "RUNNING", timeout=90)
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    try:
        job = Job(scheduler="slurm", job_id=jobid)
        ran, message = anyio.run(job.sched.requeue, job)
    finally:
        slurm.cancel(jobid)
    assert ran is False
    assert "disabled" in message and "exit 1" in message, message
    assert slurm.wait_gone(jobid, timeout=60) == "CANCELLED"
