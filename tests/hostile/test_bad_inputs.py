"""Bad inputs of a hostile world (issue 14): each is exit 2, one line on stderr naming the
problem, no traceback, nothing started (the command would create a marker file) and no run
directory made. Signals by number or that supervise cannot take, durations that are zero,
NaN, infinite or absurd, deadlines in the past, run directories others can write."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.hostile._util import TRACEBACK
from tests.support.supervise import run_supervise


# (name, flags before --, config file text or None, env, words the one line must contain)
SIGNALS = [
    ("checkpoint-signal-9", ["--checkpoint-signal", "9"], None, {}, ["checkpoint_signal", "by name, not by number"]),
    ("stop-signal-19", ["--stop-signal", "19"], None, {}, ["stop_signal", "by name, not by number"]),
    ("warn-signal-10", ["--warn-signal", "10"], None, {}, ["warn_signal", "by name"]),
    ("stop-signal-minus-15", ["--stop-signal", "-15"], None, {}, ["stop_signal", "signal name"]),
    ("checkpoint-signal-KILL", ["--checkpoint-signal", "SIGKILL"], None, {}, ["checkpoint_signal", "caught"]),
    ("stop-signal-STOP", ["--stop-signal", "STOP"], None, {}, ["stop_signal", "caught"]),
    ("warn-signal-SEGV", ["--warn-signal", "SEGV"], None, {}, ["warn_signal", "SIGSEGV", "not one supervise can take"]),
    ("checkpoint-signal-CHLD", ["--checkpoint-signal", "CHLD"], None, {}, ["checkpoint_signal", "SIGCHLD"]),
    ("warn-signal-CONT", ["--warn-signal", "CONT"], None, {}, ["warn_signal", "SIGCONT"]),
    ("warn-signal-TSTP", ["--warn-signal", "tstp"], None, {}, ["warn_signal", "SIGTSTP"]),
    ("checkpoint-signal-PIPE", ["--checkpoint-signal", "PIPE"], None, {}, ["checkpoint_signal", "SIGPIPE"]),
    ("stop-signal-BUS", ["--stop-signal", "BUS"], None, {}, ["stop_signal", "SIGBUS"]),
    ("warn-signal-TTIN", ["--warn-signal", "TTIN"], None, {}, ["warn_signal", "SIGTTIN"]),
    ("stop-signal-RTMIN", ["--stop-signal", "RTMIN"], None, {}, ["stop_signal", "SIGRTMIN"]),
    ("env-warn-signal-9", [], None, {"SUPERVISE_WARN_SIGNAL": "9"}, ["warn_signal", "SUPERVISE_WARN_SIGNAL"]),
    ("env-stop-signal-KILL", [], None, {"SUPERVISE_STOP_SIGNAL": "KILL"}, ["stop_signal", "caught"]),
    ("toml-checkpoint-signal-int", [], "checkpoint_signal = 10\n", {}, ["checkpoint_signal", "10", "by name"]),
    ("toml-stop-signal-bool", [], "stop_signal = true\n", {}, ["stop_signal", "True"]),
    ("toml-warn-signal-TTOU", [], 'warn_signal = "TTOU"\n', {}, ["warn_signal", "SIGTTOU"]),
    ("toml-stop-signal-ABRT", [], 'stop_signal = "SIGABRT"\n', {}, ["stop_signal", "SIGABRT"]),
]
DURATIONS = [
    ("sync-every-0", ["--sync-every", "0"], None, {}, ["sync_every", "above zero"]),
    ("sync-every-0s", ["--sync-every", "0s"], None, {}, ["sync_every", "above zero"]),
    ("sync-every-0m0s", ["--sync-every", "0m0s"], None, {}, ["sync_every", "above zero"]),
    ("checkpoint-timeout-0", ["--checkpoint-timeout", "0"], None, {}, ["checkpoint_timeout", "above zero"]),
    ("env-sync-every-0", [], None, {"SUPERVISE_SYNC_EVERY": "0"}, ["sync_every", "SUPERVISE_SYNC_EVERY"]),
    ("toml-sync-every-0.0", [], "sync_every = 0.0\n", {}, ["sync_every", "above zero"]),
    ("toml-notify-timeout-0", [], "notify_timeout = 0\n", {}, ["notify_timeout", "above zero"]),
    ("toml-sync-every-nan", [], "sync_every = nan\n", {}, ["sync_every", "finite"]),
    ("toml-grace-nan", [], "grace = nan\n", {}, ["grace", "finite"]),
    ("toml-grace-inf", [], "grace = inf\n", {}, ["grace", "finite"]),
    ("toml-checkpoint-timeout-minus-inf", [], "checkpoint_timeout = -inf\n", {}, ["checkpoint_timeout", "finite"]),
    ("toml-gpu-every-nan", [], "gpu_every = nan\n", {}, ["gpu_every", "finite"]),
    ("toml-hang-after-1e308", [], "hang_after = 1e308\n", {}, ["hang_after", "ten years"]),
    ("toml-restart-backoff-1e308", [], "restart_backoff = 1e308\n", {}, ["restart_backoff", "ten years"]),
    ("toml-time-limit-nan", [], "time_limit = nan\n", {}, ["time_limit", "finite"]),
    ("time-limit-absurd", ["--time-limit", "99999999999999h"], None, {}, ["time_limit", "ten years"]),
    ("time-limit-beyond-any-scheduler", ["--time-limit", "8785h"], None, {}, ["time_limit", "366 days"]),
    ("env-time-limit-absurd", [], None, {"SUPERVISE_TIME_LIMIT": "99999999999999h"}, ["time_limit", "ten years"]),
    ("hang-after-absurd", ["--hang-after", "9999999h"], None, {}, ["hang_after", "ten years"]),
    ("warn-before-absurd", ["--warn-before", "99999999999h"], None, {}, ["warn_before"]),
    ("grace-1e400", ["--grace", "1e400"], None, {}, ["grace", "duration"]),
    ("toml-restart-backoff-nan-text", [], 'restart_backoff = "nan"\n', {}, ["restart_backoff", "duration"]),
]
DEADLINES = [
    ("deadline-in-the-past", ["--deadline", "2000-01-01T00:00:00"], None, {}, ["deadline", "has passed"]),
    ("deadline-unix-1", ["--deadline", "1"], None, {}, ["deadline", "has passed"]),
    ("deadline-unix-0", ["--deadline", "0"], None, {}, ["deadline", "has passed"]),
    ("deadline-far-future", ["--deadline", "99999999999999"], None, {}, ["deadline", "ten years"]),
    ("toml-deadline-datetime-past", [], "deadline = 1970-01-02T00:00:00Z\n", {}, ["deadline", "has passed"]),
    ("env-deadline-past", [], None, {"SUPERVISE_DEADLINE": "2001-09-09T01:46:40Z"}, ["deadline", "SUPERVISE_DEADLINE"]),
    ("toml-deadline-nan", [], "deadline = nan\n", {}, ["deadline"]),
]
OTHERS = [
    ("max-restarts-negative", ["--max-restarts", "-1"], None, {}, ["max_restarts", "whole number"]),
    ("toml-sync-nice-20", [], "sync_nice = 20\n", {}, ["sync_nice", "0 to 19"]),
    ("sync-streams-0", ["--sync-streams", "0"], None, {}, ["sync_streams", "1 to 64"]),
    ("sync-streams-65", ["--sync-streams", "65"], None, {}, ["sync_streams", "1 to 64"]),
    ("sync-streams-two", ["--sync-streams", "two"], None, {}, ["sync_streams", "1 to 64"]),
    ("toml-sync-streams-minus-1", [], "sync_streams = -1\n", {}, ["sync_streams", "1 to 64"]),
    ("toml-sync-streams-float", [], "sync_streams = 2.5\n", {}, ["sync_streams", "1 to 64"]),
    ("toml-sync-streams-bool", [], "sync_streams = true\n", {}, ["sync_streams", "1 to 64"]),
    ("env-sync-streams-1e3", [], None, {"SUPERVISE_SYNC_STREAMS": "1000"}, ["sync_streams", "SUPERVISE_SYNC_STREAMS"]),
    ("launcher-unknown", ["--launcher", "nope"], None, {}, ["launcher", "nope"]),
    ("gpu-backend-unknown", ["--gpu-backend", "cuda"], None, {}, ["gpu_backend", "cuda"]),
    ("toml-sync-from-int", [], "[[sync]]\nfrom = 3\nto = '/tmp/b'\n", {}, ["sync[0].from"]),
    ("notify-javascript", ["--notify", "javascript:alert(1)"], None, {}, ["notify", "http"]),
    ("toml-grace-days", [], 'grace = "10d"\n', {}, ["grace", "10d"]),
    ("env-grace-over-a-day", [], None, {"SUPERVISE_GRACE": "25h"}, ["grace", "24h"]),
    ("forward-unknown", ["--forward", "nowhere"], None, {}, ["forward", "nowhere"]),
    ("warn-before-nan-text", ["--warn-before", "nan"], None, {}, ["warn_before", "auto"]),
]
RUN_DIRS = [
    ("run-dir-in-world-writable-parent", ["--run-dir", "{ww}/run"], None, {}, ["run_dir", "without the sticky bit"]),
    ("run-dir-is-world-writable-itself", ["--run-dir", "{ww}"], None, {}, ["run_dir", "writable by every user", "777"]),
    ("run-dir-sticky-but-not-ours", ["--run-dir", "{sticky_theirs}"], None, {}, ["run_dir", "writable by every user"]),
]
CASES = SIGNALS + DURATIONS + DEADLINES + OTHERS + RUN_DIRS


def test_the_corpus_has_at_least_60_bad_inputs() -> None:
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("name", "flags", "config", "env", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line_and_starts_nothing(tmp_path: Path, name: str, flags: list[str],
                                                           config: str | None, env: dict[str, str],
                                                           words: list[str]) -> None:
    marker = tmp_path / "started"
    ww = tmp_path / "ww"
    ww.mkdir()
    ww.chmod(0o777)  # world-writable, not sticky: anyone could plant events.jsonl -> ~/.bashrc
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    os.chown(sticky, 65534, 65534) if os.geteuid() == 0 else None  # someone else's /tmp-like directory
    if os.geteuid() != 0 and "sticky_theirs" in " ".join(flags):
        pytest.skip("needs root to give the directory to another user")
    before = {p.name for p in tmp_path.iterdir()}
    args = [f.replace("{ww}", str(ww)).replace("{sticky_theirs}", str(sticky)) for f in flags]
    if config is not None:
        cfg = tmp_path / "supervise.toml"
        cfg.write_text(config)
        before.add(cfg.name)
        args = ["--config", str(cfg), *args]
    if "--run-dir" not in args:
        args = ["--run-dir", str(tmp_path / "run"), *args]
    r = run_supervise(*args, "--", "touch", str(marker), env=env, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert TRACEBACK not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert not marker.exists(), "the command must not have been started"
    assert {p.name for p in tmp_path.iterdir()} == before, "nothing is created for bad input"
    assert os.listdir(ww) == [] and os.listdir(sticky) == []
    assert stat.S_IMODE(os.stat(ww).st_mode) == 0o777
