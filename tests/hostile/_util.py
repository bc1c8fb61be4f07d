"""Shared pieces of the hostile-world corpus: the real `supervise`, real processes, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.wait import wait_for

TRAINER = ROOT / "tests" / "helpers" / "trainer.py"
TRACEBACK = "Traceback (most recent call last)"


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def kinds(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in events(run_dir) if e.get("kind") == kind]


def trainer(ckpt: Path, *extra: str) -> list[str]:
    return [sys.executable, str(TRAINER), str(ckpt), *extra]


def finish(p: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    """Wait for supervise with a bound; a bound that runs out is the failure it proves."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        p.kill()
        try:
            out, err = p.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # leftovers hold the pipes: the test's tag fixture kills them
            err = "(its stdout/stderr are held open by processes it left behind)"
        raise AssertionError(f"supervise still running after {timeout}s: {err[-2000:]}") from expired
    return p.returncode, out, err


def marked(tag: str) -> list[int]:
    """Live processes whose environment carries ``HOSTILE_TAG=tag`` (inherited by everything we start)."""
    needle = f"HOSTILE_TAG={tag}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            found.append(int(pid))
    return found


def kill_marked(tag: str) -> None:
    for pid in marked(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def none_left(tag: str, timeout: float = 10.0) -> None:
    wait_for(lambda: not marked(tag), timeout, f"no process of {tag} left", interval=0.1)


def fake_tool(bindir: Path, name: str, script: str) -> Path:
    """A stand-in executable on PATH (a shell script)."""
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


def env_with(tag: str, bindir: Path | None = None, **extra: str) -> dict[str, str]:
    env = {"HOSTILE_TAG": tag, **extra}
    if bindir is not None:
        env["PATH"] = f"{bindir}:{os.environ['PATH']}"
    return env


__all__ = ["TRACEBACK", "events", "finish", "kinds", "marked", "none_left", "kill_marked", "trainer", "fake_tool", "env_with"]
