"""ALCF's ezpz (github.com/saforem2/ezpz 0.26.1, scripts/install-ezpz.sh) as the launcher under
supervise, in a real 2-node PBS job on CPU (issue 31).

ezpz's own PBS route cannot run here, and the job shows why before supervise starts: it composes
Cray PALS's ``mpiexec --envall --line-buffer --np=2 --ppn=1 --hostfile=… --cpu-bind=depth
--depth=8``, which OpenMPI refuses (``unknown option "--envall"``), and ``ezpz launch`` in a PBS job
first looks for the node file in ``/var/spool/pbs/aux`` (ALCF's PBS_HOME; this cluster's is
elsewhere) and dies. ezpz's own override runs it: ``EZPZ_SCHEDULER`` other than PBS/SLURM makes
``ezpz launch`` fall back to ``mpirun -np N --hostfile H --map-by ppr:P:node`` with the OpenMPI
options it is given passed through (here the pbs_tmrsh agent), and ``RANK=0`` in the launcher's
own environment keeps ezpz from initialising MPI in it (an OpenMPI singleton, whose environment
makes the child mpirun exit 1 at once, printing nothing); ``env -u RANK`` gives the ranks theirs.

``ezpz launch`` is a Python process around mpirun that dies of TERM and USR1. supervise detects
it by itself (its ``ezpz`` profile, no ``--launcher``) and looks through it to the mpirun below:
"checkpoint now" goes to mpirun (which forwards USR1 to the ranks on both nodes), and the stop
TERM to the local rank, since ezpz's ranks called MPI_Init (libmpi mapped): TERMed, OpenMPI's
mpirun would pass TERM on only after half the grace and then hold on until its own SIGKILL
(measured before: exit 137). The rank on the other node learns of the stop through the training's
all_reduce of the stop flag; both save and leave, mpirun exits 0, all within the grace.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from supervisor.journal import read_journal
from tests.support.journal import events
from tests.support.paths import ROOT
from tests.support.pbs import PbsCluster
from tests.support.wait import wait_for

VENV = Path(os.environ.get("EZPZ_VENV", ROOT / ".venv-ezpz"))
TRAIN = ROOT / "tests" / "pbs" / "ezpz_train.py"
TMRSH = '#!/bin/sh\nh=$1; shift\nexec pbs_tmrsh "$h" /bin/sh -c "$*"\n'  # OpenMPI's rsh agent over PBS's TM


NOT_INSTALLED = f"ezpz is not installed in {VENV} (scripts/install-ezpz.sh installs it from tests/vendor/)"
# Checked before the PBS cluster starts: no ezpz, no cluster for it.
pytestmark = pytest.mark.skipif(not list(VENV.glob("lib/python3*/site-packages/ezpz-*.dist-info")),
                                reason=NOT_INSTALLED)


def ezpz_missing() -> str | None:
    python = VENV / "bin" / "python"
    if not python.exists():
        return NOT_INSTALLED
    proc = subprocess.run([str(python), "-c", "import ezpz, torch, mpi4py"], capture_output=True, text=True)
    return None if proc.returncode == 0 else f"ezpz in {VENV} does not import: {proc.stderr.strip()[-300:]}"


@pytest.fixture
def ezpz() -> Path:
    reason = ezpz_missing()
    if reason:
        pytest.skip(reason)
    return VENV


def test_ezpz_launch_under_supervise_runs_ranks_on_both_nodes_and_a_qdel_leaves_a_durable_checkpoint(
        pbs: PbsCluster, ezpz: Path) -> None:
    pbs.qmgr("set queue workq kill_delay = 45")  # the SIGKILL after qdel's TERM: past our 30 s grace
    # --warn-before 5s: with the 2-minute walltime, the default lead would stop the run for the
    # deadline before the qdel when the two torch ranks are slow to start. The 30 s grace: from the
    # TERM to ezpz launch's exit took 4.8-5.2 s here (ezpz launch alone outlives mpirun by ~2 s) and
    # over 10 s in CI beside the other tests; the promise is a clean stop, not a fast ezpz.
    work = pbs.workdir("ezpz")
    (work / "tmrsh").write_text(TMRSH)
    (work / "tmrsh").chmod(0o755)
    pbs.own(work / "tmrsh")
    py = ezpz / "bin" / "python"
    mca = (f"--mca plm_rsh_agent {work}/tmrsh --mca btl tcp,self --mca btl_tcp_if_include eth0 "
           "--mca oob_tcp_if_include eth0 -x PYTHONPATH -x NGPU_PER_HOST -x WANDB_MODE "
           "-x SUPERVISE_CHECKPOINT_REQUEST -x SUPERVISE_RUN_DIR")
    jobid = pbs.qsub(work, script=f"""#!/bin/bash
#PBS -l select=2:ncpus=1
#PBS -l place=scatter
#PBS -l walltime=00:02:00
#PBS -j oe
#PBS -o {work}/job.out
cd {work}
export NGPU_PER_HOST=1 WANDB_MODE=disabled PATH={ezpz}/bin:$PATH
echo "EZPZ_PBS_LINE $({py} -c "import os, ezpz.pbs; print(ezpz.pbs.get_pbs_launch_cmd(hostfile=os.environ['PBS_NODEFILE']))" 2>/dev/null | tail -n 1)"
echo "EZPZ_PBS_RUN $(mpiexec --envall --line-buffer --np=2 --ppn=1 --hostfile=$PBS_NODEFILE true 2>&1 | head -n 1)"
echo "EZPZ_LAUNCH_PBS $(ezpz launch -- true 2>&1 | tail -n 1)"
export EZPZ_SCHEDULER=NONE RANK=0
exec {pbs.supervise_line()} --run-dir {work}/run --grace 30s --gpu-every 0 --warn-before 5s \\
    --checkpoints $TMPDIR/ckpt {work}/persistent/ckpt -- \\
    ezpz launch -np 2 --ppn 1 --nh 2 --hostfile $PBS_NODEFILE {mca} -- \\
    env -u RANK {py} {TRAIN} $TMPDIR/ckpt --step-time 0.05 --every 20
""")
    journal = work / "run" / "events.jsonl"
    first = wait_for(lambda: journal.exists() and [e for e in events(journal, "publish")
                                                   if e["checkpoint"].startswith("step_")], 120,
                     "the first periodic checkpoint published")[0]
    pbs.user("qdel", jobid)
    info = pbs.wait_state(jobid, "F", timeout=90)
    out = (work / "job.out").read_text()

    # why ezpz's own PBS route does not run on this OpenMPI cluster
    line = re.search(r"^EZPZ_PBS_LINE (.*)$", out, re.M)
    assert line and line[1].split()[:5] == ["mpiexec", "--envall", "--line-buffer", "--np=2", "--ppn=1"], out
    assert "--cpu-bind=depth --depth=8" in line[1]
    assert 'unknown option "--envall"' in re.search(r"^EZPZ_PBS_RUN (.*)$", out, re.M)[1]  # type: ignore[index]
    assert "/var/spool/pbs/aux" in re.search(r"^EZPZ_LAUNCH_PBS (.*)$", out, re.M)[1]  # type: ignore[index]

    # ezpz's ranks, by ezpz's own account, ran one on each of the job's nodes
    ranks = dict(re.findall(r"^EZPZ rank=(\d) world=2 local=0 host=(\S+) ezpz=0\.26\.1$", out, re.M))
    hosts = [chunk.split("/")[0] for chunk in info["exec_host"].split("+")]
    assert ranks == {"0": hosts[0], "1": hosts[1]} and hosts[0] != hosts[1], (ranks, hosts, out[-3000:])

    # supervise journaled one run of ezpz launch, and one stop sequence at the qdel
    ev = read_journal(journal).events
    kinds = [e["kind"] for e in ev]
    spawn = next(e for e in ev if e["kind"] == "spawn")
    assert spawn["argv"][:2] == ["ezpz", "launch"] and spawn["launcher"] == "ezpz"  # detected, no --launcher
    assert kinds.count("spawn") == 1 and kinds.count("stop") == 1 and kinds[-1] == "end", kinds
    stop = next(e for e in ev if e["kind"] == "stop")
    assert stop["reason"] == "preempted" and stop["signal"] == "SIGTERM"
    request = next(e for e in ev if e["kind"] == "checkpoint-request")
    # "checkpoint now": USR1 to the mpirun below ezpz launch (it forwards it to both nodes' ranks)
    assert request["signal"] == "SIGUSR1" and request["route"] == "launcher" and len(request["to"]) == 1
    assert request["to"] != [spawn["pid"]], request
    step = {e["step"]: e for e in ev if e["kind"] == "stop-step"}
    answer = step["checkpoint"]["answer"]
    assert step["checkpoint"]["outcome"] == "published" and answer > first["checkpoint"], step["checkpoint"]
    # the stop: TERM to the local rank (MPI_Init'ed), not to ezpz launch nor mpirun; clean, in the grace
    stop_child = step["stop-child"]
    assert stop_child["route"] == "ranks" and len(stop_child["sent_to"]) == 1, stop_child
    assert stop_child["sent_to"] != [spawn["pid"]] and stop_child["sent_to"] != request["to"], stop_child
    assert stop_child["graceful"] and not stop_child["killed"] and stop_child["seconds"] < 30, \
        {k: stop_child.get(k) for k in ("graceful", "killed", "seconds", "sent_to")}
    end = ev[-1]
    # PBS's qstat names the qdel ("terminated by alice@…"): the end is a cancel, not a preemption
    assert end["reason"] == "cancelled" and "terminated by" in end["detail"] and end["not_durable"] == [], end
    # the answer is durable on the shared storage, whole: the marker written last is there
    mirrored = work / "persistent" / "ckpt" / answer
    assert (mirrored / ".metadata").read_text().split()[:2] == [str(int(answer.split("_")[1])), "2"]
    assert (mirrored / "model.pt").stat().st_size > 0
    assert info["Exit_status"] == 271  # PBS's own for a deleted script job

    # the clean stop: mpirun (so both ranks) exited 0 within the grace, no SIGKILL (`stopped_cleanly` is for
    # deadlines and preemptions only); cancelled with that 0, the training is unfinished: supervise exits 75
    assert end["launcher_status"] == 0 and end["exit_status"] == 75 and not end["stopped_cleanly"], end
    # rank 0 saved on the stop, and both ranks (one per node) left their loop
    assert re.search(r"^stopped \d+$", out, re.M) and sorted(re.findall(r"^rank (\d) leaves$", out, re.M)) == ["0", "1"], \
        out[-3000:]
