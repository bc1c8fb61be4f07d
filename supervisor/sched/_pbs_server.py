"""Asking PBS's server about our job and its nodes: ``qstat -f`` (its JSON first), the end it
gives the job, its state while it is being stopped, a ``qrerun`` watched until the server takes
it, and ``pbsnodes``. What the answers say is ``_pbs_output.py``'s; what to do with them is
``pbs.py``'s. Like every scheduler query, nothing here raises into the caller (sched/_tool.py).
"""

from __future__ import annotations

import logging
import subprocess
import time

import anyio

from supervisor.sched._job import Job
from supervisor.sched._pbs_output import PbsView, parse_pbs_view, parse_pbsnodes, pbs_end_time, pbs_job_attrs
from supervisor.sched._tool import QUERY_TIMEOUT, Report, run_tool

log = logging.getLogger("supervisor.sched.pbs")

# The JSON first: each value whole (measured, OpenPBS 23.06); the text where qstat has no -F
# (an older PBS Pro) or its JSON does not parse.
QSTAT = (["qstat", "-f", "-F", "json"], ["qstat", "-f"])
START_RETRIES, START_RETRY = 10, 1.0  # a rerun's first moment has no stime: ask again, 10 s at most
RERUN_ACCEPTED = -1  # rerun's status when the server took the rerun before qrerun returned
RERUN_POLL = 0.25    # seconds between looks at the job's substate while qrerun runs


async def job_attrs(job: Job, report: Report) -> dict[str, str] | None:
    """``qstat -f JOBID`` of this job as attributes; None when qstat fails or lists no such job.
    Only the text's failure is said: a qstat without JSON is no trouble."""
    if not job.job_id:
        return None
    json_argv, text_argv = QSTAT
    rc, out = await run_tool([*json_argv, job.job_id], QUERY_TIMEOUT, lambda _: None)
    attrs = pbs_job_attrs(out, job.job_id) if rc == 0 else None
    if attrs is not None:
        return attrs
    rc, out = await run_tool([*text_argv, job.job_id], QUERY_TIMEOUT, report)
    return pbs_job_attrs(out, job.job_id, report) if rc == 0 else None


def job_attrs_now(job_id: str, timeout: float) -> dict[str, str] | None:
    """``job_attrs``, blocking: for the plan, before the event loop."""
    for argv in QSTAT:
        try:
            proc = subprocess.run([*argv, job_id], capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("%s %s: %s", " ".join(argv), job_id, exc)
            return None
        attrs = pbs_job_attrs(proc.stdout, job_id) if proc.returncode == 0 else None
        if attrs is not None:
            return attrs
    if proc.returncode != 0:
        log.warning("qstat -f %s exited %d: %s", job_id, proc.returncode, " ".join(proc.stderr.split())[:200])
        return None
    return pbs_job_attrs(proc.stdout, job_id, log.warning)


async def end_time(job: Job, report: Report) -> float | None:
    """``stime`` + ``Resource_List.walltime`` of ``qstat -f``; None without a limit or an answer."""
    if not job.job_id:
        return None
    # A rerun's first moment can lack ``stime`` (measured, OpenPBS 23.06) and
    # ``resources_used.walltime`` comes only with MoM's first sample: ask again shortly
    # rather than wait END_REFRESH with no end (the walltime would then arrive unwarned).
    for attempt in range(START_RETRIES + 1):
        attrs = await job_attrs(job, report)
        if attrs is None:
            return None
        end = pbs_end_time(attrs, now=time.time())
        if end is not None or not attrs.get("Resource_List.walltime"):
            return end
        if attempt < START_RETRIES:
            await anyio.sleep(START_RETRY)
    report(f"qstat -f {job.job_id} shows a walltime but no start time yet")
    return None


async def job_view(job: Job, report: Report | None = None) -> PbsView | None:
    """What ``qstat -f`` says of this PBS job now; None without a job id or an answer. Never raises."""
    if not job.job_id:
        return None
    return parse_pbs_view(await job_attrs(job, report or log.warning))


async def rerun(job: Job, argv: list[str], timeout: float, report: Report) -> tuple[int | None, str]:
    """``qrerun`` of our own job. It answers only when the run has ended (measured: 6.2 s with
    kill_delay 5: the TERM, then MoM's KILL), so waiting for it would have us killed inside it.
    It is done when the server shows the job rerunning (substate 60, at once) or qrerun exits
    first (a refusal: ``Unauthorized Request``, rc 159, for a user who is not an operator;
    ``job is not rerunnable``, rc 190, with ``-r n``). Then the run may end: the server
    requeues the job when it does (cancelling the qrerun client does not undo that)."""
    result: tuple[int | None, str] = (None, f"timed out after {timeout:g}s")
    with anyio.move_on_after(timeout):
        async with anyio.create_task_group() as tg:
            async def ask() -> None:
                nonlocal result
                result = await run_tool(argv, timeout, report)
                tg.cancel_scope.cancel()

            async def watch() -> None:
                nonlocal result
                while True:
                    await anyio.sleep(RERUN_POLL)
                    view = await job_view(job, lambda _: None)
                    if view is not None and view.rerunning:
                        result = (RERUN_ACCEPTED, str(view.substate))
                        tg.cancel_scope.cancel()

            tg.start_soon(ask)
            tg.start_soon(watch)
    return result


def node_state(host: str) -> tuple[str, str] | None:
    """(state, comment) of a node from ``pbsnodes HOST`` (``down``, ``offline``,
    ``state-unknown,down``…; the comment an operator or the server left); None when it cannot tell."""
    try:
        out = subprocess.run(["pbsnodes", host], capture_output=True, text=True, timeout=10,
                             stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_pbsnodes(out)
