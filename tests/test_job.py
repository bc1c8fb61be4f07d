"""supervisor.sched without a scheduler: environment detection, hostlists, qstat -f parsing,
and the subprocess path (real processes: missing tools, slow tools, failing tools). The
scheduler is reached as callers reach it, through the job (``job.sched``)."""

from __future__ import annotations

import os
import stat
import time
from datetime import datetime
from pathlib import Path

import anyio
import pytest

from supervisor.sched import (
    SCHEDULERS, Job, Report, count_devices, detect_job, expand_hostlist, expand_tasks_per_node, gpu_count,
)
from supervisor.sched._pbs_output import parse_qstat_f, parse_walltime, pbs_end_time, pbs_gpus_per_node
from supervisor.sched._slurm_output import JobView, parse_job_view, parse_slurm_duration, parse_slurm_time

PBS = Path(__file__).parent / "fixtures" / "pbs"


async def end_time(job: Job, report: Report | None = None) -> float | None:
    return await job.sched.end_time(job, report)


async def kill_wait(job: Job, report: Report | None = None) -> float | None:
    return await job.sched.kill_wait(job, report)


async def requeue(job: Job, timeout: float = 60.0, report: Report | None = None) -> tuple[bool, str]:
    return await job.sched.requeue(job, timeout, report)


@pytest.mark.parametrize("text, hosts", [
    ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
    ("a[1-2]-b[3-4]", ["a1-b3", "a1-b4", "a2-b3", "a2-b4"]),
    ("n1,gpu[09-11],x", ["n1", "gpu09", "gpu10", "gpu11", "x"]),
    ("cn[098-101]", ["cn098", "cn099", "cn100", "cn101"]),
    ("vm", ["vm"]),
    ("r1n[1,3],r2n[5-6]", ["r1n1", "r1n3", "r2n5", "r2n6"]),
    ("", []),
])
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert list(expand_hostlist(text)) == hosts


@pytest.mark.parametrize("bad", ["gpu[01-04", "gpu]01[", "gpu[a-b]", "gpu[1-]"])
def test_expand_hostlist_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(bad)


def test_malformed_nodelist_does_not_break_detection() -> None:
    job = detect_job({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "gpu[01-"})
    assert job.nodes == ("gpu[01-",)


def test_counts() -> None:
    assert expand_tasks_per_node("2(x3),1") == (2, 2, 2, 1)
    assert count_devices("0,1,2,3") == 4 and count_devices("GPU-a,GPU-b") == 2
    assert count_devices("NoDevFiles") == 0 and count_devices("") is None and count_devices(None) is None
    assert gpu_count("4") == 4 and gpu_count("a100:4") == 4 and gpu_count("gpu:a100:8(x2)") == 8
    assert gpu_count("") is None


def test_slurm_first_run_has_restart_count_zero() -> None:
    job = detect_job({"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "vm", "SLURM_JOB_NAME": "t"})
    assert (job.scheduler, job.job_id, job.restart_count, job.nodes) == ("slurm", "12", 0, ("vm",))
    assert job.gpus_per_node is None and job.env_end_time is None


def test_slurm_requeued_array_task() -> None:
    job = detect_job({"SLURM_JOB_ID": "7702", "SLURM_ARRAY_JOB_ID": "7690", "SLURM_ARRAY_TASK_ID": "12",
                      "SLURM_RESTART_COUNT": "3", "SLURM_JOB_END_TIME": "1795270846"})
    assert job.restart_count == 3 and job.requeue_id == "7690_12"
    assert job.sched.requeue_command(job) == ["scontrol", "requeue", "7690_12"]
    assert job.env_end_time == 1795270846.0


def test_pbs_detection_reads_the_nodefile(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("n1\nn1\nn2\nn2\n")
    job = detect_job({"PBS_JOBID": "5.srv", "PBS_JOBNAME": "j", "PBS_NODEFILE": str(nodefile),
                      "PBS_O_WORKDIR": "/w"})
    assert (job.scheduler, job.nodes, job.ntasks, job.tasks_per_node) == ("pbs", ("n1", "n2"), 4, 2)
    assert job.sched.requeue_command(job) == ["qrerun", "5.srv"] and job.submit_dir == "/w"


def test_local_job_cannot_be_requeued() -> None:
    job = detect_job({"CUDA_VISIBLE_DEVICES": "0,1"})
    assert job.scheduler == "local" and job.gpus_per_node == 2 and job.sched.requeue_command(job) is None
    assert anyio.run(requeue, job)[0] is False
    assert anyio.run(end_time, job) is None


def test_slurm_time_is_local_time() -> None:
    assert parse_slurm_time("2026-11-21T13:44:55") == datetime(2026, 11, 21, 13, 44, 55).timestamp()
    assert parse_slurm_time("NONE") is None and parse_slurm_time("Unknown") is None


def test_walltime() -> None:
    assert parse_walltime("01:00:00") == 3600 and parse_walltime("36:00:00") == 129600
    assert parse_walltime("10:30") == 630 and parse_walltime("90") == 90
    assert parse_walltime("1:2:3:4") is None and parse_walltime("x") is None


def test_qstat_f_polaris_continuation_lines() -> None:
    jobs = parse_qstat_f((PBS / "polaris_running.txt").read_text())
    [(jid, attrs)] = jobs.items()
    assert jid == "1234567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"
    # Values broken mid-word by qstat are glued back without a separator.
    assert attrs["Error_Path"].endswith("/home/jdoe/proj/train_llm.e1234567")
    assert attrs["exec_vnode"] == "(x3005c0s13b0n0:ngpus=4:ncpus=64)+(x3005c0s13b1n0:ngpus=4:ncpus=64)"
    assert "PBS_O_WORKDIR=/home/jdoe/proj,PBS_O_SYSTEM=Linux" in attrs["Variable_List"]
    assert attrs["Variable_List"].endswith("PBS_O_HOST=polaris-login-02.hsn.cm.polaris.alcf.anl.gov")
    assert attrs["Resource_List.walltime"] == "01:00:00" and attrs["job_state"] == "R"
    assert pbs_gpus_per_node(attrs) == 4  # from exec_vnode: Polaris' select names no ngpus
    end = pbs_end_time(attrs, now=0)
    assert end == datetime(2025, 11, 20, 11, 15, 32).timestamp()


def test_qstat_f_array_subjob_and_queued_job() -> None:
    jobs = parse_qstat_f((PBS / "openpbs_array_and_queued.txt").read_text())
    assert list(jobs) == ["2045[3].pbs-server", "2046.pbs-server"]
    sub, queued = jobs["2045[3].pbs-server"], jobs["2046.pbs-server"]
    assert sub["array_index"] == "3" and pbs_gpus_per_node(sub) == 2
    assert pbs_end_time(sub, now=0) == datetime(2025, 11, 16, 8, 0, 0).timestamp() + 36 * 3600
    assert queued["comment"].startswith("Not Running") and pbs_end_time(queued, now=0) is None


def test_pbs_end_time_without_a_start_uses_walltime_used() -> None:
    attrs = {"Resource_List.walltime": "02:00:00", "resources_used.walltime": "00:30:00"}
    assert pbs_end_time(attrs, now=1000.0) == 1000.0 + 5400
    assert pbs_end_time({"stime": "Thu Nov 20 10:15:32 2025"}, now=0) is None  # no limit


# ---------------------------------------------------------------------------- real subprocesses

def _fake_tool(bindir: Path, name: str, body: str) -> None:
    path = bindir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH holding only our stand-ins for squeue/scontrol/qstat (real executables)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    return bindir


def test_end_time_from_squeue(fake_bin: Path) -> None:
    _fake_tool(fake_bin, "squeue", 'echo "2026-11-21T13:44:55"\n')
    job = Job(scheduler="slurm", job_id="4")
    assert anyio.run(end_time, job) == datetime(2026, 11, 21, 13, 44, 55).timestamp()


@pytest.mark.parametrize("line, expected", [
    ("2026-11-21T13:44:55 2026-11-21T13:39:55 5:00", (2026, 11, 21, 13, 44, 55)),   # EndTime = the time limit
    ("2026-11-21T13:40:10 2026-11-21T13:39:55 5:00", (2026, 11, 21, 13, 44, 55)),   # a scancel moved EndTime
    ("2026-11-21T13:40:10 2026-11-21T13:39:55 UNLIMITED", (2026, 11, 21, 13, 40, 10)),  # no limit to compare
])
def test_end_time_is_the_time_limit_not_a_cancels_end(fake_bin: Path, line: str, expected: tuple[int, ...]) -> None:
    """Issue 30, 7: a scancel landing while the end is read at start-up moved EndTime to the
    cancel time, read as the time limit reached. StartTime + TimeLimit is the limit."""
    _fake_tool(fake_bin, "squeue", f'echo "{line}"\n')
    assert anyio.run(end_time, Job(scheduler="slurm", job_id="4")) == datetime(*expected).timestamp()


@pytest.mark.parametrize("text, seconds", [
    ("5:00", 300), ("00:05:00", 300), ("1:00:00", 3600), ("1-00:00:00", 86400), ("2-12", 216000),
    ("2-12:30", 217800), ("10", 600), ("UNLIMITED", None), ("Partition_Limit", None), ("", None), ("-5", None),
])
def test_slurm_time_limits(text: str, seconds: int | None) -> None:
    assert parse_slurm_duration(text) == seconds


def test_end_time_none_for_no_limit(fake_bin: Path) -> None:
    _fake_tool(fake_bin, "squeue", 'echo NONE\n')
    _fake_tool(fake_bin, "scontrol", 'echo "should not be asked" >&2; exit 1\n')
    problems: list[str] = []
    assert anyio.run(lambda: end_time(Job(scheduler="slurm", job_id="4"), problems.append)) is None
    assert problems == []


def test_end_time_falls_back_to_scontrol(fake_bin: Path) -> None:
    _fake_tool(fake_bin, "squeue", 'echo "slurm_load_jobs error: Socket timed out" >&2; exit 1\n')
    _fake_tool(fake_bin, "scontrol", 'echo "JobId=4 JobName=x"; echo "   StartTime=2026-11-21T13:00:00 EndTime=2026-11-21T15:00:00 Deadline=N/A"\n')
    problems: list[str] = []
    got = anyio.run(lambda: end_time(Job(scheduler="slurm", job_id="4"), problems.append))
    assert got == datetime(2026, 11, 21, 15, 0, 0).timestamp()
    assert any("squeue" in p and "exited 1" in p for p in problems)


def test_env_end_time_is_a_fast_path(fake_bin: Path) -> None:
    _fake_tool(fake_bin, "squeue", 'exit 99\n')
    job = detect_job({"SLURM_JOB_ID": "4", "SLURM_JOB_END_TIME": "1795270846"})
    assert anyio.run(end_time, job) == 1795270846.0


def test_missing_tools_report_and_return_none(fake_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(fake_bin))
    problems: list[str] = []
    assert anyio.run(lambda: end_time(Job(scheduler="slurm", job_id="4"), problems.append)) is None
    assert anyio.run(lambda: end_time(Job(scheduler="pbs", job_id="4.s"), problems.append)) is None
    assert any("cannot run squeue" in p for p in problems) and any("cannot run qstat" in p for p in problems)
    ran, message = anyio.run(lambda: requeue(Job(scheduler="slurm", job_id="4"), report=problems.append))
    assert ran is False and "did not run" in message


def test_a_hung_scheduler_is_bounded(fake_bin: Path) -> None:
    _fake_tool(fake_bin, "scontrol", "exec sleep 30\n")
    problems: list[str] = []
    t0 = time.monotonic()
    ran, message = anyio.run(lambda: requeue(Job(scheduler="slurm", job_id="4"), timeout=0.5, report=problems.append))
    assert time.monotonic() - t0 < 5
    assert ran is False and "timed out" in message and problems


def test_requeue_passes_the_id_and_reports_success(fake_bin: Path, tmp_path: Path) -> None:
    args = tmp_path / "args"
    _fake_tool(fake_bin, "scontrol", f'echo "$@" > {args}\n')
    _fake_tool(fake_bin, "qrerun", f'echo "$@" > {args}.pbs\n')
    ran, message = anyio.run(requeue, Job(scheduler="slurm", job_id="7702", array_job_id="7690", array_task_id="12"))
    assert ran and args.read_text().split() == ["requeue", "7690_12"]
    ran, _ = anyio.run(requeue, Job(scheduler="pbs", job_id="2045[3].pbs-server"))
    assert ran and Path(f"{args}.pbs").read_text().split() == ["2045[3].pbs-server"]


def test_pbs_end_time_via_qstat(fake_bin: Path) -> None:
    _fake_tool(fake_bin, "qstat", f'[ "$1" = -f ] || exit 2\ncat {PBS / "polaris_running.txt"}\n')
    job = Job(scheduler="pbs", job_id="1234567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov")
    assert anyio.run(end_time, job) == datetime(2025, 11, 20, 11, 15, 32).timestamp()


def test_the_loop_is_not_blocked_while_asking(fake_bin: Path) -> None:
    _fake_tool(fake_bin, "squeue", "sleep 1; echo NONE\n")
    ticks = 0

    async def main() -> None:
        nonlocal ticks
        async with anyio.create_task_group() as tg:
            async def tick() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await anyio.sleep(0.05)
            tg.start_soon(tick)
            await end_time(Job(scheduler="slurm", job_id="4"))
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert ticks >= 10


# ---------------------------------------------------------------------------- the kill window

# `scontrol show job -o` during KillWait, as Slurm 22.05 printed it here (fields trimmed).
SHOW_CANCELLED = ("JobId=4 JobName=stub.sh UserId=root(0) JobState=COMPLETING Reason=None Dependency=(null) "
                  "Requeue=1 Restarts=0 BatchFlag=1 RunTime=00:00:02 TimeLimit=00:05:00 "
                  "StartTime=2026-11-22T22:26:10 EndTime=2026-11-22T22:26:12 Deadline=N/A "
                  "PreemptEligibleTime=2026-11-22T22:26:10 PreemptTime=None")
SHOW_REQUEUED = SHOW_CANCELLED.replace("Restarts=0", "Restarts=1").replace("EndTime=2026-11-22T22:26:12",
                                                                           "EndTime=2026-11-22T22:31:22")
SHOW_PREEMPTED = SHOW_CANCELLED.replace("PreemptTime=None", "PreemptTime=2026-11-22T22:26:12")
SHOW_TIME_LIMIT = SHOW_CANCELLED.replace("EndTime=2026-11-22T22:26:12", "EndTime=2026-11-22T22:31:10")


def test_job_view_reads_the_kill_window_fields() -> None:
    view = parse_job_view(SHOW_CANCELLED)
    assert view == JobView(state="COMPLETING", restarts=0, end=datetime(2026, 11, 22, 22, 26, 12).timestamp(),
                           preempt_time=None, start=datetime(2026, 11, 22, 22, 26, 10).timestamp(), limit=300.0)
    assert view.ended_early()
    assert parse_job_view(SHOW_PREEMPTED).preempt_time == datetime(2026, 11, 22, 22, 26, 12).timestamp()
    assert parse_job_view("slurm_load_jobs error: Invalid job id specified") is None


@pytest.mark.parametrize("text, was, reason, requeued", [
    (SHOW_CANCELLED, "preempted", "cancelled", False),    # scancel: COMPLETING, no requeue, no preemption
    (SHOW_REQUEUED, "preempted", "preempted", True),      # someone else's `scontrol requeue` (or PreemptMode=REQUEUE)
    (SHOW_PREEMPTED, "preempted", "preempted", False),    # PreemptMode=CANCEL with a PreemptTime
    (SHOW_TIME_LIMIT, "deadline", "deadline", False),     # the TERM came at the time limit: EndTime = Start + Limit
    (SHOW_CANCELLED, "deadline", "cancelled", False),     # issue 30: EndTime moved before the limit by a scancel
    (SHOW_TIME_LIMIT.replace("TimeLimit=00:05:00", "TimeLimit=UNLIMITED"), "deadline", "deadline", False),
    (SHOW_CANCELLED.replace("COMPLETING", "RUNNING"), "preempted", "preempted", False),  # TERM to the batch shell only
    (SHOW_CANCELLED.replace("COMPLETING", "CANCELLED"), "preempted", "cancelled", False),
    (SHOW_CANCELLED.replace("COMPLETING", "TIMEOUT"), "preempted", "deadline", False),
    (SHOW_CANCELLED.replace("COMPLETING", "REQUEUED"), "preempted", "preempted", True),
])
def test_the_reason_after_a_slurm_term(text: str, was: str, reason: str, requeued: bool) -> None:
    from supervisor.sched._slurm_output import reason_from_view

    assert reason_from_view(parse_job_view(text), was, 0) == (reason, requeued)


@pytest.mark.parametrize("text, expected", [
    (SHOW_CANCELLED, ("cancelled", False)),                           # scancel: the job is COMPLETING
    (SHOW_CANCELLED.replace("COMPLETING", "CANCELLED"), ("cancelled", False)),
    (SHOW_CANCELLED.replace("COMPLETING", "TIMEOUT"), ("deadline", False)),
    (SHOW_REQUEUED, ("preempted", True)),                             # a requeue raised Restarts
    (SHOW_CANCELLED.replace("COMPLETING", "RUNNING"), None),          # the OOM killer, a user's kill
    ("slurm_load_jobs error: Invalid job id specified", None),        # no view: the failure stands
])
def test_the_reason_when_the_training_died_of_a_signal_first(text: str, expected: tuple[str, bool] | None) -> None:
    from supervisor.sched._slurm_output import reason_after_signal_death

    assert reason_after_signal_death(parse_job_view(text), 0) == expected


def test_kill_wait_from_scontrol_show_config(fake_bin: Path) -> None:
    _fake_tool(fake_bin, "scontrol", 'echo "JobRequeue              = 1"; echo "KillWait                = 5 sec"\n')
    assert anyio.run(kill_wait, Job(scheduler="slurm", job_id="4")) == 5.0
    _fake_tool(fake_bin, "scontrol", "exit 1\n")
    assert anyio.run(kill_wait, Job(scheduler="slurm", job_id="4"), lambda _: None) == 30.0, "Slurm's default"
    assert anyio.run(kill_wait, Job(scheduler="pbs", job_id="4.s"), lambda _: None) == 7.8, \
        "PBS's kill_delay default (10) less MoM's early KILL"
    assert anyio.run(kill_wait, Job(scheduler="local")) is None


# ---------------------------------------------------------------------------- PBS, as the real OpenPBS 23.06 printed it

REAL = PBS / "real"  # qstat -f of one executable job (0.head): running, during qdel, during qrerun; qstat -Qf workq


def _view(name: str):
    from supervisor.sched._pbs_output import parse_pbs_view, pbs_job_attrs

    return parse_pbs_view(pbs_job_attrs((REAL / name).read_text(), "2.head"))


def test_pbs_view_of_a_qdel_a_qrerun_and_a_running_job() -> None:
    """Measured: during qdel's kill_delay the job stays R (substate 41/42) and only its comment
    gains "terminated by alice@head" (broken over two lines by qstat); during qrerun it is R
    with substate 60 and the old run_count."""
    running, qdel, qrerun = _view("running.txt"), _view("qdel.txt"), _view("qrerun.txt")
    assert running is not None and qdel is not None and qrerun is not None
    assert (running.state, running.terminated_by, running.rerunning, running.run_count) == ("R", None, False, 1)
    assert (qdel.state, qdel.terminated_by, qdel.rerunning, qdel.run_count) == ("R", "alice@head", False, 1)
    assert (qrerun.state, qrerun.substate, qrerun.terminated_by, qrerun.rerunning, qrerun.run_count) == \
        ("R", 60, None, True, 1)
    assert running.queue == "workq"


@pytest.mark.parametrize("name, was, expected", [
    ("qdel.txt", "preempted", ("cancelled", False)),      # a TERM far from the end: a qdel
    ("qdel.txt", "deadline", ("cancelled", False)),       # a qdel near the end is still one
    ("qrerun.txt", "preempted", ("preempted", True)),     # an operator's qrerun: requeued by the scheduler
    ("qrerun.txt", "deadline", ("deadline", True)),
    ("running.txt", "deadline", ("deadline", False)),     # the walltime's TERM changes nothing in qstat -f
    ("running.txt", "preempted", ("preempted", False)),
])
def test_pbs_reason_after_a_term(name: str, was: str, expected: tuple[str, bool]) -> None:
    from supervisor.sched._pbs_output import pbs_reason

    assert pbs_reason(_view(name), was) == expected


def test_pbs_reason_without_an_answer_keeps_the_signals_reading() -> None:
    from supervisor.sched._pbs_output import parse_pbs_view, pbs_reason

    assert parse_pbs_view(None) is None and parse_pbs_view({"comment": "x"}) is None
    assert pbs_reason(None, "preempted") == ("preempted", False)


@pytest.mark.parametrize("attrs, expected", [
    ({"run_count": "1"}, 0), ({"run_count": "2"}, 1), ({"run_count": "112"}, 111), ({"run_count": "0"}, 0),
    ({}, None), (None, None), ({"run_count": "x"}, None),
])
def test_pbs_restart_count_is_run_count_less_one(attrs: dict | None, expected: int | None) -> None:
    from supervisor.sched._pbs_output import pbs_restart_count

    assert pbs_restart_count(attrs) == expected


def test_kill_delay_from_qstat_qf() -> None:
    from supervisor.sched._pbs_output import parse_kill_delay
    from supervisor.sched.pbs import pbs_kill_wait

    assert parse_kill_delay((REAL / "queue.txt").read_text()) == 5.0
    assert parse_kill_delay("Queue: workq\n    queue_type = Execution\n") is None  # unset: PBS's default 10
    # MoM's KILL came 0.9-3.0 s after its TERM for kill_delay 3, 5.0 s for 5 (measured)
    assert [pbs_kill_wait(d) for d in (3, 5, 10, 60)] == [0.8, 2.8, 7.8, 57.8]
    assert pbs_kill_wait(2) == 0.5, "a quarter of a tiny kill_delay at least"


def test_kill_wait_from_the_jobs_queue(fake_bin: Path) -> None:
    _fake_tool(fake_bin, "qstat", f'case "$1" in -f) cat {REAL / "running.txt"};; -Qf) [ "$2" = workq ] && '
                                  f'cat {REAL / "queue.txt"};; *) exit 2;; esac\n')
    assert anyio.run(kill_wait, Job(scheduler="pbs", job_id="0.head")) == 2.8


def test_kill_follows_a_term_only_under_pbs() -> None:
    import signal

    pbs, slurm, local = SCHEDULERS["pbs"], SCHEDULERS["slurm"], SCHEDULERS["local"]
    assert pbs.kill_follows(signal.SIGTERM) and not pbs.kill_follows(signal.SIGUSR2)
    assert not slurm.kill_follows(signal.SIGTERM) and not local.kill_follows(signal.SIGTERM)


@pytest.mark.parametrize("scheduler, message, needle", [
    ("pbs", "qrerun 0.head: exit 159: qrerun: Unauthorized Request  0.head", "operators"),
    ("pbs", "qrerun 0.head: exit 190: qrerun: job is not rerunnable 0.head", "-r y"),
    ("slurm", "scontrol requeue 4: exit 1: Requested operation is presently disabled for job 4", "JobRequeue=0"),
    ("pbs", "qrerun 0.head: timed out after 5s", None),
])
def test_requeue_hint_names_what_the_site_must_change(scheduler: str, message: str, needle: str | None) -> None:
    hint = Job(scheduler=scheduler, job_id="0.head").sched.requeue_hint(message)
    assert (hint is None) if needle is None else (hint is not None and needle in hint)


def test_qrerun_is_done_when_the_server_reruns_not_when_it_answers(fake_bin: Path, tmp_path: Path) -> None:
    """The real qrerun answers only once the run has ended (6.2 s with kill_delay 5): supervise
    would be killed inside it. It is done as soon as qstat shows the job rerunning."""
    _fake_tool(fake_bin, "qrerun", "exec sleep 30\n")
    _fake_tool(fake_bin, "qstat", f"cat {REAL / 'qrerun.txt'}\n")
    t0 = time.monotonic()
    ran, message = anyio.run(requeue, Job(scheduler="pbs", job_id="2.head"))
    assert time.monotonic() - t0 < 5
    assert ran and "accepted" in message and "substate 60" in message, message


def test_qrerun_refused_is_reported(fake_bin: Path) -> None:
    _fake_tool(fake_bin, "qrerun", 'echo "qrerun: Unauthorized Request  2.head" >&2; exit 159\n')
    _fake_tool(fake_bin, "qstat", f"cat {REAL / 'running.txt'}\n")
    ran, message = anyio.run(lambda: requeue(Job(scheduler="pbs", job_id="2.head"), report=lambda _: None))
    assert not ran and "exit 159" in message and "Unauthorized Request" in message, message


def test_pbs_end_time_waits_for_a_reruns_start(fake_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rerun's first moment can lack stime: the end is asked again, not given up for 5 min."""
    import supervisor.sched._pbs_server as server

    monkeypatch.setattr(server, "START_RETRY", 0.05)
    first = tmp_path / "first"
    text = (REAL / "running.txt").read_text()
    (tmp_path / "nostime.txt").write_text("".join(ln + "\n" for ln in text.splitlines() if "stime" not in ln))
    _fake_tool(fake_bin, "qstat", f'if [ -e {first} ]; then cat {REAL / "running.txt"}; '
                                  f'else touch {first}; cat {tmp_path / "nostime.txt"}; fi\n')
    got = anyio.run(end_time, Job(scheduler="pbs", job_id="2.head"))
    assert got == datetime(2026, 11, 26, 21, 28, 50).timestamp() + 300


# qstat -f -F json and qstat -f of the same jobs at the same moments, on the test cluster
# (scripts/pbs-up.sh, OpenPBS 23.06.06; issue 46): 0.head, submitted with
# `qsub -l walltime=00:05:00 -v foo=005,bar=true,NUM=42,OBJ=[1] -- /bin/sh -c "trap '' TERM; sleep 300"`,
# running, then during its qdel's kill_delay; 1.head, the same job, during a qrerun.
JSON = REAL / "json"


@pytest.mark.parametrize("name, job_id", [("running", "0.head"), ("qdel", "0.head"), ("qrerun", "1.head")])
def test_qstat_json_reads_as_its_text_without_the_glue(name: str, job_id: str) -> None:
    """Every attribute both print reads the same, but the one the text broke over two lines:
    the qdel's comment, whose "terminated by alice@head" the text glues into "byalice@head"."""
    from supervisor.sched._pbs_output import parse_pbs_view, pbs_job_attrs

    text = pbs_job_attrs((JSON / f"{name}.txt").read_text(), job_id)
    doc = pbs_job_attrs((JSON / f"{name}.json").read_text(), job_id)
    assert text is not None and doc is not None
    both = set(text) & set(doc)
    assert {"job_state", "substate", "run_count", "stime", "Resource_List.walltime", "comment", "queue"} <= both
    assert {k for k in both if text[k] != doc[k]} == ({"comment"} if name == "qdel" else set())
    assert parse_pbs_view(text) == parse_pbs_view(doc)
    if name == "qdel":
        assert doc["comment"].endswith("and terminated by alice@head") and text["comment"].endswith("byalice@head")


def test_qstat_json_values_come_back_as_the_text_spells_them() -> None:
    """qstat types what reads as JSON (run_count 1, substate 42, an environment's true) and nests
    resource lists: read back flat, as text."""
    from supervisor.sched._pbs_output import parse_pbs_time, parse_qstat_json, pbs_job_attrs

    attrs = pbs_job_attrs((JSON / "running.json").read_text(), "0.head")
    assert attrs is not None
    assert (attrs["run_count"], attrs["substate"], attrs["Resource_List.ncpus"]) == ("1", "42", "1")
    assert (attrs["Variable_List.bar"], attrs["Variable_List.NUM"], attrs["Variable_List.OBJ"]) == ("true", "42", "[1]")
    assert attrs["Variable_List.foo"] == "5"  # sent as 005: qstat's cJSON took it for a number
    assert pbs_end_time(attrs, now=0) == parse_pbs_time(attrs["stime"]) + 300
    assert parse_qstat_json("Job Id: 0.head\n") is None and parse_qstat_json("[1]") == {}
    # qstat -f -F json of an unknown job (exit 153) prints the document without "Jobs"
    assert pbs_job_attrs('{"timestamp": 1796640500, "pbs_version": "23.06.06", "pbs_server": "head"}', "9.head") is None


def test_qstat_is_asked_for_json_first_and_for_text_where_it_has_none(fake_bin: Path, tmp_path: Path) -> None:
    """OpenPBS answers -F json: one call. A qstat that refuses it (an older PBS Pro) is asked again
    for the text, and its refusal is not said: the same end, the same rerun count."""
    from supervisor.sched._pbs_output import parse_pbs_time

    asked = tmp_path / "asked"
    _fake_tool(fake_bin, "qstat", f'echo "$*" >> {asked}\n'
                                  f'case "$*" in *-F*) cat {JSON / "running.json"};; *) exit 2;; esac\n')
    job = Job(scheduler="pbs", job_id="0.head")
    said: list[str] = []
    assert anyio.run(end_time, job, said.append) == parse_pbs_time("Mon Dec  7 10:47:34 2026") + 300
    assert job.sched.restart_count_now(job) == 0
    assert asked.read_text().splitlines() == ["-f -F json 0.head"] * 2 and said == []
    asked.unlink()
    _fake_tool(fake_bin, "qstat", f'echo "$*" >> {asked}\n'
                                  'case "$*" in *-F*) echo "qstat: invalid option -- \'F\'" >&2; exit 2;; esac\n'
                                  f'cat {REAL / "running.txt"}\n')
    job = Job(scheduler="pbs", job_id="2.head")
    assert anyio.run(end_time, job, said.append) == datetime(2026, 11, 26, 21, 28, 50).timestamp() + 300
    assert job.sched.restart_count_now(job) == 0
    assert asked.read_text().splitlines() == ["-f -F json 2.head", "-f 2.head"] * 2 and said == []


def test_attempt_numbers_follow_pbs_run_count(tmp_path: Path) -> None:
    """PBS's rerun count (run_count − 1) numbers the attempt, as SLURM_RESTART_COUNT does; the
    journal's own count still wins when it is ahead (a run directory reused by a new job)."""
    from supervisor.journal import Journal, next_attempt

    assert next_attempt(tmp_path, 1) == 2
    assert next_attempt(tmp_path, 0) == 1 and next_attempt(tmp_path, None) == 1
    Journal(tmp_path, 3).emit("start")
    assert next_attempt(tmp_path, 1) == 4


# ---------------------------------------------------------------------------- one class per scheduler

@pytest.mark.parametrize("env, expected", [
    ({"SLURM_JOB_ID": "7"}, "7"),
    ({"PBS_JOBID": "1234567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"}, "1234567"),  # the number: every rerun's
    ({"SLURM_JOB_ID": "7", "PBS_JOBID": "9.head"}, "7"),  # a PBS-to-Slurm wrapper site: Slurm's, as detected
    ({"CUDA_VISIBLE_DEVICES": "0"}, None),  # local: a new run directory per run
])
def test_the_default_run_directory_is_named_by_the_schedulers_job_id(tmp_path: Path, env: dict[str, str],
                                                                     expected: str | None) -> None:
    from supervisor.config import default_run_dir
    from supervisor.sched import run_dir_id

    assert run_dir_id(env) == expected
    name = default_run_dir(run_dir_id(env), tmp_path).name
    assert name == f"supervise-{expected}" if expected else name.endswith(f"Z-{os.getpid()}"), name


@pytest.mark.parametrize("name, cont_at, expected", [
    ("slurm", 100.5, True),    # slurmstepd's SIGCONT with its TERM: the whole job got it
    ("slurm", 90.0, False),    # a CONT long before: a TERM to supervise alone
    ("slurm", None, False),
    ("pbs", 100.5, False),     # MoM's TERM reaches the first node's session only
    ("local", 100.5, False),
])
def test_signalled_all_is_slurms_term_with_its_cont(name: str, cont_at: float | None, expected: bool) -> None:
    import signal

    assert SCHEDULERS[name].signalled_all(signal.SIGTERM, 100.0, cont_at) is expected
    assert SCHEDULERS[name].signalled_all(signal.SIGUSR2, 100.0, cont_at) is False


def test_each_scheduler_says_its_own_facts() -> None:
    from supervisor.sched import BATCH, GONE_STATES, label_of

    slurm, pbs, local = SCHEDULERS["slurm"], SCHEDULERS["pbs"], SCHEDULERS["local"]
    assert BATCH == ("slurm", "pbs") and not local.is_batch
    assert (slurm.default_kill_wait, pbs.default_kill_wait, local.default_kill_wait) == (30.0, 7.8, None)
    assert slurm.signals_every_node and not pbs.signals_every_node
    assert [label_of(n) for n in ("slurm", "pbs", "local", "lsf")] == ["Slurm", "PBS", "local", "lsf"]
    assert GONE_STATES == ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER_DOWN", "FUTURE", "UNKNOWN", "OFFLINE",
                           "UNRESOLVABLE", "STALE")
    assert slurm.node_name({"SLURMD_NODENAME": "gpu07"}) == "gpu07"
    host = os.uname().nodename.split(".")[0]
    assert pbs.node_name({"SLURMD_NODENAME": "gpu07"}) == host and local.node_name({}) == host
    assert local.agents(None) is None  # type: ignore[arg-type]
    job = Job(scheduler="local")
    assert anyio.run(local.kill_wait, job) is None
    assert anyio.run(lambda: local.exclude_nodes(job, ["n1"], timeout=1.0)) == (False, "no node exclusion on a local job (docs/pbs.md)")


@pytest.mark.parametrize("given, env, expected", [
    ("3", {"SLURM_NODEID": "1"}, 3),                       # --node-rank wins
    (None, {"SUPERVISE_NODE_RANK": "2", "SLURM_NODEID": "1"}, 2),
    (None, {"SLURM_NODEID": " 1 ", "PMI_RANK": "5"}, 1),
    (None, {"OMPI_COMM_WORLD_RANK": "4"}, 4),
    (None, {}, "missing"),
    ("x", {}, "expected a whole number"),
    (None, {"PMIX_RANK": "-1"}, "environment PMIX_RANK"),
])
def test_node_rank_from_the_flag_or_the_launchers_variables(given: str | None, env: dict[str, str],
                                                            expected: int | str) -> None:
    from supervisor.errors import ConfigError
    from supervisor.sched import node_rank

    if isinstance(expected, int):
        assert node_rank(given, env) == expected
    else:
        with pytest.raises(ConfigError, match=expected):
            node_rank(given, env)
