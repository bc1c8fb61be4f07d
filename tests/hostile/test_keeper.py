"""Issue 42, 3: nothing the training starts outlives supervise, even a ``kill -9`` of it.

The launcher's death signal (TERM) reached the launcher alone: a grandchild it left
running (``bash -c 'sleep 300 & wait'``), a daemon (double fork + setsid) and a process in
a session of its own were re-parented to pid 1 and kept running. Now the keeper, a small
process supervise starts before the training, sees its pipe from supervise close and ends
every process of the training it can find: the training's token in their environment, the
launcher's session and process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


from tests.hostile._util import env_with, kinds, marked
from tests.support.supervise import killed_on_exit, pid_alive, start_supervise, supervise_argv
from tests.support.wait import wait_for

# A training that leaves every kind of process behind it: a grandchild under a shell, a
# daemon (double fork + setsid), a process in a session of its own that ignores TERM, and
# one in the launcher's session that cleared its environment (no token to find it by).
_TRAINING = r"""
import os, signal, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[1])
pids = {}
pids["grandchild-shell"] = subprocess.Popen(["bash", "-c", "sleep 300 & wait"]).pid
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(r)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        os.execvp("sleep", ["sleep", "301"])
    os._exit(0)
os.close(w)
pids["daemon"] = int(os.read(r, 32))
os.wait()
pids["own-session-ignores-TERM"] = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(302)"],
    start_new_session=True).pid
pids["cleared-environment"] = subprocess.Popen(["env", "-i", "/bin/sleep", "303"]).pid
time.sleep(0.5)
out.write_text(" ".join(f"{k}={v}" for k, v in pids.items()))
time.sleep(600)
"""


def test_nothing_the_training_started_outlives_a_sigkill_of_supervise(tmp_path: Path, tag: str) -> None:
    run, pids_file = tmp_path / "run", tmp_path / "pids"
    p = start_supervise("--run-dir", str(run), "--", sys.executable, "-c", _TRAINING, str(pids_file),
                        env=env_with(tag))
    with killed_on_exit(p):
        wait_for(pids_file.exists, 30, what="the training's processes started")
        pids = {k: int(v) for k, v in (item.split("=") for item in pids_file.read_text().split())}
        cleared = pids["cleared-environment"]
        try:
            assert all(pid_alive(pid) for pid in pids.values()), pids
            p.send_signal(signal.SIGKILL)
            p.wait()
            t0 = time.monotonic()
            wait_for(lambda: not marked(tag) and not pid_alive(cleared), 10,
                     what="no process of the training left 10 s after kill -9 of supervise", interval=0.1)
            took = time.monotonic() - t0
        finally:
            if pid_alive(cleared):
                os.kill(cleared, signal.SIGKILL)
    print(f"every process of the training gone {took:.2f} s after kill -9 of supervise")
    killed = kinds(run, "keeper-killed")
    assert len(killed) == 1, killed
    assert set(pids.values()) <= set(killed[0]["pids"]), (pids, killed[0])
    # the report tells it: killed, not "running"
    r = subprocess.run(supervise_argv("report", str(run), "--json"), capture_output=True, text=True, timeout=60)
    verdict = json.loads(r.stdout)["verdict"]
    assert verdict["status"] == "killed" and "its keeper then ended" in verdict["headline"], verdict


def _keeper_of(supervise_pid: int) -> int | None:
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if ppid == supervise_pid and any(a.endswith(b"keeper.py") for a in argv):
            return int(pid)
    return None


def test_the_keeper_stays_out_of_the_way_of_a_clean_stop(tmp_path: Path, tag: str) -> None:
    """The keeper is a child of supervise in a session of its own, as an orphan of the training
    would be: the stop must not take it for one (a graceful stop, nothing killed), and it is
    gone with supervise, with nothing to end (no ``keeper-killed``)."""
    run = tmp_path / "run"
    p = start_supervise("--run-dir", str(run), "--grace", "5", "--", "sleep", "60", env=env_with(tag))
    with killed_on_exit(p):
        wait_for(lambda: kinds(run, "spawn"), 30, what="the training")
        keeper = wait_for(lambda: _keeper_of(p.pid), 10, what="the keeper")
        p.send_signal(signal.SIGTERM)
        _out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err
    stop = [e for e in kinds(run, "stop-step") if e.get("step") == "stop-child"]
    assert stop and stop[0]["graceful"] and not stop[0]["killed"], stop
    assert not kinds(run, "orphans-killed")
    wait_for(lambda: not pid_alive(keeper) and not marked(tag), 10, what="the keeper gone with supervise", interval=0.1)
    assert not kinds(run, "keeper-killed")
    assert kinds(run, "end")
