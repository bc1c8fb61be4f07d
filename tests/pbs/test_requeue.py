"""supervise's requeue under the real OpenPBS (issue 31): at the walltime, with ``requeue =
true``, supervise's last stop step is ``qrerun`` of its own job.

* With the job user among the server's operators (``set server operators = alice@*``) the
  job is rerun under the same PBS_JOBID; the rerun is attempt 2 (``run_count`` − 1 from
  ``qstat -f`` is the restart count: PBS sets no variable), restores the newest complete
  checkpoint into its fresh local directory, and the training resumes at the step it stopped
  at. ``max_requeues = 1`` bounds the self-requeue loop: attempt 2 is refused a requeue.
* Without it, PBS refuses (``Unauthorized Request``, rc 159): supervise journals one
  ``requeue-failed`` line naming what the site must set, exits with the stop's status, and
  the checkpoint is durable.

Jobs, trainer and checkpoint pair as in ``test_signals.py``; the trainer writes ``train.log``
(PBS discards a rerun job's first ``.o`` file).
"""

from __future__ import annotations

from pathlib import Path

from tests.pbs._supervised import KILL_DELAY, complete_checkpoints, submit
from tests.support.pbs import PbsCluster
from tests.support.runs import first_publish_after

WALLTIME = "00:00:30"
CONFIG = 'grace = "5s"\nrequeue = true\nmax_requeues = 1'


def test_requeue_by_qrerun_resumes_as_attempt_2(pbs: PbsCluster) -> None:
    pbs.qmgr(f"set queue workq kill_delay = {KILL_DELAY}", "set server operators = alice@*")
    job = submit(pbs, "requeue", walltime=WALLTIME, config=CONFIG, train_log=True)
    job.wait_event("end", 150, attempt=2)
    info = job.finish(timeout=60)
    assert info["run_count"] == 2, f"one rerun, no loop: run_count {info['run_count']}\n{job.tail()}"
    starts = job.events("start")
    assert [s["attempt"] for s in starts] == [1, 2], starts
    assert [s["restart_count"] for s in starts] == [0, 1], "run_count − 1, read from qstat -f"
    assert {s["job_id"] for s in starts} == {job.jobid}, "qrerun keeps the PBS_JOBID"

    # Attempt 1: the walltime's stop, a durable checkpoint, qrerun accepted, its end journaled.
    assert job.one("stop", 1)["reason"] == "deadline"
    assert job.step("checkpoint", 1)["outcome"] == "published"
    rq = job.step("requeue", 1)
    assert rq["requeued"] is True and "accepted" in rq["message"] and rq["restart_count"] == 0, rq
    assert [e["kind"] for e in job.events(attempt=1)][-1] == "end", "supervise ended before MoM's KILL"
    end1 = job.one("end", 1)
    assert end1["reason"] == "deadline" and end1["not_durable"] == [], end1
    last1 = max((e for e in job.events("publish", 1) if not e.get("pointer")), key=lambda e: e["t"])

    # Attempt 2: restores attempt 1's newest complete checkpoint into its own fresh local
    # directory, and the training resumes at exactly the step attempt 1 stopped at.
    restore = job.one("restore", 2)
    assert restore["checkpoint"] == last1["checkpoint"], (restore, last1)
    first_local = Path(job.one("sync-source", 1)["path"])
    assert Path(restore["to"]).parent.parent == first_local.parent and Path(restore["to"]).parent != first_local, \
        "restored into the rerun's own fresh local directory (a new PBS_JOBCOOKIE), not found in the old one"
    stopped, resumed = job.trainer("stopped"), job.trainer("resumed")
    assert len(stopped) == 2 and len(resumed) == 1, job.tail()
    assert last1["checkpoint"] == f"step_{stopped[0]:06d}", "attempt 1's stop checkpoint is the newest"
    assert resumed[0] == stopped[0], f"attempt 2 resumed at {resumed[0]}, attempt 1 stopped at {stopped[0]}"
    assert job.one("spawn", 2)["t"] > restore["t"]

    # Attempt 2 (restart count 1 = max_requeues): its stop is not requeued; the loop is bounded.
    assert job.one("stop", 2)["reason"] == "deadline"
    refused = job.one("requeue-refused", 2)
    assert refused["restart_count"] == 1 and refused["max_requeues"] == 1, refused
    end2 = job.one("end", 2)
    # refused a requeue, the training unfinished: 75, so a depend=afterok job does not start
    assert end2["reason"] == "deadline" and end2["exit_status"] == 75 and end2["not_durable"] == [], end2
    assert max(complete_checkpoints(job.persist)) == stopped[1]
    assert info["Exit_status"] == 75
    print(f"\nrequeue: attempt 2 started {job.one('start', 2)['t'] - end1['t']:.1f}s after attempt 1's end; "
          f"resumed at step {resumed[0]}")


def test_requeue_refused_without_operators_is_one_clear_line(pbs: PbsCluster) -> None:
    pbs.qmgr(f"set queue workq kill_delay = {KILL_DELAY}")  # the fixture left no operators
    job = submit(pbs, "norequeue", walltime=WALLTIME, config=CONFIG)
    info = job.finish(timeout=90)
    rq = job.step("requeue")
    assert rq["requeued"] is False and "exit 159" in rq["message"] and "Unauthorized Request" in rq["message"], rq
    failed = job.one("requeue-failed")
    assert "operators" in failed["hint"] and failed["message"] == rq["message"], failed
    end = job.one("end")
    assert end["reason"] == "deadline" and end["stopped_cleanly"] is True and end["exit_status"] == 75, end
    assert end["not_durable"] == [], "nothing lost: every checkpoint is on the persistent side"
    stop = job.one("stop")
    durable = first_publish_after(job, stop["t"])
    assert durable is not None and job.step("checkpoint")["outcome"] == "published"
    stopped = job.trainer("stopped")
    assert len(stopped) == 1 and max(complete_checkpoints(job.persist)) == stopped[0], job.tail()
    assert info["run_count"] == 1 and info["Exit_status"] == 75, (info["run_count"], info["Exit_status"])
    assert len(job.events("start")) == 1
