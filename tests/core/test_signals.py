"""Real signals to a real supervise around a child that records what it receives."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from supervisor.journal import read_journal
from tests.support.paths import RECORDER
from tests.support.supervise import pid_alive, recorded, start_supervise
from tests.support.wait import wait_for


def _start(run_dir: Path, log: Path, *recorder_args: str, grace: str = "10s"):
    p = start_supervise("--run-dir", str(run_dir), "--grace", grace, "--",
                        sys.executable, str(RECORDER), str(log), *recorder_args)
    wait_for(lambda: "ready" in recorded(log), what="the child to install its handlers")
    return p


@pytest.mark.parametrize(("sig", "reason", "seen"), [
    # TERM before any deadline is a preemption: "checkpoint now" first, then the stop signal.
    (signal.SIGTERM, "preempted", ["ready", "SIGUSR1", "SIGTERM"]),
    # INT is a person cancelling: no checkpoint request, just the stop.
    (signal.SIGINT, "cancelled", ["ready", "SIGINT"]),
])
def test_stop_signals_are_forwarded_once_and_the_child_exits(run_dir: Path, tmp_path: Path, sig: signal.Signals,
                                                            reason: str, seen: list[str]) -> None:
    log = tmp_path / "signals.log"
    p = _start(run_dir, log)
    p.send_signal(sig)
    p.communicate(timeout=30)
    # the child exited 0 from its handler, but it did not finish: not requeued, supervise exits 75
    # (docs/slurm.md, "Exit status of a stop"); end.launcher_status keeps the 0
    assert p.returncode == 75, "the child exited 0 from its handler, unfinished: 75"
    assert recorded(log) == seen
    events = read_journal(run_dir).events
    stop = next(e for e in events if e["kind"] == "stop")
    assert stop["reason"] == reason and stop["signal"] == sig.name
    step = next(e for e in events if e["kind"] == "stop-step" and e["step"] == "stop-child")
    assert step["graceful"] is True and step["killed"] == []


def test_usr1_is_forwarded_and_the_child_keeps_running(run_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "signals.log"
    p = _start(run_dir, log)
    for n in range(1, 4):
        p.send_signal(signal.SIGUSR1)
        wait_for(lambda: recorded(log).count("SIGUSR1") == n, what=f"USR1 number {n}")
    assert p.poll() is None, "USR1 must not stop the run"
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    assert recorded(log) == ["ready", "SIGUSR1", "SIGUSR1", "SIGUSR1", "SIGUSR1", "SIGTERM"]
    requests = [e for e in read_journal(run_dir).events if e["kind"] == "checkpoint-request"]
    assert len(requests) == 4 and all(e["signal"] == "SIGUSR1" and e["to"] for e in requests)
    assert all(e["latency_ms"] < 1000 for e in requests[:3]), "the three USR1 we sent were passed on at once"


def test_forward_to_group_reaches_every_process_in_the_group(run_dir: Path, tmp_path: Path) -> None:
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    # A shell launcher with two recorders in its process group (no job control: same group).
    script = " & ".join(f"{sys.executable} {RECORDER} {l}" for l in logs) + " & wait"
    p = start_supervise("--run-dir", str(run_dir), "--forward", "group", "--grace", "5s", "--", "sh", "-c", script)
    for l in logs:
        wait_for(lambda l=l: "ready" in recorded(l), what="both recorders")
    p.send_signal(signal.SIGHUP)
    for l in logs:
        wait_for(lambda l=l: "SIGHUP" in recorded(l), what="HUP in both recorders")
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=30)
    assert all(recorded(l).count("SIGHUP") == 1 for l in logs)


def test_second_term_during_grace_does_not_reach_the_launcher_twice(run_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "signals.log"
    p = _start(run_dir, log, "--on-term", "ignore", grace="3s")
    p.send_signal(signal.SIGTERM)
    wait_for(lambda: "SIGTERM" in recorded(log), what="the first TERM")
    p.send_signal(signal.SIGTERM)
    p.send_signal(signal.SIGINT)
    wait_for(lambda: sum(e["kind"] == "signal" for e in read_journal(run_dir).events) >= 3, what="all three signals journaled")
    p.communicate(timeout=30)
    assert recorded(log) == ["ready", "SIGUSR1", "SIGTERM"], "only the first stop signal may reach the launcher"
    assert p.returncode == 137
    ignored = [e for e in read_journal(run_dir).events if e["kind"] == "signal" and e["action"] == "ignored"]
    # Sent back to back, both may be pending at once; the kernel delivers INT (2) before TERM (15).
    assert sorted(e["signal"] for e in ignored) == ["SIGINT", "SIGTERM"]


def test_child_ignoring_term_is_killed_after_grace(run_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "signals.log"
    p = _start(run_dir, log, "--on-term", "ignore", grace="2s")
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    elapsed = time.monotonic() - t0
    assert p.returncode == 137
    assert 2.0 <= elapsed < 8.0, elapsed
    step = next(e for e in read_journal(run_dir).events if e["kind"] == "stop-step" and e["step"] == "stop-child")
    # Not step["killed"]: it names only pids signalled one by one after killpg, often none.
    assert step["graceful"] is False, step


def test_detached_grandchild_is_not_left_running(run_dir: Path, tmp_path: Path, reaper: list[int]) -> None:
    log, pidfile = tmp_path / "signals.log", tmp_path / "grandchild.pid"
    p = start_supervise("--run-dir", str(run_dir), "--grace", "2s", "--", sys.executable, str(RECORDER), str(log),
                        "--spawn-detached", str(pidfile), "--exit-after", "0.5")
    wait_for(pidfile.exists, what="the grandchild's pid")
    grandchild = int(wait_for(lambda: pidfile.read_text().strip(), what="pid written"))
    reaper.append(grandchild)
    assert os.getsid(grandchild) == grandchild, "the grandchild is in a session of its own"
    p.communicate(timeout=30)
    assert p.returncode == 0
    assert not pid_alive(grandchild), "supervise must not leave the detached grandchild running"
    events = read_journal(run_dir).events
    step = next(e for e in events if e["kind"] == "stop-step" and e["step"] == "stop-child")
    assert grandchild in step["sent_to"] + step["killed"]


def test_sigkill_of_supervise_leaves_a_readable_journal(run_dir: Path, tmp_path: Path, reaper: list[int]) -> None:
    log = tmp_path / "signals.log"
    p = _start(run_dir, log)
    spawn = wait_for(lambda: next((e for e in read_journal(run_dir).events if e["kind"] == "spawn"), None))
    reaper.append(spawn["pid"])
    for _ in range(50):  # keep the writer busy so the kill lands among appends
        p.send_signal(signal.SIGUSR1)
    p.kill()
    p.wait(timeout=30)  # the orphaned child still holds the pipes: no communicate() yet
    first = read_journal(run_dir)
    assert first.bad_lines == [] and first.events[0]["kind"] == "start"
    # A kill mid-write leaves a partial last line; make one as the kernel would and read on.
    path = run_dir / "events.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"v":1,"t":1795270000.0,"attempt":1,"kind":"sig')
    torn = read_journal(run_dir)
    assert torn.torn_last_line is not None and torn.torn_last_line.startswith('{"v":1')
    assert len(torn.events) == len(first.events)
    try:  # the training dies with supervise (PDEATHSIG); once reaped, there is nothing to kill
        os.kill(spawn["pid"], signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.communicate(timeout=30)
    # The next attempt appends whole lines after the torn one, which is then reported as bad.
    from tests.support.supervise import run_supervise

    r = run_supervise("--run-dir", str(run_dir), "--", "true")
    assert r.returncode == 0
    after = read_journal(run_dir)
    assert after.torn_last_line is None and len(after.bad_lines) == 1
    assert [e["attempt"] for e in after.events if e["kind"] == "start"] == [1, 2]
    assert after.events[-1]["kind"] == "end"


BURST = "HUP USR1 HUP USR1 TERM HUP INT USR2 QUIT TERM USR1 HUP TERM INT CONT USR2 HUP TERM USR1 QUIT".split()
PLAIN_CHILD = """
import signal, sys, time
log = open(sys.argv[1], "a", buffering=1)
def record(n, _f):
    log.write(signal.Signals(n).name + "\\n")
def leave(n, _f):
    record(n, _f)
    time.sleep(0.3)  # still running while the rest of the burst arrives
    sys.exit(0)
for s in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, record)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
    signal.signal(s, leave)
log.write("ready\\n")
time.sleep(100)
"""


def test_a_burst_of_mixed_signals_is_one_stop_with_the_first_requests_signal(run_dir: Path, tmp_path: Path) -> None:
    """Issue 30, 4: HUP USR1 … TERM … INT … QUIT … to supervise running a plain child. One stop
    sequence whatever arrives: the child gets the stop signal of the first stop request
    supervise received, once (a warning signal's stop sends a plain child TERM), and the end's
    reason is that request's. "First" is as received: standard signals pending at once are
    coalesced and delivered lowest number first, to whichever thread of supervise the kernel
    picks, so the order sent is not the order received (seen here: USR2, QUIT, TERM, USR1, …)."""
    log = tmp_path / "signals.log"
    p = start_supervise("--run-dir", str(run_dir), "--grace", "10s", "--",
                        sys.executable, "-c", PLAIN_CHILD, str(log))
    wait_for(lambda: "ready" in recorded(log), what="the child to install its handlers")
    for name in BURST:
        p.send_signal(getattr(signal, f"SIG{name}"))
    p.communicate(timeout=60)
    events = read_journal(run_dir).events
    stops = [e for e in events if e["kind"] == "stop"]
    assert len(stops) == 1, stops
    first = next(e for e in events if e["kind"] == "signal" and e.get("action") == "stop")
    assert sum(e["kind"] == "signal" and e.get("action") == "stop" for e in events) == 1
    assert stops[0]["signal"] == first["signal"] and stops[0]["reason"] == first["reason"]
    got = [s for s in recorded(log) if s in ("SIGTERM", "SIGINT", "SIGQUIT")]
    stop_signal = first["signal"] if first["signal"] in ("SIGTERM", "SIGINT", "SIGQUIT") else "SIGTERM"
    assert got == [stop_signal], f"the child got {got}; the first stop request was {first['signal']}"
    end = next(e for e in events if e["kind"] == "end")
    assert end["reason"] == first["reason"] and p.returncode == 75 and end["launcher_status"] == 0  # unfinished
