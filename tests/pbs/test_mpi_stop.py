"""OpenMPI's mpirun of MPI_Init'ed ranks without a TERM handler, stopped at the walltime, in a
real 2-node PBS job (issue 42 item 11).

The job ezpz's users run, without ezpz: ``mpirun -np 2 --hostfile $PBS_NODEFILE --map-by
ppr:1:node`` over ``pbs_tmrsh``, each rank ``tests/ranks/mpi4py_stop_rank.py no-term`` (mpi4py:
MPI_Init; it answers "checkpoint now", and dies of TERM as the PyTorch DDP tutorial does).
supervise sends the stop TERM to the local rank (it maps libmpi); the rank dies, mpirun aborts
the job and, before this issue, slept 2 × ``odls_base_sigkill_timeout`` (T = 12 for the 30 s
grace) before it exited: past what the stop had, so supervise's grace SIGKILLed it (exit 137)
with the walltime close. Now the stop ends mpirun once its rank is gone (two TERMs) and TERMs
the ``pbs_tmrsh`` it leaves behind: no SIGKILL, exit 75, done before the walltime.
"""

from __future__ import annotations

import sys

from supervisor.journal import read_journal
from supervisor.sched._pbs_output import parse_pbs_time, parse_walltime
from tests.support.journal import events
from tests.support.paths import ROOT
from tests.support.pbs import PbsCluster

RANK = ROOT / "tests" / "ranks" / "mpi4py_stop_rank.py"
TMRSH = '#!/bin/sh\nh=$1; shift\nexec pbs_tmrsh "$h" /bin/sh -c "$*"\n'  # OpenMPI's rsh agent over PBS's TM


def test_walltime_stop_of_mpirun_ranks_without_a_term_handler_ends_without_sigkill(pbs: PbsCluster) -> None:
    pbs.qmgr("set queue workq kill_delay = 10")
    work = pbs.workdir("mpistop")
    (work / "tmrsh").write_text(TMRSH)
    (work / "tmrsh").chmod(0o755)
    pbs.own(work / "tmrsh")
    py = sys.executable
    mca = ("--mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 "
           f"--mca plm_rsh_agent {work}/tmrsh -x PYTHONPATH -x SUPERVISE_CHECKPOINT_REQUEST -x SUPERVISE_RUN_DIR")
    jobid = pbs.qsub(work, script=f"""#!/bin/bash
#PBS -l select=2:ncpus=1
#PBS -l place=scatter
#PBS -l walltime=00:01:00
#PBS -j oe
#PBS -o {work}/job.out
cd {work}
mkdir -p {work}/out
export PYTHONPATH={ROOT} OMP_NUM_THREADS=1
exec {pbs.supervise_line()} --run-dir {work}/run --grace 30s --gpu-every 0 \\
    --checkpoints $TMPDIR/ckpt {work}/persistent/ckpt -- \\
    mpirun -np 2 --hostfile $PBS_NODEFILE --map-by ppr:1:node {mca} {py} {RANK} {work}/out $TMPDIR/ckpt no-term
""")
    info = pbs.wait_state(jobid, "F", timeout=150)
    out = (work / "job.out").read_text() if (work / "job.out").exists() else ""
    journal = work / "run" / "events.jsonl"
    ev = read_journal(journal).events
    start, limit = parse_pbs_time(info["stime"]), parse_walltime(info["Resource_List"]["walltime"])
    assert start is not None and limit is not None
    walltime_end = start + limit
    step = {e["step"]: e for e in ev if e["kind"] == "stop-step"}
    stop = next(e for e in ev if e["kind"] == "stop")
    end = ev[-1]
    stop_child = step["stop-child"]
    detail = f"{stop_child}\n{end}\n{out[-3000:]}"
    print(f"\nmpirun walltime stop: stop-child {stop_child['seconds']}s of a {stop_child['grace_s']}s grace, "
          f"finished {stop_child.get('finished')}, killed {stop_child['killed']}, "
          f"end {walltime_end - end['t']:.2f}s before the walltime, launcher status {end.get('launcher_status')}")
    assert stop["reason"] == "deadline" and end["kind"] == "end", detail
    # the stop TERM to the local rank (MPI_Init'ed), which dies of it; mpirun ended, not SIGKILLed
    assert stop_child["route"] == "ranks" and len(stop_child["sent_to"]) == 1, detail
    assert stop_child["graceful"] and stop_child["killed"] == [] and "finished" in stop_child, detail
    assert end["launcher_status"] != 137 and end["exit_status"] == 75 and end["stopped_cleanly"], detail
    # the stop's checkpoint durable, the final flush done, all before PBS's walltime TERM
    assert step["checkpoint"]["outcome"] == "published", step["checkpoint"]
    assert (work / "persistent" / "ckpt" / step["checkpoint"]["answer"] / ".metadata").exists()
    assert step["final-flush"].get("outcome") == "done", step["final-flush"]
    assert end["t"] < walltime_end and events(journal, "signal") == [], detail
    assert info["Exit_status"] == 75 and "walltime" not in info.get("comment", ""), info.get("comment")
