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

The same job into a bucket (issue 45: ``--checkpoints LOCAL s3://…``, a real SeaweedFS on the
cluster's network, ``tests/support/s3.py::on_cluster``) is rerun by an admin's ``qrerun`` onto
nodes whose disks never held a checkpoint: it restores from the bucket, resumes where it stopped,
and ends with an uninterrupted run's weights; every version in the bucket is whole.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from supervisor.journal import read_journal
from tests.support.journal import events
from tests.support.paths import ROOT
from tests.support.pbs import PbsCluster
from tests.support.pbs_jobs import kinds
from tests.support.s3 import on_cluster, skip_without_s3
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



def _job_dir(pbs: PbsCluster, name: str, *more: str) -> tuple[Path, str]:
    """The job's directory, with mpirun's rsh agent in it, and mpirun's MCA options: TCP on
    eth0, the environment every rank needs (and ``more``) exported."""
    work = pbs.workdir(name)
    (work / "tmrsh").write_text(TMRSH)
    (work / "tmrsh").chmod(0o755)
    pbs.own(work / "tmrsh")
    exported = " ".join(f"-x {v}" for v in ("PYTHONPATH", "NGPU_PER_HOST", "WANDB_MODE", "SUPERVISE_CHECKPOINT_REQUEST",
                                             "SUPERVISE_RUN_DIR", *more))
    return work, (f"--mca plm_rsh_agent {work}/tmrsh --mca btl tcp,self --mca btl_tcp_if_include eth0 "
                  f"--mca oob_tcp_if_include eth0 {exported}")

def test_ezpz_launch_under_supervise_runs_ranks_on_both_nodes_and_a_qdel_leaves_a_durable_checkpoint(
        pbs: PbsCluster, ezpz: Path) -> None:
    pbs.qmgr("set queue workq kill_delay = 45")  # the SIGKILL after qdel's TERM: past our 30 s grace
    # --warn-before 5s: with the 2-minute walltime, the default lead would stop the run for the
    # deadline before the qdel when the two torch ranks are slow to start. The 30 s grace: from the
    # TERM to ezpz launch's exit took 4.8-5.2 s here (ezpz launch alone outlives mpirun by ~2 s) and
    # over 10 s in CI beside the other tests; the promise is a clean stop, not a fast ezpz.
    work, mca = _job_dir(pbs, "ezpz")
    py = ezpz / "bin" / "python"
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


def test_ezpz_into_a_bucket_rerun_onto_other_nodes_resumes_from_the_bucket_as_if_never_stopped(
        pbs: PbsCluster, ezpz: Path, tmp_path: Path) -> None:
    """The same ezpz job with its checkpoints' persistent side in a bucket (issue 45: ``--checkpoints
    LOCAL s3://…``, a real SeaweedFS on the cluster's network, the keys in a 0600 credentials file
    on the shared storage), through an admin's ``qrerun`` with the first node taken offline, so the
    rerun's rank 0 (and supervise) start on a node whose local disk never held a checkpoint:

    * every version published is in the bucket, whole (each manifest's objects there, of its size
      and sha256), the stop's last save among them, and nothing but the bucket holds them;
    * the rerun restores the stop's checkpoint from the bucket onto its empty local disk, rank 0
      resumes at the step it stopped at, and the job runs to its end;
    * the final checkpoint, read from the bucket by its manifest, holds the weights of an
      uninterrupted run (``ezpz_train.py --replay``), bit for bit; the secret is in no file the run wrote.
    """
    torch = pytest.importorskip("torch")
    skip_without_s3()
    t0, w0 = time.monotonic(), time.time()
    steps, every = 160, 20
    pbs.qmgr("set queue workq kill_delay = 45")  # past the 30 s grace, as above
    server, bucket, env = on_cluster(pbs, tmp_path, "ezpz")
    replay: subprocess.Popen[str] | None = None
    try:
        work, mca = _job_dir(pbs, "ezpzs3", "SUPERVISE_RESTORED_FROM")
        local = pbs.local / work.name  # node-local on every node (ROOT/nodes/nK/local)
        py = ezpz / "bin" / "python"
        url = bucket.url("ezpz/ckpt")
        store_env = " ".join(f"{k}={v}" for k, v in env.items())
        # PBS discards a rerun job's first .o file: each run's output is appended to train.log
        jobid = pbs.qsub(work, script=f"""#!/bin/bash
#PBS -l select=2:ncpus=1
#PBS -l place=scatter
#PBS -l walltime=00:02:00
#PBS -j oe
#PBS -o {work}/job.out
cd {work}
export NGPU_PER_HOST=1 WANDB_MODE=disabled PATH={ezpz}/bin:$PATH {store_env}
export EZPZ_SCHEDULER=NONE RANK=0
echo "=== run on $(sort -u $PBS_NODEFILE | paste -sd' ')" >> {work}/train.log
exec {pbs.supervise_line()} --run-dir {work}/run --grace 30s --gpu-every 0 --warn-before 5s \\
    --checkpoints {local}/ckpt {url} --restore -- \\
    ezpz launch -np 2 --ppn 1 --nh 2 --hostfile $PBS_NODEFILE {mca} -- \\
    env -u RANK {py} {TRAIN} {local}/ckpt --step-time 0.05 --every {every} --steps {steps} >> {work}/train.log 2>&1
""")
        leader, log = work / "run" / "events.jsonl", work / "train.log"
        # the uninterrupted run's weights, computed in one process while the job runs (torch's import: 5-20 s here)
        replay = subprocess.Popen([str(py), str(TRAIN), "--replay", str(steps), "2", str(tmp_path / "replay.pt")],
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)

        def said() -> str:
            out = [f"job {pbs.state(jobid)}"]
            for p in (log, work / "job.out", work / "run" / "supervise.log"):
                if p.exists():
                    out.append(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}")
            return "\n".join(out)

        def published(nth: int) -> list[dict]:
            return [e for e in kinds(events(leader) if leader.exists() else [], "publish", nth)
                    if e["checkpoint"].startswith("step_")]

        # attempt 1: a periodic save published, and its manifest in the bucket (read as a user reads it)
        first = wait_for(lambda: published(1), 120, lambda: f"the first checkpoint published: {said()}")[0]
        assert bucket.manifest("ezpz/ckpt", first["checkpoint"]) is not None, (first, bucket.keys())
        node1 = kinds(events(leader), "start", 1)[0]["nodes"]
        others = [f"n{i}" for i in range(1, pbs.n + 1) if f"n{i}" != node1[0]]
        # the rerun's nodes: nothing of this job on their local disks (rank 1 writes no checkpoint)
        assert not [n for n in others if (pbs.node_local(n) / work.name).exists()], others
        pbs.admin("pbsnodes", "-o", "-C", "test: the first node taken out", node1[0])  # the rerun lands elsewhere
        try:
            t_rerun = time.time()
            pbs.admin("qrerun", jobid)
            info = pbs.wait_state(jobid, "F", timeout=150)
        finally:
            pbs.admin("pbsnodes", "-c", node1[0], check=False)
        t_done = time.time()
        evs = events(leader)
        text = log.read_text()
        runs = text.split("=== run on ")[1:]
        starts = kinds(evs, "start")
        assert len(starts) == 2 and len(runs) == 2, said()
        assert starts[1]["nodes"][0] != node1[0] and starts[1]["nodes"][0] in others, [s["nodes"] for s in starts]

        # attempt 1: PBS's TERM at the qrerun; the stop's checkpoint published into the bucket
        end1 = kinds(evs, "end", 1)[0]
        assert end1["reason"] == "preempted" and end1["stopped_cleanly"] and end1["not_durable"] == [], end1
        # "checkpoint now" answered and published, then the ranks' save at the stop's TERM: the newest
        stop_ckpt = [e for e in kinds(evs, "stop-step", 1) if e["step"] == "checkpoint"][0]
        assert stop_ckpt["outcome"] == "published" and stop_ckpt["answer"] > first["checkpoint"], stop_ckpt
        last1 = max(published(1), key=lambda e: e["checkpoint"])
        stopped = [int(m) for m in re.findall(r"^stopped (\d+)$", runs[0], re.M)]
        assert stopped == [int(last1["checkpoint"].split("_")[1])], (stopped, last1, said())
        assert last1["checkpoint"] >= stop_ckpt["answer"] and last1["t"] < end1["t"], (last1, stop_ckpt)

        # attempt 2: restored from the bucket onto the new node's empty disk, resumed where attempt 1 stopped
        restore = kinds(evs, "restore", 2)[0]
        assert restore["checkpoint"] == last1["checkpoint"], (restore, last1)
        assert restore["source"] == f"ezpz/ckpt/.supervise/manifests/{last1['checkpoint']}.json", restore  # the bucket's
        assert Path(restore["to"]) == local / "ckpt" / last1["checkpoint"] and restore["pointers"] == ["latest"], restore
        verify = kinds(evs, "restore-verify", 2)
        assert [(v["result"], list(v["from"])) for v in verify] == [("verified", ["persistent"])], verify
        assert (pbs.node_local(starts[1]["nodes"][0]) / work.name / "ckpt" / last1["checkpoint"] / "model.pt").exists()
        assert re.findall(r"^resumed (\d+)$", runs[1], re.M) == [str(stopped[0])], said()
        assert re.findall(r"^done (\d+)$", runs[1], re.M) == [str(steps)], said()
        saved2 = [int(n) for n in re.findall(r"^checkpoint (\d+)$", runs[1], re.M)]
        assert saved2 and min(saved2) > stopped[0] and max(saved2) == steps, saved2  # trained on from there
        end2 = kinds(evs, "end", 2)[0]
        assert (end2["reason"], end2["exit_status"], end2["not_durable"]) == ("child-exit", 0, []), end2
        assert info["Exit_status"] == 0, info["Exit_status"]

        # the bucket: every version published is there, whole; the last is the training's end
        names = {e["checkpoint"] for e in published(1) + published(2)}
        held = bucket.still("ezpz")
        docs = {n: d for n, d in held.manifests("ezpz/ckpt").items() if n.startswith("step_")}
        assert set(docs) == names and f"step_{steps:06d}" in names, (sorted(docs), sorted(names))
        assert {n: held.whole(d) for n, d in docs.items()} == {n: [] for n in docs}
        assert all(set(d["files"]) == {"model.pt", ".metadata"} for d in docs.values()), docs
        assert held.get("ezpz/ckpt/latest") == f"step_{steps:06d}".encode(), sorted(held.keys())  # the pointer, last
        assert not list(work.rglob("step_*")), "nothing but the bucket holds a checkpoint on the shared storage"

        t_bucket = time.time()
        # the final weights, read from the bucket by the manifest, are an uninterrupted run's
        final = torch.load(held.fetch(docs[f"step_{steps:06d}"], "model.pt", tmp_path / "final.pt"))
        assert final["step"] == steps
        assert replay.wait(timeout=120) == 0, replay.communicate()[0]
        want = torch.load(tmp_path / "replay.pt")
        assert all(torch.equal(final["model"][k], want[k]) for k in want), (final["model"], want)

        # the secret is in no file the run wrote
        leaked = [str(p) for p in work.rglob("*") if p.is_file() and server.secret.encode() in p.read_bytes()]
        assert leaked == [], leaked
        at = {"first publish": first["t"], "qrerun": t_rerun, "end 1": end1["t"], "start 2": starts[1]["t"],
              "spawn 2": kinds(evs, "spawn", 2)[0]["t"], "end 2": end2["t"], "finished": t_done, "bucket read": t_bucket,
              "replayed": time.time()}
        t_start = starts[0]["t"]
        print(f"\nezpz into a bucket: {len(docs)} versions whole; stopped and resumed at {stopped[0]}; attempt 2 on "
              f"{starts[1]['nodes']} restored {restore['bytes']} bytes in {restore['seconds']} s; "
              f"{', '.join(f'{k} +{v - t_start:.1f}' for k, v in at.items())} s after start 1, which was {t_start - w0:.1f} s "
              f"after the test's start; test {time.monotonic() - t0:.0f} s")
    finally:
        if replay is not None and replay.poll() is None:
            replay.kill()
            replay.wait()
        try:
            server.kill()  # what it holds is read: no need for its TERM, which took up to 16 s here under load
        except (OSError, ValueError):
            pass
        server.down()
