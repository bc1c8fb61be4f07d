"""Contracts between the docs, the code and the tests (issue 13).

* every journal kind the code can emit is documented in a `| kind |` table of docs/, and every
  documented kind is emitted somewhere in the code;
* every notification event documented in docs/notify.md is one the notifier knows;
* every option in `supervise --help` is exercised by some test (and the few that nothing
  else exercises are exercised here, with their effect);
* and, after a whole test run, tests/conftest.py checks that every documented kind and
  notification was produced by a real `supervise` in some test (`contract_seen`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.support.contract import DOCS, documented
from tests.support.paths import ROOT
from tests.support.supervise import run_supervise


def emitted_in_code() -> set[str]:
    """Every kind the code journals: ``emit("kind", …)``, and the kinds of the leader↔node
    conversation, named in conduct/wire.py (``emit(wire.NODE_FLUSH, …)``; the leader's requests
    through ``Asking.ask(wire.NODES_FLUSH, …)``, which journals them)."""
    from supervisor.conduct import wire

    kinds: set[str] = set()
    for path in (ROOT / "supervisor").rglob("*.py"):
        text = path.read_text()
        kinds |= set(re.findall(r"""emit\(\s*["']([a-z][a-z0-9-]*)["']""", text))
        kinds |= {getattr(wire, name) for name in re.findall(r"""(?:emit|ask)\(\s*wire\.([A-Z_]+)\b""", text)}
    return kinds - {"kind"}  # journal.py's docstring: emit("kind", ...)


def test_every_kind_the_code_emits_is_documented_and_every_documented_kind_is_emitted() -> None:
    docs, code = documented("kind"), emitted_in_code()
    # Kinds emitted through a variable (GPU: gpu-lost/gpu-unsupported … via _gpu_event; journal writer names)
    dynamic = {k for k in docs if k.startswith("gpu-") or k.startswith("node-")}
    assert code - docs == set(), f"emitted but not documented: {sorted(code - docs)}"
    assert docs - code - dynamic == set(), f"documented but never emitted: {sorted(docs - code - dynamic)}"


def test_every_documented_notification_is_one_the_notifier_knows() -> None:
    from supervisor.notify import EVENTS

    docs = documented("event", [DOCS / "notify.md"])
    assert docs == set(EVENTS), (sorted(docs), sorted(EVENTS))


def run_flags() -> list[str]:
    out = subprocess.run([sys.executable, "-m", "supervisor", "--help"], capture_output=True, text=True, cwd=ROOT).stdout
    return sorted(set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z-]+)", out, re.M)))


def test_every_option_in_help_is_exercised_by_a_test() -> None:
    texts = [p.read_text() for p in (ROOT / "tests").rglob("*.py")]
    missing = [f for f in run_flags() if not any(f'"{f}"' in t for t in texts)]
    assert not missing, f"options no test exercises: {missing}"


# ---- the options nothing else exercises, with their effect --------------------------------


def test_help_and_version(tmp_path: Path) -> None:
    from supervisor import __version__

    r = run_supervise("--help", timeout=30)
    assert r.returncode == 0 and "--checkpoints LOCAL PERSISTENT" in r.stdout
    r = run_supervise("--version", timeout=30)
    assert r.returncode == 0 and __version__ in r.stdout


def test_launcher_overrides_detection(tmp_path: Path) -> None:
    r = run_supervise("--run-dir", str(tmp_path / "run"), "--gpu-every", "0", "--launcher", "generic", "--",
                      sys.executable, "-c", "pass", timeout=60)
    assert r.returncode == 0, r.stderr
    start = json.loads((tmp_path / "run" / "events.jsonl").read_text().splitlines()[0])
    assert start["launcher"] == "generic"


def test_quiet_and_verbose_set_what_reaches_stderr(tmp_path: Path) -> None:
    quiet = run_supervise("--run-dir", str(tmp_path / "q"), "--gpu-every", "0", "--quiet", "--", "true", timeout=60)
    normal = run_supervise("--run-dir", str(tmp_path / "n"), "--gpu-every", "0", "--", "true", timeout=60)
    verbose = run_supervise("--run-dir", str(tmp_path / "v"), "--gpu-every", "0", "--verbose", "--", "true", timeout=60)
    assert " INFO " not in quiet.stderr and " INFO " in normal.stderr
    assert len(verbose.stderr.splitlines()) >= len(normal.stderr.splitlines())  # lines, not characters: durations vary in width
    assert " INFO " in (tmp_path / "q" / "supervise.log").read_text()  # the log file keeps everything


def test_requeue_on_failure_makes_a_failed_training_a_requeue_candidate(tmp_path: Path) -> None:
    def requeue_step(run: Path, *flags: str) -> dict:
        run_supervise("--run-dir", str(run), "--gpu-every", "0", "--requeue", *flags, "--",
                      sys.executable, "-c", "raise SystemExit(3)", timeout=60)
        return [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()
                if '"step":"requeue"' in x][0]

    assert requeue_step(tmp_path / "a")["skipped"] == "not after child-failed"
    assert requeue_step(tmp_path / "b", "--requeue-on-failure")["skipped"] == "no scheduler to requeue with"


def test_notify_format_shapes_the_payload(tmp_path: Path) -> None:
    from tests.support.webhook import Server

    server = Server()
    try:
        r = run_supervise("--run-dir", str(tmp_path / "run"), "--gpu-every", "0", "--notify", server.url("slack"),
                          "--notify-format", "slack", "--", "true", timeout=60)
        assert r.returncode == 0
        body = json.loads(server.hits("slack")[0]["body"])
        assert set(body) == {"text"} and "started" in body["text"].lower()
    finally:
        server.close()


def test_nodes_makes_checkpoints_pairs_per_node(tmp_path: Path) -> None:
    r = run_supervise("check", "--run-dir", str(tmp_path / "run"), "--checkpoints", str(tmp_path / "l"),
                      str(tmp_path / "p"), "--nodes", "2", timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    events = subprocess.run([sys.executable, "-c", "from supervisor.config import build_config; "
                             f"c = build_config(flags={{}}, flag_pairs=[('checkpoint', {str(tmp_path / 'l')!r}, "
                             f"{str(tmp_path / 'p')!r})], flag_nodes='2', require_command=False, create_run_dir=False); "
                             "print(c.sync[0].nodes)"], capture_output=True, text=True, cwd=ROOT)
    assert events.stdout.strip() == "2"


def test_the_contract_walk_reads_only_real_journals(tmp_path: Path) -> None:
    """The end-of-run contract check walks every events.jsonl the tests left, and the tests plant
    hostile ones: a link to /dev/zero (read forever: the check was OOM-killed at 24 GB in CI), a
    FIFO (blocks), a directory. It reads the real journal and passes the others by."""
    import os

    from tests.support.contract import journal_kinds

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "events.jsonl").write_text('{"v":1,"kind":"start"}\n{"v":1,"kind":"publish"}\n')
    (tmp_path / "zero").mkdir()
    (tmp_path / "zero" / "events.jsonl").symlink_to("/dev/zero")
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "events.jsonl")
    (tmp_path / "dir" / "events.jsonl").mkdir(parents=True)
    assert journal_kinds(tmp_path) == ({"start", "publish"}, set())
