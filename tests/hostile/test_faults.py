"""Faults of a hostile world (issue 14), each through the real `supervise` end to end: hung
copiers and nvidia-smi, a full run directory, odd signals, closed stdio, SIGKILL of
supervise, a local directory replaced, logs that start over on a new node. The promise in
each: supervise ends, bounded; `end` is journaled (or written to stderr); nothing of ours
or of the training is left running; nothing on persistent storage is lost."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.checkpoints import hung_checkpoint

from tests.hostile._util import (TRACEBACK, env_with, events, fake_tool, finish, kinds, marked, none_left,
                                 trainer)
from tests.support.supervise import start_supervise
from tests.support.wait import wait_for

HUNG_RSYNC = 'case "$*" in *--version*) exec /usr/bin/rsync --version;; esac\nexec sleep 100000\n'
STALL = "1"  # SUPERVISE_COPIER_STALL for the hung-copier cases: seconds without I/O before the kill
LONG = os.environ.get("HOSTILE_LONG") == "1"  # the long set, by hand: python -m tests.hostile


def _ended(run_dir: Path) -> dict:
    ends = kinds(run_dir, "end")
    assert len(ends) == 1, [e.get("kind") for e in events(run_dir)]
    return ends[0]


# ---------------------------------------------------------------- hung copiers

@pytest.mark.parametrize("ending", ["training-exits", "TERM"])
def test_a_hung_copier_is_killed_and_supervise_ends_bounded(tmp_path: Path, tag: str, ending: str) -> None:
    """The issue's case: a copier stuck for good (a Lustre stat); supervise was still running
    40 s after the training exited (or after a TERM with --checkpoint-timeout 5s --grace 3)."""
    bindir = tmp_path / "bin"
    fake_tool(bindir, "rsync", HUNG_RSYNC)
    run, local = tmp_path / "run", tmp_path / "local"
    steps = ["--steps", "20"] if ending == "training-exits" else []
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(tmp_path / "persistent"),
                        "--sync-backend", "rsync", "--checkpoint-timeout", "5s", "--grace", "3",
                        "--", *trainer(local, "--every", "5", *steps),
                        env=env_with(tag, bindir, SUPERVISE_COPIER_STALL=STALL))
    if ending == "TERM":
        wait_for(lambda: (local / "step_000005" / ".metadata").exists(), 20, what="a first checkpoint")
        p.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    rc, _out, err = finish(p, 40)
    assert time.monotonic() - t0 < 35
    assert TRACEBACK not in err
    end = _ended(run)
    # the training said 0, but a checkpoint is not durable: 74 (issue 42), not a 0 that hides the loss
    assert rc == 74 and end["exit_status"] == 74 and end["launcher_status"] == 0, end
    assert any("stalled" in line for line in end["not_durable"]), end["not_durable"]
    none_left(tag)


def test_a_hung_copier_after_a_failed_exit_ends_bounded_with_the_trainings_status(tmp_path: Path, tag: str) -> None:
    """Issue 30, 3: a copier that never returns (a stale mount, past the stall bound) and a
    training that exits 4 by itself: supervise was still running 40 s later with only the
    ``checkpoint`` step journaled. The flush after a normal exit is bounded like a stop's
    (no end known here, no KillWait: 30 s); ``end`` names what is not durable; exit 4."""
    bindir = tmp_path / "bin"
    fake_tool(bindir, "rsync", HUNG_RSYNC)
    run, local = tmp_path / "run", tmp_path / "local"
    train = " ".join(trainer(local, "--every", "5", "--steps", "10"))
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(tmp_path / "persistent"),
                        "--sync-backend", "rsync", "--", "sh", "-c", f"{train}; exit 4",
                        env=env_with(tag, bindir))
    t0 = time.monotonic()
    rc, _out, err = finish(p, 40)
    assert time.monotonic() - t0 < 38
    assert TRACEBACK not in err
    end = _ended(run)
    assert rc == 4 and end["exit_status"] == 4 and end["launcher_status"] == 4
    assert end["reason"] == "child-failed"
    assert end["not_durable"], end
    none_left(tag)


def test_a_hung_python_copier_is_killed(tmp_path: Path, tag: str) -> None:
    """The Python copier blocked for good opening a FIFO a checkpoint holds: killed, bounded."""
    run, local = tmp_path / "run", tmp_path / "local"
    hung_checkpoint(local)
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(tmp_path / "persistent"),
                        "--sync-backend", "python", "--", sys.executable, "-c", "import time; time.sleep(2)",
                        env=env_with(tag, SUPERVISE_COPIER_STALL=STALL))
    rc, _out, err = finish(p, 40)
    assert TRACEBACK not in err and rc == 74  # step_000001 never landed: end.not_durable names it
    assert _ended(run)["reason"] == "child-exit"
    none_left(tag)


# ---------------------------------------------------------------- nvidia-smi

SMI_QUERY = "echo '0, GPU-0000, Fake GPU, 81920, 550.00, Disabled'\n"
SMI_DMON = "printf '# gpu pwr gtemp mtemp sm mem enc dec jpg ofa mclk pclk fb bar1 ccpm\\n'\n"


@pytest.mark.parametrize("hangs", ["end-query", "start-query", "dmon-ignores-TERM"])
def test_a_hanging_nvidia_smi_is_killed_and_never_left_behind(tmp_path: Path, tag: str, hangs: str) -> None:
    """dmon backend with a stand-in nvidia-smi that hangs: after supervise exits, no
    nvidia-smi of ours is left (it was, before issue 14)."""
    bindir = tmp_path / "bin"
    counter = tmp_path / "queries"
    end_query = f'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}\n' \
                f'if [ "$n" -ge 1 ]; then exec sleep 100000; fi\n'
    query = {"end-query": end_query + SMI_QUERY, "start-query": "exec sleep 100000\n"}.get(hangs, SMI_QUERY)
    dmon = "trap '' TERM\n" + SMI_DMON + "exec sleep 100000\n" if hangs == "dmon-ignores-TERM" else SMI_DMON + "exec sleep 100000\n"
    fake_tool(bindir, "nvidia-smi", f'case "$*" in *dmon*) {dmon};; esac\n{query}')
    run = tmp_path / "run"
    p = start_supervise("--run-dir", str(run), "--gpu-backend", "dmon", "--gpu-every", "1s",
                        "--", sys.executable, "-c", "import time; time.sleep(3)",
                        env=env_with(tag, bindir, CUDA_VISIBLE_DEVICES="0"))
    rc, _out, err = finish(p, 60)
    assert TRACEBACK not in err and rc == 0
    assert _ended(run)["reason"] == "child-exit"
    none_left(tag, 5)


def test_a_hanging_scheduler_command_is_killed_and_never_left_behind(tmp_path: Path, tag: str) -> None:
    """scontrol and squeue that never answer (a controller down): each is killed at its
    bound, the training runs and ends, and none is left after supervise exits."""
    bindir = tmp_path / "bin"
    for tool in ("scontrol", "squeue", "sacct"):
        fake_tool(bindir, tool, "exec sleep 100000\n")
    run = tmp_path / "run"
    p = start_supervise("--run-dir", str(run), "--", sys.executable, "-c", "import time; time.sleep(2)",
                        env=env_with(tag, bindir, SLURM_JOB_ID="4242", SLURM_JOB_NAME="hostile"))
    rc, _out, err = finish(p, 60)
    assert rc == 0 and TRACEBACK not in err, err
    assert _ended(run)["reason"] == "child-exit"
    none_left(tag, 5)


def _slurm_time(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def test_a_scancel_during_the_start_up_read_of_the_end_is_cancelled_and_never_requeued(
        tmp_path: Path, tag: str) -> None:
    """Issue 30, 7: a scancel that lands while supervise reads the job's end at start-up moves
    EndTime to the cancel time: supervise took it for the time limit (the deadline watch
    stopped the run as `deadline` at once) and, with --requeue, asked `scontrol requeue` for
    a cancelled job. The controller's facts tell them apart: EndTime before StartTime +
    TimeLimit is an early end. Stand-in squeue/scontrol answer as Slurm 22.05 does during
    the cancel's KillWait; the job-wide CONT+TERM follows."""
    bindir, calls = tmp_path / "bin", tmp_path / "calls"
    now = time.time()
    start, cancel, limit = _slurm_time(now - 60), _slurm_time(now), "00:10:00"
    fake_tool(bindir, "squeue", f'echo "{cancel} {start} 10:00"\n')
    fake_tool(bindir, "scontrol", f'echo "$*" >> {calls}\n'
                                  'case "$1 $2" in\n'
                                  '"show config") echo "KillWait                = 5 sec";;\n'
                                  f'"show job") echo "JobId=4242 JobName=x JobState=COMPLETING Reason=None Restarts=0 '
                                  f'TimeLimit={limit} StartTime={start} EndTime={cancel} PreemptTime=None";;\n'
                                  'esac\n')
    run = tmp_path / "run"
    p = start_supervise("--run-dir", str(run), "--requeue", "--grace", "3s", "--gpu-every", "0",
                        "--", sys.executable, "-c", "import time; time.sleep(60)",
                        env=env_with(tag, bindir, SLURM_JOB_ID="4242", SLURM_JOB_NAME="hostile"))
    wait_for(lambda: {"spawn", "deadline"} <= {e["kind"] for e in events(run)} or p.poll() is not None, 30,
             what="the training to start and the end to be read")
    if p.poll() is None:  # the job-wide signals of the cancel: SIGCONT, then SIGTERM
        p.send_signal(signal.SIGCONT)
        p.send_signal(signal.SIGTERM)
    rc, _out, err = finish(p, 40)
    assert TRACEBACK not in err
    deadline = kinds(run, "deadline")[0]
    assert deadline["end"] == pytest.approx(now - 60 + 600, abs=2), "the end is the time limit, not the cancel"
    end = _ended(run)
    assert end["reason"] == "cancelled", end
    assert not any(line.startswith("requeue") for line in calls.read_text().splitlines()), calls.read_text()
    requeue = next(e for e in kinds(run, "stop-step") if e["step"] == "requeue")
    assert requeue.get("requeued") is not True, requeue
    none_left(tag)


# ---------------------------------------------------------------- a full run directory

def _tmpfs(path: Path, size: str) -> None:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)


@pytest.fixture
def small_fs(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    _tmpfs(mnt, "1m")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(fs: Path) -> Path:
    ballast = fs / "ballast"
    with open(ballast, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    return ballast


@pytest.mark.parametrize("freed", [False, True])
def test_a_full_run_directory_never_stops_the_supervision(small_fs: Path, tmp_path: Path, tag: str, freed: bool) -> None:
    """ENOSPC on the journal: supervise crashed with tracebacks and left the training orphaned.
    Now it supervises on, stops the training on TERM and writes `end` to stderr when the run
    directory cannot take it (or to the journal, once space is back)."""
    run = small_fs / "run"
    p = start_supervise("--run-dir", str(run), "--",
                        sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)",
                        env=env_with(tag))
    wait_for(lambda: kinds(run, "spawn"), 20, what="the training")
    ballast = _fill(small_fs)
    os.kill(p.pid, signal.SIGUSR1)  # a signal event the journal cannot take
    time.sleep(0.5)
    if freed:
        ballast.unlink()
    p.send_signal(signal.SIGTERM)
    rc, _out, err = finish(p, 30)
    assert TRACEBACK not in err and "Logging error" not in err
    assert rc == 143 or rc == 0 or rc == 128 + signal.SIGTERM, (rc, err)
    if freed:
        assert _ended(run)["reason"] in ("preempted", "cancelled")
    else:
        assert "cannot write" in err and '"kind":"end"' in err
    none_left(tag)


# ---------------------------------------------------------------- signals

def test_warn_signal_alrm_stops_with_a_checkpoint(tmp_path: Path, tag: str) -> None:
    """--warn-signal ALRM: SIGALRM killed supervise (142), no `end`, the training orphaned."""
    run, local = tmp_path / "run", tmp_path / "local"
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(tmp_path / "persistent"),
                        "--warn-signal", "ALRM", "--", *trainer(local), env=env_with(tag))
    wait_for(lambda: kinds(run, "spawn"), 20, what="the training")
    time.sleep(0.5)
    p.send_signal(signal.SIGALRM)
    rc, _out, err = finish(p, 40)
    assert rc == 75, err  # a clean deadline stop, not requeued: the training is unfinished
    end = _ended(run)
    assert end["reason"] == "deadline"
    assert kinds(run, "signal")[0]["signal"] == "SIGALRM"
    none_left(tag)


STRAY = ["SIGALRM", "SIGVTALRM", "SIGPROF", "SIGXCPU", "SIGPWR", "SIGIO", "SIGSTKFLT", "SIGTSTP", "SIGTTIN", "SIGTTOU"]
if LONG:  # every real-time signal too (by number: they have no names of their own)
    STRAY += [f"SIGRTMIN+{n}" for n in range(0, signal.SIGRTMAX - signal.SIGRTMIN + 1)]


def _signum(name: str) -> int:
    if name.startswith("SIGRTMIN+"):
        return signal.SIGRTMIN + int(name.split("+")[1])
    return getattr(signal, name)


@pytest.mark.parametrize("name", STRAY)
def test_a_stray_signal_is_ignored_and_the_run_goes_on(tmp_path: Path, tag: str, name: str) -> None:
    """Every catchable signal has a meaning: these are ignored (they killed or stopped
    supervise before), and the training does not inherit the ignoring."""
    run = tmp_path / "run"
    p = start_supervise("--run-dir", str(run), "--", sys.executable, "-c",
                        "import signal, sys, time\n"
                        f"print(signal.getsignal({_signum(name)}) == signal.SIG_DFL, flush=True)\n"
                        "time.sleep(1.5)", env=env_with(tag))
    wait_for(lambda: kinds(run, "spawn"), 20, what="the training")
    time.sleep(0.3)
    p.send_signal(_signum(name))
    time.sleep(0.3)
    assert p.poll() is None, "supervise died of a stray signal"
    with open(f"/proc/{p.pid}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] != "T", "supervise was stopped"
    rc, out, err = finish(p, 30)
    assert rc == 0, err
    assert out.strip() == "True", "the training must start with default dispositions"
    assert _ended(run)["reason"] == "child-exit"


# ---------------------------------------------------------------- closed stdio

@pytest.mark.parametrize("closed", [0, 1, 2])
def test_started_with_a_closed_standard_stream(tmp_path: Path, tag: str, closed: int) -> None:
    """`supervise ... >&-`: AttributeError 'NoneType' object has no attribute 'flush', exit 1.
    Now it runs, and the journal never lands on the training's descriptor 1 or 2."""
    run = tmp_path / "run"
    out = tmp_path / "child.out"
    script = f"import os; os.write(1, b'x') if {closed} != 1 else None; print(os.readlink('/proc/self/fd/{closed}'))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERVISE_")}
    env.update(env_with(tag))
    shell = f'exec {sys.executable} -m supervisor --run-dir {run} -- {sys.executable} -c "{script}" {closed}>&- '
    shell += f"> {out}" if closed != 1 else f"2> {tmp_path / 'err'}"
    r = subprocess.run(["sh", "-c", shell], env=env, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0
    if closed != 1:
        text = out.read_text()
        assert "events.jsonl" not in text and "supervise.log" not in text, text
    assert _ended(run)["exit_status"] == 0


# ---------------------------------------------------------------- SIGKILL of supervise

@pytest.mark.parametrize("with_copier", [False, True])
def test_sigkill_of_supervise_takes_the_training_and_copiers_with_it(tmp_path: Path, tag: str, with_copier: bool) -> None:
    """Outside a cgroup that would do it, the copiers and the training kept running. Now the
    launcher gets TERM (PR_SET_PDEATHSIG) and our copiers KILL when supervise dies."""
    run, local = tmp_path / "run", tmp_path / "local"
    bindir = tmp_path / "bin"
    args = ["--run-dir", str(run)]
    if with_copier:
        fake_tool(bindir, "rsync", HUNG_RSYNC)
        args += ["--checkpoints", str(local), str(tmp_path / "persistent"), "--sync-backend", "rsync"]
    p = start_supervise(*args, "--", *trainer(local, "--every", "3"), env=env_with(tag, bindir))
    wait_for(lambda: kinds(run, "spawn"), 20, what="the training")
    if with_copier:
        wait_for(lambda: any(_comm(pid) == "sleep" for pid in marked(tag)), 20, what="a hung copier")
    p.kill()
    p.wait()
    none_left(tag, 10)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


# ---------------------------------------------------------------- the local side replaced

def test_a_local_checkpoint_directory_removed_and_made_again_is_watched_again(tmp_path: Path, tag: str) -> None:
    """Its watch was lost: new checkpoints waited for the final flush (sync_every 1h here)."""
    run, local, persistent = tmp_path / "run", tmp_path / "local", tmp_path / "persistent"
    local.mkdir()
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persistent), "--sync-every", "1h",
                        "--", sys.executable, "-c", "import time; time.sleep(60)", env=env_with(tag))
    try:
        wait_for(lambda: kinds(run, "spawn"), 20, what="the training")
        time.sleep(1.0)
        local.rename(tmp_path / "old-local")
        local.mkdir()
        time.sleep(1.5)
        d = local / "step_000001"
        d.mkdir()
        (d / "shard_0.bin").write_bytes(b"x" * 1000)
        (d / ".metadata").write_text("1")
        wait_for(lambda: (persistent / "step_000001" / ".metadata").exists(), 15, what="the new checkpoint published")
    finally:
        p.send_signal(signal.SIGINT)
        finish(p, 30)
    assert any(e.get("action") == "replaced" for e in kinds(run, "sync-source"))


# ---------------------------------------------------------------- logs that start over

def test_a_log_on_a_new_node_keeps_the_earlier_attempts_lines(tmp_path: Path, tag: str) -> None:
    """A requeued attempt on another node (a new local disk) truncated the persistent
    train.log: 2000 lines of attempt 1 became 0. Now they are kept as train.log.attempt-1."""
    run, persistent = tmp_path / "run", tmp_path / "plogs"
    lines = "".join(f"attempt 1 line {i}\n" for i in range(2000))
    for attempt, text in ((1, lines), (2, "attempt 2 line 0\n")):
        local = tmp_path / f"node{attempt}"
        local.mkdir()
        write = f"open({str(local / 'train.log')!r}, 'w').write({text!r})"
        p = start_supervise("--run-dir", str(run), "--logs", str(local), str(persistent),
                            "--", sys.executable, "-c", write, env=env_with(tag))
        rc, _out, err = finish(p, 30)
        assert rc == 0, err
    assert (persistent / "train.log.attempt-1").read_text() == lines
    assert (persistent / "train.log").read_text() == "attempt 2 line 0\n"
    kept = kinds(run, "log-restarted")
    assert [(e["file"], e["kept_as"]) for e in kept] == [("train.log", "train.log.attempt-1")]


@pytest.mark.parametrize("backend", ["rsync", "python"])
def test_a_new_log_written_during_the_first_pass_never_overwrites_the_earlier_attempts(
        tmp_path: Path, tag: str, backend: str) -> None:
    """Issue 30, 1: a requeued attempt on a fresh local disk whose training wrote its log at
    once lost attempt 1's 2000 lines (2 of 5 tries under load): the check that sets a restarted
    log aside ran before the file existed, and the copy after it grew the new file over the
    persistent one. The window is opened deterministically: a stand-in ``nice`` (every copier
    runs under it) writes the new log as the first copier of the attempt starts, after any
    check supervise made before it."""
    run, persistent, first, second = (tmp_path / n for n in ("run", "plogs", "node1", "node2"))
    a1 = "".join(f"a1 {i}\n" for i in range(1, 2001))
    a2 = "".join(f"a2 {i}\n" for i in range(1, 3001))
    first.mkdir()
    write = f"open({str(first / 'train.log')!r}, 'w').write({a1!r})"
    rc, _out, err = finish(start_supervise("--run-dir", str(run), "--logs", str(first), str(persistent),
                                           "--sync-backend", backend, "--", sys.executable, "-c", write,
                                           env=env_with(tag)), 30)
    assert rc == 0 and (persistent / "train.log").read_text() == a1, err
    second.mkdir()
    (tmp_path / "a2.log").write_text(a2)
    bindir, fired = tmp_path / "bin", tmp_path / "fired"
    fake_tool(bindir, "nice", f'if [ ! -e {fired} ]; then cp {tmp_path / "a2.log"} {second / "train.log"}; : > {fired}; fi\n'
                              f'exec {shutil.which("nice")} "$@"\n')
    wait_marker = f"while [ ! -e {fired} ]; do sleep 0.05; done"
    rc, _out, err = finish(start_supervise("--run-dir", str(run), "--logs", str(second), str(persistent),
                                           "--sync-backend", backend, "--", "sh", "-c", wait_marker,
                                           env=env_with(tag, bindir)), 30)
    assert rc == 0, err
    assert (persistent / "train.log.attempt-1").read_text() == a1
    assert (persistent / "train.log").read_text() == a2
    kept = kinds(run, "log-restarted")
    assert [(e["file"], e["kept_as"]) for e in kept] == [("train.log", "train.log.attempt-1")]


def test_a_log_reopened_for_writing_keeps_the_earlier_content(tmp_path: Path, tag: str) -> None:
    """Within one attempt: the training reopens its log with "w" (a new inode, shorter)."""
    run, local, persistent = tmp_path / "run", tmp_path / "logs", tmp_path / "plogs"
    local.mkdir()
    script = (f"import os, time\np = {str(local / 'train.log')!r}\nopen(p, 'w').write('first run\\n' * 500)\n"
              f"time.sleep(3)\nos.unlink(p)\nopen(p, 'w').write('second\\n')\ntime.sleep(3)\n")
    p = start_supervise("--run-dir", str(run), "--logs", str(local), str(persistent), "--sync-every", "1s",
                        "--", sys.executable, "-c", script, env=env_with(tag))
    rc, _out, err = finish(p, 40)
    assert rc == 0, err
    assert (persistent / "train.log.attempt-1").read_text() == "first run\n" * 500
    assert (persistent / "train.log").read_text() == "second\n"
