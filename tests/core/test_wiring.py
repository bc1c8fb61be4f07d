"""Promises that fell through the seams between the parts (issue 13), each through the real
`supervise`: the end is notified, `--stop-signal` is what the stop sends, and an error a part
would find is found by the plan first: exit 2, one line, nothing started."""

from __future__ import annotations

import json
import shutil
import signal
import sys
from pathlib import Path

import pytest

from supervisor.journal import read_journal
from tests.support.paths import RECORDER
from tests.support.supervise import recorded, run_supervise, start_supervise
from tests.support.wait import wait_for
from tests.support.webhook import Server


@pytest.mark.parametrize("code, event", [(0, "finished"), (3, "failed")])
def test_the_end_of_a_run_is_notified(server: Server, tmp_path: Path, code: int, event: str) -> None:
    r = run_supervise("--run-dir", str(tmp_path / "run"), "--gpu-every", "0", "--notify", server.url("json"),
                      "--", sys.executable, "-c", f"raise SystemExit({code})", timeout=60)
    assert r.returncode == code, r.stderr
    sent = [json.loads(h["body"])["event"] for h in server.hits("json")]
    assert sent == ["start", event]


def test_a_preemption_is_notified(server: Server, tmp_path: Path) -> None:
    log = tmp_path / "sig.log"
    p = start_supervise("--run-dir", str(tmp_path / "run"), "--gpu-every", "0", "--notify", server.url("json"),
                        "--", sys.executable, str(RECORDER), str(log))
    wait_for(lambda: "ready" in recorded(log), what="the training's handlers")
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    assert [json.loads(h["body"])["event"] for h in server.hits("json")] == ["start", "preempted"]


def test_stop_signal_is_what_the_stop_sequence_sends(tmp_path: Path) -> None:
    log = tmp_path / "sig.log"
    p = start_supervise("--run-dir", str(tmp_path / "run"), "--gpu-every", "0", "--stop-signal", "INT",
                        "--", sys.executable, str(RECORDER), str(log))
    wait_for(lambda: "ready" in recorded(log), what="the training's handlers")
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    assert [s for s in recorded(log) if s in ("SIGTERM", "SIGINT", "SIGQUIT")] == ["SIGINT"]


def _toml(tmp_path: Path, body: str) -> Path:
    path = tmp_path / f"job{len(list(tmp_path.glob('job*.toml')))}.toml"
    path.write_text(body)
    return path


def _bad_inputs(tmp_path: Path) -> dict[str, list[str]]:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    afile = tmp_path / "afile"
    afile.write_text("x")
    urls = tmp_path / "urls"
    urls.write_text("https://example.invalid/hook\nftp://nope\n")
    latin = tmp_path / "latin1.toml"
    latin.write_bytes(b"grace = \"30s\" # caf\xe9\n")
    return {
        "overlapping persistent sides": ["--checkpoints", str(a), str(c), "--logs", str(b), str(c / "tb")],
        "a local side that is a file": ["--checkpoints", str(afile), str(c)],
        "keep_local on a log pair": ["--config", str(_toml(tmp_path, f'[[sync]]\nkind = "log"\nfrom = "{a}"\nto = "{c}"\nkeep_local = 2\n'))],
        "notify file that is missing": ["--notify", f"@{tmp_path / 'missing'}"],
        "notify file with a non-http line": ["--notify", f"@{urls}"],
        "grace = nan": ["--config", str(_toml(tmp_path, "grace = nan\n"))],
        "a config file that is not UTF-8": ["--config", str(latin)],
        "a NUL byte in a path": ["--config", str(_toml(tmp_path, f'[[sync]]\nfrom = "{a}\\u0000x"\nto = "{c}"\n'))],
    }


@pytest.mark.parametrize("case", ["overlapping persistent sides", "a local side that is a file", "keep_local on a log pair",
                                  "notify file that is missing", "notify file with a non-http line", "grace = nan",
                                  "a config file that is not UTF-8", "a NUL byte in a path"])
def test_an_error_a_part_would_find_is_exit_2_with_nothing_started(tmp_path: Path, case: str) -> None:
    marker = tmp_path / "started"
    args = _bad_inputs(tmp_path)[case]
    r = run_supervise("--run-dir", str(tmp_path / "run"), *args, "--", "touch", str(marker), timeout=30)
    assert r.returncode == 2, (case, r.returncode, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert not marker.exists()
    assert not read_journal(tmp_path / "run").events


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not on PATH")
def test_rsync_backend_without_rsync_is_exit_2(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path / "empty")}
    (tmp_path / "empty").mkdir()
    marker = tmp_path / "started"
    r = run_supervise("--run-dir", str(tmp_path / "run"), "--checkpoints", str(tmp_path / "a"), str(tmp_path / "c"),
                      "--sync-backend", "rsync", "--", "/usr/bin/touch", str(marker), timeout=30, env=env)
    assert r.returncode == 2 and "rsync" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not marker.exists()


def test_check_says_not_ready_for_what_the_run_would_refuse(tmp_path: Path) -> None:
    c = tmp_path / "c"
    r = run_supervise("check", "--run-dir", str(tmp_path / "run"), "--checkpoints", str(tmp_path / "a"), str(c),
                      "--logs", str(tmp_path / "b"), str(c / "tb"), timeout=30)
    assert r.returncode == 2 and "overlaps" in r.stdout
