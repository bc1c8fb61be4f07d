"""The journal writer and its tolerant reader."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from supervisor.journal import Journal, next_attempt, read_journal, redact_env
from supervisor.sched import restart_count


def test_events_carry_version_time_attempt_and_kind(tmp_path: Path) -> None:
    with Journal(tmp_path, attempt=4) as j:
        j.emit("spawn", pid=12)
        j.emit("signal", signal="SIGUSR1")
    events = read_journal(tmp_path).events
    assert [e["kind"] for e in events] == ["spawn", "signal"]
    assert all(e["v"] == 1 and e["attempt"] == 4 and e["t"] > 1.7e9 for e in events)


def test_torn_last_line_is_reported_not_fatal(tmp_path: Path) -> None:
    with Journal(tmp_path, attempt=1) as j:
        j.emit("start")
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('{"v":1,"kind":"end","exit')
    r = read_journal(tmp_path)
    assert [e["kind"] for e in r.events] == ["start"]
    assert r.torn_last_line == '{"v":1,"kind":"end","exit'
    assert r.bad_lines == []


def test_a_new_writer_ends_a_torn_line_first(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text('{"v":1,"attempt":1,"kind":"start"}\n{"v":1,"kin')
    with Journal(tmp_path, attempt=2) as j:
        j.emit("start")
    r = read_journal(tmp_path)
    assert [e["attempt"] for e in r.events] == [1, 2]
    assert r.bad_lines == [2] and r.torn_last_line is None


def test_secrets_never_reach_the_file(tmp_path: Path) -> None:
    url = "https://hooks.slack.example/services/T0/B0/abcdef"
    with Journal(tmp_path, attempt=1) as j:
        j.add_secret(url)
        j.emit("notify-failed", error=f"POST {url} failed", nested={"u": url})
    text = (tmp_path / "events.jsonl").read_text()
    assert "abcdef" not in text and text.count("<redacted>") == 2
    assert json.loads(text)["error"] == "POST <redacted> failed"


def test_redact_env_keeps_scheduler_variables_and_hides_secrets() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_AUTH_TOKEN": "x", "PBS_JOBID": "9.pbs", "HOME": "/root",
           "SUPERVISE_NOTIFY": "https://h", "AWS_SECRET_ACCESS_KEY": "k"}
    out = redact_env(env, ("SLURM_", "PBS_", "SUPERVISE_"))
    assert out == {"PBS_JOBID": "9.pbs", "SLURM_AUTH_TOKEN": "<redacted>", "SLURM_JOB_ID": "7", "SUPERVISE_NOTIFY": "<redacted>"}


def test_attempt_numbers_follow_slurm_and_never_repeat(tmp_path: Path) -> None:
    """The scheduler's requeue count (Slurm's, from its environment: ``sched.restart_count``, as the
    plan hands it) numbers the attempt; the journal's own count wins when it is ahead."""
    def restarts(count: str | None) -> int:
        return restart_count({"SLURM_JOB_ID": "7", **({"SLURM_RESTART_COUNT": count} if count is not None else {})})

    assert next_attempt(tmp_path, restarts(None)) == 1 and next_attempt(tmp_path) == 1
    assert next_attempt(tmp_path, restarts("2")) == 3
    with Journal(tmp_path, attempt=5) as j:
        j.emit("start")
    assert next_attempt(tmp_path, restarts("1")) == 6


def test_reading_a_run_directory_while_it_is_being_made_never_fails(tmp_path: Path) -> None:
    """A reader polling a starting run saw no directory, then opened the path just made as
    one (IsADirectoryError in a chaos trial). A directory that comes and goes under a reader
    must read as empty, every time."""
    run = tmp_path / "run"
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            run.mkdir()
            run.rmdir()

    t = threading.Thread(target=churn, daemon=True)
    t.start()
    try:
        reads = [read_journal(run) for _ in range(3000)]
    finally:
        stop.set()
        t.join(10)
    assert all(r.events == [] and r.bad_lines == [] for r in reads)
    assert read_journal(tmp_path / "missing" / "events.jsonl").events == []
