"""Shared fixtures: every Mirror test runs against both backends (rsync, pure Python)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.emit import Events

BACKENDS = ["rsync", "python"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "rsync" and shutil.which("rsync") is None:
        pytest.skip("rsync is not on PATH (apt-get install rsync); the python backend still runs")
    return request.param


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Any]:
    """A small tmpfs we can fill or make read-only (needs root); skipped where mounting is refused."""
    mounts: list[Path] = []

    def mount(size: str) -> Path:
        mnt = tmp_path / f"mnt{len(mounts)}"
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
        mounts.append(mnt)
        return mnt

    def remount(mnt: Path, opts: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{opts}", str(mnt)], check=True)

    mount.remount = remount  # type: ignore[attr-defined]
    yield mount
    for m in reversed(mounts):
        subprocess.run(["umount", "-l", str(m)], capture_output=True)

