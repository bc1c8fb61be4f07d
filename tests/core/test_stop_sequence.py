"""The stop sequence end to end, outside a scheduler: real training stand-in, real sync."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from supervisor.launchers import catches
from tests.support.journal import events
from tests.support.paths import HELPERS
from tests.support.supervise import run_supervise, start_supervise
from tests.support.wait import wait_for

TRAINER = [sys.executable, str(HELPERS / "trainer.py")]


def _steps(run_dir: Path) -> list[str]:
    return [e["step"] for e in events(run_dir, "stop-step")]


def _complete(persist: Path) -> list[str]:
    """Checkpoint directories on the persistent side, each checked to be whole."""
    done = []
    for d in sorted(persist.glob("step_*")):
        assert (d / ".metadata").exists(), f"{d} published without its marker"
        assert sorted(p.name for p in d.iterdir()) == [".metadata", "shard_0.bin", "shard_1.bin"], d
        done.append(d.name)
    return done


def test_time_limit_checkpoint_is_durable_before_the_stop(tmp_path: Path) -> None:
    run, local, persist = tmp_path / "run", tmp_path / "local", tmp_path / "persist"
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--time-limit", "8s",
                      "--warn-before", "4s", "--grace", "5s", "--gpu-every", "0", "--",
                      *TRAINER, str(local), "--write-time", "0.5")
    assert r.returncode == 75, r.stderr  # a clean stop, not requeued: the training is unfinished
    assert _steps(run) == ["checkpoint", "flush", "stop-child", "final-flush", "requeue"]
    ck = next(e for e in events(run, "stop-step") if e["step"] == "checkpoint")
    assert ck["outcome"] == "published", ck
    end = events(run, "end")[0]
    assert end["reason"] == "deadline" and end["not_durable"] == []
    # The checkpoint taken at the warning is on persistent storage before the child was stopped.
    publishes = events(run, "publish")
    stop_child = next(e for e in events(run, "stop-step") if e["step"] == "stop-child")
    assert any(p["t"] < stop_child["t"] - stop_child["seconds"] for p in publishes if not p.get("pointer"))
    saved = [int(l.split()[1]) for l in r.stdout.splitlines() if l.startswith("checkpoint")]
    assert _complete(persist)[-1] == f"step_{max(saved):06d}", "the last checkpoint written is the last durable one"
    assert (persist / "latest").read_text() == f"step_{max(saved):06d}"


def test_warn_signal_means_the_end_is_near(tmp_path: Path) -> None:
    run, local, persist = tmp_path / "run", tmp_path / "local", tmp_path / "persist"
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--grace", "5s",
                        "--gpu-every", "0", "--", *TRAINER, str(local))
    wait_for(lambda: events(run, "spawn") and local.exists(), what="the training to start")
    wait_for(lambda: events(run, "sync"), what="the first sync pass")
    pid = events(run, "spawn")[0]["pid"]
    wait_for(lambda: catches(pid, signal.SIGUSR1), what="the trainer's USR1 handler (installed on import)")
    p.send_signal(signal.SIGUSR2)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 75, err  # stopped, not requeued: unfinished
    stop = events(run, "stop")[0]
    assert stop["reason"] == "deadline" and stop["signal"] == "SIGUSR2"
    assert events(run, "checkpoint-request")[0]["to"], "the training catches USR1, so it was signalled"
    assert len(_complete(persist)) >= 1


def test_usr1_asks_for_a_checkpoint_and_the_run_goes_on(tmp_path: Path) -> None:
    run, local, persist = tmp_path / "run", tmp_path / "local", tmp_path / "persist"
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--grace", "5s",
                        "--gpu-every", "0", "--", *TRAINER, str(local))
    wait_for(lambda: events(run, "spawn") and local.exists(), what="the training to start")
    # Before the trainer's handler is in place the request file carries the request alone.
    p.send_signal(signal.SIGUSR1)
    wait_for(lambda: list(persist.glob("step_*/.metadata")), timeout=30, what="the requested checkpoint on persistent storage")
    assert p.poll() is None, "a checkpoint request must not stop the run"
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=60)
    assert events(run, "end")[0]["reason"] == "cancelled"


def test_a_crash_is_restarted_in_place_then_reported(tmp_path: Path) -> None:
    run, local = tmp_path / "run", tmp_path / "local"
    r = run_supervise("--run-dir", str(run), "--max-restarts", "2", "--gpu-every", "0", "--config", str(_restart_cfg(tmp_path)),
                      "--", *TRAINER, str(local), "--fail-at", "3")
    assert r.returncode == 3
    restarts = events(run, "restart")
    assert [e["number"] for e in restarts] == [1, 2]
    assert [e["backoff_s"] for e in restarts] == [0.1, 0.2], "the backoff doubles"
    assert len(events(run, "spawn")) == 3
    end = events(run, "end")[0]
    assert end["reason"] == "child-failed" and end["restarts"] == 2


def _restart_cfg(tmp_path: Path) -> Path:
    cfg = tmp_path / "restart.toml"
    cfg.write_text('restart_backoff = "0.1s"\n')
    return cfg


def test_hang_watchdog_reports_then_stops(tmp_path: Path) -> None:
    run, local, persist = tmp_path / "run", tmp_path / "local", tmp_path / "persist"
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--hang-after", "2s",
                      "--hang-action", "stop", "--grace", "3s", "--gpu-every", "0", "--",
                      *TRAINER, str(local), timeout=60)
    hang = events(run, "hang")
    assert len(hang) == 1 and hang[0]["idle_s"] >= 2
    assert events(run, "end")[0]["reason"] == "hang"
    assert r.returncode == 75, "the training checkpointed and exited 0 on the stop, unfinished and not requeued"


def test_restore_brings_back_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    local, persist = tmp_path / "local", tmp_path / "persist"
    cfg = tmp_path / "sync.toml"
    cfg.write_text(f'[[sync]]\nfrom = "{local}"\nto = "{persist}"\nrestore = true\n')
    run = tmp_path / "run"
    r1 = run_supervise("--config", str(cfg), "--run-dir", str(run), "--gpu-every", "0", "--",
                       *TRAINER, str(local), "--steps", "20", "--every", "10")
    assert r1.returncode == 0 and "done 20" in r1.stdout
    import shutil

    shutil.rmtree(local)  # a new node: the local disk is empty
    r2 = run_supervise("--config", str(cfg), "--run-dir", str(run), "--gpu-every", "0", "--", sys.executable, "-c",
                       "import os; print(os.environ.get('SUPERVISE_RESTORED_FROM'))")
    restored = Path(r2.stdout.strip())
    assert restored.name == "step_000020" and (restored / ".metadata").exists()
    assert [e["attempt"] for e in events(run, "start")] == [1, 2]


def test_local_runs_are_not_requeued(tmp_path: Path) -> None:
    run = tmp_path / "run"
    p = start_supervise("--run-dir", str(run), "--requeue", "--gpu-every", "0", "--", "sleep", "30")
    wait_for(lambda: events(run, "spawn"), what="spawn")
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    rq = next(e for e in events(run, "stop-step") if e["step"] == "requeue")
    assert rq["skipped"] == "no scheduler to requeue with"
    assert p.returncode == 143
