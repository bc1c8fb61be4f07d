"""supervise's single-node promises under the real OpenPBS of ``tests/pbs/conftest.py``: the
walltime, ``qdel`` and ``qsig`` (issue 31). Requeue: ``test_requeue.py``.

Each job is submitted by the job user (alice) and runs the real ``supervise`` of this checkout
around the stand-in training ``tests/helpers/trainer.py`` (it checkpoints into ``step_N/`` with
``.metadata`` last, answers checkpoint requests, saves and exits on TERM, resumes from the newest
local checkpoint). The checkpoint pair goes from a node-local directory fresh for each run
(``local-$PBS_JOBCOOKIE``: the cookie is new on every run of a job, its id is not) to the shared
``persist``. Executable jobs (``qsub -- supervise ...``) make supervise the session leader: PBS's
``qsig`` reaches it and not a login shell (see ``test_qsig_kills_a_script_job``).
Assertions are on the run's journal and on what PBS says (``qstat -x -f -F json``).
"""

from __future__ import annotations

import signal
import time

from supervisor.sched._pbs_output import parse_pbs_time, parse_walltime
from supervisor.sched.pbs import pbs_kill_wait
from tests.pbs._supervised import KILL_DELAY, complete_checkpoints, submit
from tests.support.pbs import PbsCluster
from tests.support.runs import first_publish_after
from tests.support.wait import wait_for

def walltime_end(info: dict) -> float:
    """stime + Resource_List.walltime of a ``qstat -x -f -F json`` job: when PBS's TERM is due."""
    start, limit = parse_pbs_time(info["stime"]), parse_walltime(info["Resource_List"]["walltime"])
    assert start is not None and limit is not None, info
    return start + limit


# ----------------------------------------------------------------------------- 1. the walltime

def test_walltime_stop_is_done_and_durable_before_pbs_terms(pbs: PbsCluster) -> None:
    """A 30 s walltime and supervise's default lead (``auto``: a quarter of the allocation
    with nothing learned): the end comes from the real ``qstat -f`` (stime + walltime), the
    stop is a deadline, a checkpoint asked for at the stop is published to the persistent side
    before the training is stopped, and supervise is done before the walltime's TERM."""
    pbs.qmgr(f"set queue workq kill_delay = {KILL_DELAY}")
    job = submit(pbs, "walltime", walltime="00:00:30", config='grace = "5s"', trainer=("--write-time", "0.3"))
    info = job.finish(timeout=90)
    end_at = walltime_end(info)
    deadline = job.one("deadline")
    assert deadline["source"] == "scheduler" and deadline["end"] == end_at, (deadline, info["stime"])
    assert 5 <= deadline["lead_s"] <= 8, f"auto lead: a quarter of the ~30 s allocation: {deadline}"
    stop = job.one("stop")
    assert stop["reason"] == "deadline" and stop["signal"] is None, stop
    assert stop["kill_by"] == "time-limit", stop
    ck = job.step("checkpoint")
    assert ck["outcome"] == "published" and ck["published"] >= 1, ck
    durable = first_publish_after(job, stop["t"])
    stop_child = job.step("stop-child")
    assert durable is not None and durable["t"] < stop_child["t"] - stop_child["seconds"], \
        "the checkpoint asked for at the stop is on persistent storage before the training is stopped"
    end = job.one("end")
    # 75: stopped before the walltime, not requeued, the training unfinished (depend=afterok must not run)
    assert end["reason"] == "deadline" and end["exit_status"] == 75 and end["not_durable"] == [], end
    assert end["t"] < end_at, f"supervise ended {end['t'] - end_at:.2f}s after the walltime: PBS's TERM came first"
    assert job.events("signal") == [], "no TERM from PBS reached supervise: it was done before the walltime"
    # PBS saw a job that ended on its own (supervise's 75), not one it killed for its walltime (Exit_status -29).
    assert info["Exit_status"] == 75 and "walltime" not in info.get("comment", ""), info.get("comment")
    saved = job.trainer("checkpoint")
    assert saved and max(complete_checkpoints(job.persist)) == max(saved), job.tail()
    print(f"\nwalltime: lead {deadline['lead_s']:.1f}s, stop→durable {durable['t'] - stop['t']:.2f}s, "
          f"done {end_at - end['t']:.2f}s before the walltime")


# ----------------------------------------------------------------------------- 2. qdel

def test_qdel_is_one_stop_labelled_cancelled_within_kill_delay(pbs: PbsCluster) -> None:
    """``qdel``: MoM TERMs supervise (the session leader) and KILLs it ``kill_delay`` later
    (the queue's, read with ``qstat -Qf``); the training, in its own session, gets neither.
    supervise runs one stop sequence inside that window, ``qstat -f`` (``terminated by
    alice@head``) labels it cancelled, and the checkpoint written at the stop is durable."""
    pbs.qmgr(f"set queue workq kill_delay = {KILL_DELAY}")
    job = submit(pbs, "qdel", walltime="00:05:00", config='grace = "5s"')
    job.wait_running_trainer()
    job.wait_event("sync")  # the mirror's first pass: the watcher is up
    learned = job.wait_event("kill-wait")
    assert learned["seconds"] == pbs_kill_wait(KILL_DELAY), learned
    job.marks["qdel"] = time.time()
    pbs.user("qdel", job.jobid)
    info = job.finish(timeout=60)
    assert len(job.events("stop")) == 1, [e["kind"] for e in job.events()]
    stop = job.one("stop")
    sig = job.one("signal", signal="SIGTERM", action="stop")
    assert sig["t"] >= job.marks["qdel"]
    assert stop["kill_by"] == "kill-wait" and stop["kill_wait_s"] == pbs_kill_wait(KILL_DELAY), \
        f"the kill window comes from the queue's kill_delay {KILL_DELAY}: {stop}"
    reason = job.one("reason")
    assert reason["terminated_by"] == "alice@head" and reason["reason"] == "cancelled", reason
    end = job.one("end")
    assert end["reason"] == "cancelled", end
    assert end["t"] - sig["t"] < KILL_DELAY, f"the stop took {end['t'] - sig['t']:.2f}s, kill_delay {KILL_DELAY}"
    assert job.events()[-1]["kind"] == "end", "supervise wrote its end: MoM's KILL did not cut it"
    stopped = job.trainer("stopped")
    assert len(stopped) == 1, job.tail()
    assert max(complete_checkpoints(job.persist)) == stopped[0], "the checkpoint written at the stop is durable"
    # cancelled: the training is unfinished, 75 (an executable job's Exit_status is supervise's)
    assert end["not_durable"] == [] and end["exit_status"] == 75 and info["Exit_status"] == 75, (end, info["Exit_status"])
    assert "terminated by" in info["comment"], info["comment"]
    print(f"\nqdel: TERM {sig['t'] - job.marks['qdel']:.2f}s after qdel, stop done {end['t'] - sig['t']:.2f}s "
          f"after the TERM (kill_delay {KILL_DELAY}); PBS Exit_status {info['Exit_status']}")


# ----------------------------------------------------------------------------- 3. qsig

def test_qsig_usr1_checkpoints_and_usr2_warns_and_the_job_survives(pbs: PbsCluster) -> None:
    """``qsig -s USR1`` far from the end is "checkpoint now" (docs/slurm.md, "Warning
    signals"): a checkpoint is published and the training goes on; ``qsig -s USR2`` is the
    warning, deferred to end − lead when the end is further: the job runs on after both."""
    pbs.qmgr(f"set queue workq kill_delay = {KILL_DELAY}")
    job = submit(pbs, "qsig", walltime="00:10:00", config='grace = "5s"\nwarn_before = "1m"')
    job.wait_running_trainer()
    job.wait_event("sync")
    job.marks["usr1"] = time.time()
    pbs.user("qsig", "-s", "USR1", job.jobid)
    request = job.wait_event("checkpoint-request", 30)
    durable = wait_for(lambda: first_publish_after(job, request["t"]), 30,
                       lambda: f"the requested checkpoint on persistent storage\n{job.tail()}")
    pbs.user("qsig", "-s", "USR2", job.jobid)
    deferred = job.wait_event("signal", 30, signal="SIGUSR2")
    # The training went on: a second USR1 gets a checkpoint at a later step.
    pbs.user("qsig", "-s", "USR1", job.jobid)
    wait_for(lambda: len(job.events("checkpoint-request")) >= 2, 30, lambda: f"a second request\n{job.tail()}")
    second = job.events("checkpoint-request")[1]
    later = wait_for(lambda: first_publish_after(job, second["t"]), 30, lambda: f"the second checkpoint\n{job.tail()}")
    info = pbs.job(job.jobid)
    assert info["job_state"] == "R", f"the job survived qsig USR1 and USR2: {info.get('job_state')}, " \
                                     f"Exit_status {info.get('Exit_status')}"
    assert job.events("stop") == [], "neither signal stopped the run"
    assert request["signal"] == "SIGUSR1" and request["why"] == "received SIGUSR1", request
    assert request["t"] >= job.marks["usr1"]
    assert deferred["action"] == "deferred" and deferred["stop_at"] is not None, deferred
    assert later["checkpoint"] > durable["checkpoint"], "the training went on between the two requests"
    pbs.user("qdel", job.jobid)
    job.finish(timeout=60)
    assert job.one("end")["reason"] == "cancelled"


def test_qsig_kills_a_script_job(pbs: PbsCluster) -> None:
    """The PBS fact the docs state: a job *script*'s session leader is the user's login shell,
    which ``qsig -s USR1`` kills, and the job with it (Exit_status 266 = 256 + SIGUSR1 of the
    shell), though supervise (the script's ``exec``) would take USR1 as a checkpoint request:
    ``qsig`` needs an executable job (``qsub -- supervise ...``) or a trapping ``~/.profile``."""
    pbs.qmgr("set queue workq kill_delay = 3")
    job = submit(pbs, "script", walltime="00:05:00", script=True)
    job.wait_running_trainer()
    pbs.user("qsig", "-s", "USR1", job.jobid)
    info = job.finish(timeout=60)
    assert info["Exit_status"] == 256 + signal.SIGUSR1, info["Exit_status"]
    kinds = [e["kind"] for e in job.events()]
    assert "end" not in kinds, f"supervise was killed with its shell, it could not end: {kinds[-4:]}"
