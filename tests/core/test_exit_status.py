"""The exit status is the child's: 0, N, 128+signal, 127 not found, 126 not executable."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from supervisor.journal import read_journal
from tests.support.supervise import run_supervise


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("exit 0", 0),
        ("exit 3", 3),
        ("kill -KILL $$", 137),
        ("kill -TERM $$", 143),
    ],
)
def test_exit_status_is_the_childs(run_dir: Path, script: str, expected: int) -> None:
    r = run_supervise("--run-dir", str(run_dir), "--", "sh", "-c", script)
    assert r.returncode == expected, r.stderr
    events = read_journal(run_dir).events
    end = [e for e in events if e["kind"] == "end"]
    assert len(end) == 1 and end[0]["exit_status"] == expected
    assert end[0]["reason"] == ("child-exit" if expected == 0 else "child-failed")
    assert "Traceback" not in r.stderr


def test_command_not_found_is_127_with_one_clear_line(run_dir: Path) -> None:
    r = run_supervise("--run-dir", str(run_dir), "--", "no-such-command-xyz", "--flag")
    assert r.returncode == 127
    lines = [l for l in r.stderr.splitlines() if "no-such-command-xyz" in l]
    assert len(lines) == 1 and "command not found" in lines[0]
    assert "Traceback" not in r.stderr
    kinds = [e["kind"] for e in read_journal(run_dir).events]
    assert "spawn-failed" in kinds and kinds[-1] == "end"


def test_not_executable_is_126(run_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\necho never\n")
    script.chmod(0o644)
    r = run_supervise("--run-dir", str(run_dir), "--", str(script))
    assert r.returncode == 126
    assert "permission denied" in r.stderr and "never" not in r.stdout
    r = run_supervise("--run-dir", str(run_dir), "--", str(tmp_path))
    assert r.returncode == 126 and "directory" in r.stderr


def test_stdio_passes_through_untouched(run_dir: Path) -> None:
    r = run_supervise("--run-dir", str(run_dir), "-q", "--", sys.executable, "-c",
                      "import sys; sys.stdout.write('out\\x00bytes\\n'); sys.stderr.write('err line\\n')")
    assert r.returncode == 0
    assert r.stdout == "out\x00bytes\n"
    assert r.stderr == "err line\n"


def test_child_gets_the_supervise_environment(run_dir: Path) -> None:
    r = run_supervise("--run-dir", str(run_dir), "-q", "--", sys.executable, "-c",
                      "import os; print(os.environ['SUPERVISE_RUN_DIR'], os.environ['SUPERVISE_ATTEMPT'], "
                      "os.environ['SUPERVISE_CHECKPOINT_REQUEST'])")
    run, attempt, request = r.stdout.split()
    assert Path(run) == run_dir and attempt == "1" and Path(request).parent == run_dir
    r = run_supervise("--run-dir", str(run_dir), "-q", "--", sys.executable, "-c",
                      "import os; print(os.environ['SUPERVISE_ATTEMPT'])")
    assert r.stdout.strip() == "2", "a second run into the same run directory is the next attempt"


def test_orphans_are_reaped_without_stealing_the_launchers_status(run_dir: Path) -> None:
    # The launcher's child backgrounds a short sleep and exits: the sleep is orphaned to
    # us, exits while the launcher still runs, and must be reaped by us, by pid.
    r = run_supervise("--run-dir", str(run_dir), "--", "sh", "-c", "sh -c 'sleep 0.5 & exit 0'; sleep 3; exit 5")
    assert r.returncode == 5
    events = read_journal(run_dir).events
    assert sum(e["kind"] == "orphan-reaped" for e in events) == 1
    assert next(e for e in events if e["kind"] == "child-exit")["exit_status"] == 5


SCONTROL = """#!/bin/sh
case "$*" in
  *"show config"*) echo "KillWait                = 5 sec" ;;
  *"show job"*) echo "JobId=77 JobName=t UserId=root(0) JobState=$(cat {state} 2>/dev/null || echo RUNNING) \
Reason=None Requeue=1 Restarts=0 BatchFlag=1 RunTime=00:00:02 TimeLimit=01:00:00 \
StartTime=2026-11-22T22:26:10 EndTime=2099-11-22T23:26:10 PreemptTime=None" ;;
  *) exit 1 ;;
esac
"""


@pytest.mark.parametrize(("state", "reason"), [("COMPLETING", "cancelled"), ("TIMEOUT", "deadline"),
                                               ("RUNNING", "child-failed")])
def test_a_training_killed_by_the_schedulers_term_before_ours_is_not_a_failure(
        tmp_path: Path, state: str, reason: str) -> None:
    """scancel (or the time limit) signals every process of the job at once, and supervise may
    see its training dead of that TERM before its own TERM arrives (CI: exit 143, 33 ms before):
    the controller, which changed the job's state before it signalled, names the stop. A job
    still RUNNING means something else killed the training: the failure stands. (Slurm's tools
    stand in: the order of the two deliveries cannot be chosen under the real one, where
    tests/slurm/test_issue22_slurm.py cancels a real job.)"""
    bindir, run_dir, state_file = tmp_path / "bin", tmp_path / "run", tmp_path / "state"
    bindir.mkdir()
    for name, body in (("scontrol", SCONTROL.format(state=state_file)), ("squeue", "#!/bin/sh\nexit 1\n")):
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    env = {"SLURM_JOB_ID": "77", "PATH": f"{bindir}:{os.environ['PATH']}"}
    # The controller's state changes first, then the TERM reaches the training.
    script = f"echo {state} > {state_file}; kill -TERM $$"
    r = run_supervise("--run-dir", str(run_dir), "--gpu-every", "0", "--", "sh", "-c", script, env=env)
    events = read_journal(run_dir).events
    end = next(e for e in events if e["kind"] == "end")
    assert end["reason"] == reason, (end, r.stderr)
    assert r.returncode == end["exit_status"] == 143, r.stderr
    refined = [e for e in events if e["kind"] == "reason"]
    assert [(e["state"], e["was"]) for e in refined] == [(state, "child-failed")], refined
