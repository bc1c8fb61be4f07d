"""The real ``supervise`` as a subprocess, in an environment no scheduler or outer supervise leaks into."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any supervise, Slurm or PBS variable (the machine
    the tests run on may itself be a job), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SLURM_", "PBS_"))}
    env.update(extra)
    return env


def supervise_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "supervisor", *args]


def start_supervise(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(supervise_argv(*args), env=clean_env(**(env or {})), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def run_supervise(*args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    p = start_supervise(*args, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"supervise did not finish in {timeout}s: {err}") from None
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@contextmanager
def killed_on_exit(p: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """Whatever the test's outcome, ``p`` is not left running: killed and reaped on the way out."""
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


def recorded(log: Path) -> list[str]:
    """Signal names a recorder (tests/helpers/recorder.py) saw, in order."""
    if not log.exists():
        return []
    return [line.split()[0] for line in log.read_text().splitlines() if line.strip()]


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
