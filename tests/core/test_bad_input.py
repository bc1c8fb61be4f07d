"""A corpus of bad command lines and config files: each is exit 2, one line naming the
problem, and nothing started (the command would create a marker file; no run dir made)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.supervise import run_supervise

# (flags before --, config file text or None, env, words the one-line message must contain)
CASES = [
    ("no-command", [], None, {}, ["command", "missing", "--"]),
    ("command-without-dashdash", ["touch"], None, {}, ["after --"]),
    ("unknown-flag", ["--gracee", "5s"], None, {}, ["--gracee", "did you mean --grace"]),
    ("bad-duration-flag", ["--grace", "5 minutes"], None, {}, ["grace", "'5 minutes'", "90s"]),
    ("negative-duration", ["--sync-every", "-5"], None, {}, ["sync", "duration"]),
    ("bad-signal-flag", ["--stop-signal", "SIGFOO"], None, {}, ["stop_signal", "SIGFOO", "signal name"]),
    ("uncatchable-signal", ["--checkpoint-signal", "KILL"], None, {}, ["checkpoint_signal", "KILL", "caught"]),
    ("bad-forward-policy", ["--forward", "everyone"], None, {}, ["forward", "everyone", "launcher, group"]),
    ("bad-count", ["--max-requeues", "many"], None, {}, ["max_requeues", "many", "whole number"]),
    ("bad-stopped-status", ["--stopped-status", "maybe"], None, {}, ["stopped_status", "maybe", "auto, an exit status 0-255"]),
    ("bad-not-durable-status", ["--not-durable-status", "300"], None, {}, ["not_durable_status", "300", "0-255, or child"]),
    ("bad-gpu-every", ["--gpu-every", "0.01s"], None, {}, ["gpu_every", "0.1s"]),
    ("time-limit-and-deadline", ["--time-limit", "1h", "--deadline", "2030-01-01T00:00:00"], None, {}, ["time-limit", "deadline", "not both"]),
    ("bad-deadline", ["--deadline", "tomorrow"], None, {}, ["deadline", "tomorrow", "2026-11-21T18:00:00"]),
    ("bad-notify-url", ["--notify", "ftp://x"], None, {}, ["notify", "http"]),
    ("checkpoints-needs-two-paths", ["--checkpoints", "/tmp/a"], None, {}, ["--checkpoints", "expected 2"]),
    ("same-sync-path", ["--checkpoints", "/tmp/same", "/tmp/same"], None, {}, ["same path"]),
    ("nested-sync-path", ["--logs", "/tmp/x", "/tmp/x/mirror"], None, {}, ["inside the other"]),
    ("missing-config-file", ["--config", "/nonexistent/x.toml"], None, {}, ["--config", "/nonexistent/x.toml", "no such file"]),
    ("config-not-toml", [], "grace = = 5\n", {}, ["not valid TOML"]),
    ("config-unknown-key", [], 'grce = "5s"\n', {}, ["grce", "unknown key", "did you mean 'grace'"]),
    ("config-wrong-type", [], "requeue = 3\n", {}, ["requeue", "3", "true or false"]),
    ("config-bad-duration", [], 'grace = "soon"\n', {}, ["grace", "soon", "duration"]),
    ("config-unknown-table", [], "[synk]\nfrom = 'a'\n", {}, ["synk", "unknown table", "did you mean 'sync'"]),
    ("config-unset-variable", [], "[[sync]]\nfrom = '$SUPERVISE_TEST_UNSET/ckpt'\nto = '/tmp/b'\n", {}, ["sync[0].from", "$SUPERVISE_TEST_UNSET is not set"]),
    ("config-unset-variable-braces", [], "[[sync]]\nfrom = '/tmp/a'\nto = '${SUPERVISE_TEST_UNSET}/b'\n", {}, ["sync[0].to", "$SUPERVISE_TEST_UNSET is not set"]),
    ("config-sync-missing-to", [], "[[sync]]\nfrom = '/tmp/a'\n", {}, ["sync[0].to", "missing"]),
    ("config-sync-bad-kind", [], "[[sync]]\nfrom = '/tmp/a'\nto = '/tmp/b'\nkind = 'model'\n", {}, ["sync[0].kind", "model", "checkpoint, log"]),
    ("config-sync-unknown-key", [], "[[sync]]\nfrom = '/tmp/a'\nto = '/tmp/b'\nmarker = 'x'\n", {}, ["sync[0].marker", "did you mean 'markers'"]),
    ("config-sync-keep-zero", [], "[[sync]]\nfrom = '/tmp/a'\nto = '/tmp/b'\nkeep_local = 0\n", {}, ["keep_local", "1 or more"]),
    ("config-sync-peer-copies-two", [], "[[sync]]\nfrom = '/tmp/a'\nto = '/tmp/b'\nnodes = 2\npeer_copies = 2\n", {},
     ["sync[0].peer_copies", "2", "0 (off) or 1"]),
    # what a pair means is checked by the plan (sync/_checks.py), still naming the file that set it
    ("config-sync-unknown-profile", [], "[[sync]]\nfrom = '/tmp/a'\nto = '/tmp/b'\nprofile = 'keras'\n", {},
     ["sync a.profile", "keras", "hf-trainer", "supervise.toml"]),
    ("config-sync-duplicate-names", [], "[[sync]]\nname = 'x'\nfrom = '/tmp/a'\nto = '/tmp/b'\n"
     "[[sync]]\nname = 'x'\nfrom = '/tmp/c'\nto = '/tmp/d'\n", {}, ["sync x", "must be unique", "supervise.toml"]),
    ("config-sync-exclude-hides-marker", [], "[[sync]]\nfrom = '/tmp/a'\nto = '/tmp/b'\nprofile = 'hf-trainer'\n"
     "exclude = ['trainer_state.json']\n", {}, ["exclude", "trainer_state.json", "marker", "supervise.toml"]),
    ("config-sync-same-path", [], "[[sync]]\nfrom = '/tmp/same'\nto = '/tmp/same'\n", {}, ["same path", "supervise.toml"]),
    ("config-sync-empty-pattern", [], "[[sync]]\nfrom = '/tmp/a'\nto = '/tmp/b'\nexclude = ['/']\n", {},
     ["sync[0].exclude", "pattern"]),
    ("env-bad-duration", [], None, {"SUPERVISE_GRACE": "forever"}, ["grace", "forever", "SUPERVISE_GRACE"]),
    ("env-bad-bool", [], None, {"SUPERVISE_REQUEUE": "maybe"}, ["requeue", "maybe", "true or false"]),
    ("run-dir-is-a-file", ["--run-dir", "{file}"], None, {}, ["run_dir", "not a directory"]),
    ("run-dir-unwritable", ["--run-dir", "/proc/supervise-run"], None, {}, ["run_dir", "cannot be created"]),
    ("notify-url-is-not-shown", [], 'notify = ["https://hooks.example/T000/SECRET", 3]\n', {}, ["notify", "<hidden>"]),
]


@pytest.mark.parametrize(("name", "flags", "config", "env", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_rejected_before_anything_starts(tmp_path: Path, name: str, flags: list[str],
                                                      config: str | None, env: dict[str, str], words: list[str]) -> None:
    marker = tmp_path / "started"
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    args = [f.replace("{file}", str(a_file)) for f in flags]
    if config is not None:
        cfg = tmp_path / "supervise.toml"
        cfg.write_text(config)
        args = ["--config", str(cfg), *args]
    if "--run-dir" not in args:
        args = ["--run-dir", str(tmp_path / "run"), *args]
    tail = [] if name in ("no-command", "command-without-dashdash") else ["--", "touch", str(marker)]
    if name == "command-without-dashdash":
        args.append(str(marker))
    r = run_supervise(*args, *tail, env=env, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert "SECRET" not in r.stderr
    assert not marker.exists(), "the command must not have been started"
    assert not (tmp_path / "run").exists(), "no run directory is created for bad input"
    assert sorted(os.listdir(tmp_path)) == sorted(["a-file"] + (["supervise.toml"] if config is not None else []))
