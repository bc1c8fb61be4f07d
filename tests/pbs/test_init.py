"""`supervise init --scheduler pbs` under a real OpenPBS: the script it writes passes
`supervise check`, is submitted as its own header says (run it: it submits itself as an
executable job), and survives `qsig -s USR1`, which supervise answers with a checkpoint;
submitted the classic way (`qsub train.pbs`), the same script dies of the same qsig, as its
header warns (docs/pbs.md, "The job script")."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from supervisor.journal import read_journal
from tests.support.journal import events
from tests.support.paths import ROOT
from tests.support.pbs import PbsCluster
from tests.support.supervise import run_supervise
from tests.support.wait import wait_for

TRAINER = ROOT / "tests" / "helpers" / "trainer.py"
# 300 steps of 0.05 s: about 15 s, long enough to qsig it while it runs.
COMMAND = ["python", str(TRAINER), "$LOCAL_DIR/checkpoints", "--steps", "300", "--step-time", "0.05"]


def write_script(pbs: PbsCluster, name: str) -> tuple[Path, Path]:
    """`supervise init` as a user of this cluster runs it: the site lines replaced by init's own
    options (this OpenPBS knows no `system` or `filesystems` resource, nor a `prod` queue).
    A 10-minute walltime: a USR1 within 5 minutes of the end would mean "the end is near"
    (docs/slurm.md, "Warning signals"), not "checkpoint now"; the training ends in ~15 s."""
    work = pbs.workdir(name)
    r = run_supervise("init", "--scheduler", "pbs", "--dir", str(work), "--nodes", "1", "--time", "00:10:00",
                      "--select", "ncpus=1", "--queue", "", "--filesystems", "",
                      "--local", "$TMPDIR/local", "--persistent", str(work / "persistent"), "--", *COMMAND,
                      env={"PYTHONPATH": str(ROOT)}, cwd=work)  # this checkout's supervise, from any cwd
    assert r.returncode == 0, r.stderr
    pbs.own(work)
    return work, work / "train.pbs"


def journal(work: Path) -> Path:
    """The run directory the script names: PERSISTENT_DIR/supervise-JOBNUM."""
    return wait_for(lambda: next((work / "persistent").glob("supervise-*/events.jsonl"), None), 60,
                    "the run's journal")  # type: ignore[return-value]


def supervise_pid(path: Path) -> int:
    """The pid supervise journaled at its start (this machine's PID namespace is the nodes')."""
    wait_for(lambda: events(path, "spawn"), 60, "the training's spawn in the journal")
    return int(events(path, "start")[0]["pid"])


def test_init_script_is_checked_submitted_as_it_says_and_survives_qsig_usr1(pbs: PbsCluster) -> None:
    work, script = write_script(pbs, "init")
    text = script.read_text()
    assert "#PBS -l select=1:ncpus=1" in text and "#PBS -r y" in text
    assert "#PBS -q" not in text and "filesystems" not in text and "system=polaris" not in text
    header = text.split("\n#PBS", 1)[0]
    assert "submit: ./train.pbs" in header and "qsig kills it" in header

    dirs = {"LOCAL_DIR": str(work / "check-local"), "PERSISTENT_DIR": str(work / "persistent"),
            "PYTHONPATH": str(ROOT)}
    check = run_supervise("check", "--config", str(work / "train.toml"), "--script", str(script), "--",
                          *COMMAND, env=dirs, cwd=work)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "submits itself as an executable job" in check.stdout
    assert not [ln for ln in check.stdout.splitlines() if ln.startswith("warn  script")], check.stdout

    # As the header says: run it (PYTHONPATH: the job runs this checkout's supervise and trainer).
    jobid = pbs.user(f"./{script.name}", "-v", f"PYTHONPATH={ROOT}", cwd=work).stdout.strip()
    info = pbs.job(jobid)
    assert info["Rerunable"] == "True" and info["Resource_List"]["select"] == "1:ncpus=1"
    assert info["Job_Name"] == "train"
    events_file = journal(work)
    pid = supervise_pid(events_file)
    assert os.getsid(pid) == pid  # supervise leads the job's session: no login shell above it

    pbs.user("qsig", "-s", "USR1", jobid)
    request = wait_for(lambda: events(events_file, "checkpoint-request"), 30, "the USR1's checkpoint request")[0]
    assert request["signal"] == "SIGUSR1" and request["why"] == "received SIGUSR1"
    wait_for(lambda: [e for e in events(events_file, "publish") if e.get("checkpoint", "").startswith("step_")],
             30, "the requested checkpoint published")
    assert pbs.state(jobid) == "R"  # qsig did not end the job

    done = pbs.wait_state(jobid, "F", timeout=90)
    assert done["Exit_status"] == 0
    end = read_journal(events_file).events[-1]
    assert end["kind"] == "end" and end["exit_status"] == 0 and end["reason"] == "child-exit"
    assert (work / "persistent" / "checkpoints" / "latest").is_file()  # the mirror has it


def test_the_same_script_submitted_with_qsub_dies_of_qsig(pbs: PbsCluster) -> None:
    """What the header's one-line warning says, measured: a script job's leader is the user's
    login shell, which USR1 kills, and PBS then kills the whole job."""
    work, script = write_script(pbs, "init-qsub")
    jobid = pbs.user("qsub", "-v", f"PYTHONPATH={ROOT}", script.name, cwd=work).stdout.strip()
    events_file = journal(work)
    pid = supervise_pid(events_file)
    leader = Path(f"/proc/{os.getsid(pid)}/cmdline").read_bytes().split(b"\0")[0]
    assert os.getsid(pid) != pid and leader.startswith(b"-"), leader  # e.g. -bash
    pbs.user("qsig", "-s", "USR1", jobid)
    done = pbs.wait_state(jobid, "F", timeout=60)
    assert done["Exit_status"] == 266, done.get("Exit_status")
    assert "end" not in {e.get("kind") for e in read_journal(events_file).events}  # supervise was killed


def test_env_prints_a_launch_line_the_installed_mpiexec_runs(pbs: PbsCluster) -> None:
    """`supervise env` in a job names OpenMPI's flags for the OpenMPI installed here (it refuses
    PALS's --ppn), and the line it prints runs."""
    work = pbs.workdir("env-mpi")
    jobid = pbs.qsub(work, script=f"""#!/bin/bash
#PBS -l select=1:ncpus=2:mpiprocs=2
#PBS -l walltime=00:01:00
#PBS -j oe
#PBS -o {work}/env.out
line=$({pbs.supervise_line()} env --json | {sys.executable} -c 'import json,sys; print(json.load(sys.stdin)["launch_command_text"])')
echo "LINE $line"
$line --mca btl self,tcp hostname
""")
    info = pbs.wait_state(jobid, "F", timeout=60)
    out = (work / "env.out").read_text()
    line = next(ln for ln in out.splitlines() if ln.startswith("LINE "))[5:].split()
    assert line[:6] == ["mpiexec", "--np", "2", "--map-by", "ppr:2:node", "--hostfile"], line
    assert "--ppn" not in line
    assert info["Exit_status"] == 0, out
    ranks = [ln.strip() for ln in out.splitlines() if ln.strip() and not ln.startswith("LINE")]
    assert ranks == [info["exec_host"].split("/")[0]] * 2, out  # two ranks, on the job's node
