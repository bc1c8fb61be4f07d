"""Destinations that fail (read-only, full), a supervisor killed mid-transfer, sources that
vanish under the copy, and flushes cut short: the destination only ever holds complete
checkpoints, failures are journaled and retried, and the mirror keeps running."""

from __future__ import annotations

import filecmp
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from supervisor.config import SyncPair
from supervisor.sync import Mirror
from tests.support.checkpoints import problems, write_checkpoint
from tests.support.wait import wait_for_async

from ._util import many_files, running, visible

REPO = Path(__file__).resolve().parents[2]


async def _training(src: Path) -> subprocess.Popen:
    """A stand-in for the training: a child process that keeps running and writing."""
    code = ("import time,sys,pathlib\n"
            "p=pathlib.Path(sys.argv[1])/'train.log'\n"
            "while True:\n  p.open('a').write('step\\n'); time.sleep(0.1)\n")
    return subprocess.Popen([sys.executable, "-c", code, str(src)])


@pytest.mark.asyncio
async def test_read_only_destination_is_retried_and_recovers(tmp_path, backend, events, tmpfs):
    mnt = tmpfs("16m")
    src, dst = tmp_path / "local", mnt / "ckpt"
    dst.mkdir()
    tmpfs.remount(mnt, "ro")
    src.mkdir()
    train = await _training(tmp_path)
    try:
        mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, sync_every=3600, backend=backend,
                        retry_base=0.2, retry_cap=0.8)
        async with running(mirror):
            write_checkpoint(src, "step_001", style="dcp", shards=2, size=100_000)
            await wait_for_async(lambda: len(events.of("sync-failed")) >= 3, 20, what="three failed attempts")
            fails = events.of("sync-failed")
            assert {f["errno"] for f in fails} == {"EROFS"}
            assert [f["retry_in"] for f in fails[:3]] == [0.2, 0.4, 0.8]  # capped exponential backoff
            assert any("step_001 (complete, not yet on persistent storage)" in p for p in mirror.pending())
            assert train.poll() is None, "the training must keep running"
            tmpfs.remount(mnt, "rw")
            await wait_for_async(lambda: mirror.published >= 1, 20, what="publish after the destination came back")
        assert events.of("sync-recovered")
        assert problems(dst, style="dcp", shards=2, size=100_000) == []
        assert visible(dst) == ["step_001"]
        assert train.poll() is None
    finally:
        train.kill()
        train.wait()


@pytest.mark.asyncio
async def test_full_destination_is_retried_and_recovers(tmp_path, backend, events, tmpfs):
    mnt = tmpfs("4m")
    src, dst = tmp_path / "local", mnt / "ckpt"
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, sync_every=3600, backend=backend,
                    retry_base=0.2, retry_cap=0.5)
    src.mkdir()
    async with running(mirror):
        write_checkpoint(src, "step_001", style="dcp", shards=3, size=2 << 20)  # 6 MB into 4 MB
        await wait_for_async(lambda: len(events.of("sync-failed")) >= 2, 30, what="two failed attempts")
        assert {f["errno"] for f in events.of("sync-failed")} == {"ENOSPC"}
        assert visible(dst) == []  # nothing torn became visible
        await wait_for_async(lambda: not any(n.startswith(".supervise-staging") for n in os.listdir(dst)), 10,
                             what="failed staging removed, its space given back")
        tmpfs.remount(mnt, "size=32m")
        await wait_for_async(lambda: mirror.published >= 1, 30, what="publish once there is room")
    assert problems(dst, style="dcp", shards=3, size=2 << 20) == []
    assert events.of("sync-recovered")


def test_sigkill_mid_transfer_leaves_only_complete_checkpoints(tmp_path, backend, events):
    src, dst = tmp_path / "local", tmp_path / "persistent"
    for k in (1, 2, 3):
        d = src / f"step_{k:03d}"
        many_files(d, 1500, size=4096)
        (d / ".metadata").write_bytes(b"m")
    proc = subprocess.Popen([sys.executable, "-m", "tests.sync._runner", str(src), str(dst), backend],
                            cwd=REPO, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        seen_staging = False
        for _ in range(200_000):
            if dst.exists() and any(n.startswith(".supervise-staging-") for n in os.listdir(dst)):
                seen_staging = True
                break
        assert seen_staging, "never caught a transfer in progress"
        os.kill(proc.pid, signal.SIGKILL)  # the supervisor only; its copier may run on orphaned
        proc.wait(10)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    staged = [n for n in os.listdir(dst) if n.startswith(".") and n != ".supervise"]  # .supervise: the manifests
    assert staged and all(n.startswith(".supervise-") for n in staged)
    for name in visible(dst):  # whatever was published is whole
        assert sorted(os.listdir(dst / name)) == sorted(os.listdir(src / name)), name
        assert all((dst / name / f).stat().st_size == (src / name / f).stat().st_size for f in os.listdir(src / name))
    assert len(visible(dst)) < 3, "the kill came after everything was published: the test proved nothing"

    async def next_run() -> None:
        mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, sync_every=3600, backend=backend)
        async with running(mirror):
            await wait_for_async(lambda: visible(dst) == ["step_001", "step_002", "step_003"], 60, what="all published")
            await wait_for_async(lambda: not [n for n in os.listdir(dst) if n.startswith(".") and n != ".supervise"], 10,
                                 what="staging cleaned")

    anyio.run(next_run)
    assert events.of("sync-cleanup")


@pytest.mark.asyncio
async def test_checkpoint_rotated_away_during_copy_is_not_a_failure(tmp_path, backend, events):
    src, dst = tmp_path / "local", tmp_path / "persistent"
    d = src / "step_001"
    many_files(d, 3000)
    (d / ".metadata").write_bytes(b"m")
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, backend=backend)
    result: dict = {}

    async def flush() -> None:
        result.update(await mirror.flush("test"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(flush)
        await wait_for_async(lambda: (dst / ".supervise-staging-step_001").exists(), 10, "copy under way", interval=0.001)
        await anyio.to_thread.run_sync(shutil.rmtree, d)
    assert not events.of("sync-failed"), events.of("sync-failed")
    assert result["pairs"]["c"]["ok"]
    assert visible(dst) == [] and mirror.published == 0
    assert not (dst / ".supervise-staging-step_001").exists()


@pytest.mark.asyncio
async def test_rotated_log_files_are_not_a_failure(tmp_path, backend, events):
    src, dst = tmp_path / "logs", tmp_path / "plogs"
    many_files(src, 3000, size=512)
    mirror = Mirror([SyncPair("l", "log", src, dst)], emit=events, backend=backend)
    result: dict = {}

    async def flush() -> None:
        result.update(await mirror.flush("test"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(flush)
        await wait_for_async(lambda: dst.exists() and len(os.listdir(dst)) > 10, 10, "copy under way", interval=0.001)
        for i in range(1500, 3000):
            (src / f"f{i:05d}").unlink()
    assert not events.of("sync-failed"), events.of("sync-failed")
    assert result["pairs"]["l"]["ok"]


@pytest.mark.asyncio
async def test_flush_cut_short_leaves_the_destination_consistent(tmp_path, backend, events):
    src, dst = tmp_path / "local", tmp_path / "persistent"
    d = src / "step_001"
    many_files(d, 3000)
    (d / ".metadata").write_bytes(b"m")
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, backend=backend)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mirror.flush, "deadline")
        await wait_for_async(lambda: (dst / ".supervise-staging-step_001").exists(), 10, "copy under way", interval=0.001)
        tg.cancel_scope.cancel()
    assert visible(dst) == []
    assert any("step_001" in p for p in mirror.pending())
    staging = str(dst / ".supervise-staging-step_001")
    alive = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, staging)]
    assert alive == [], "a copier is still writing after the flush was cancelled"
    result = await mirror.flush("again")
    assert result["ok"] and visible(dst) == ["step_001"] and mirror.pending() == []


def _cmdline_has(pid: str, needle: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return needle.encode() in f.read()
    except OSError:
        return False


@pytest.mark.asyncio
async def test_copy_cut_short_in_staging_is_redone(tmp_path, backend, events):
    """A new staging directory is the temp name, so its files are written in place (a rename
    per file is a third of a small-file copy): a copy cut short leaves a short file at its
    final name inside staging, and the next pass must redo it, not publish it."""
    src, dst = tmp_path / "local", tmp_path / "persistent"
    d = src / "step_001"
    d.mkdir(parents=True)
    size = 512 << 20
    block = os.urandom(1 << 20)
    with open(d / "model.bin", "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
    (d / ".metadata").write_bytes(b"m")
    shard = dst / ".supervise-staging-step_001" / "model.bin"

    def partial() -> bool:
        try:
            return 0 < shard.stat().st_size < size
        except FileNotFoundError:
            return False

    mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, backend=backend, nice=0, ionice="none")
    async with anyio.create_task_group() as tg:
        tg.start_soon(mirror.flush, "deadline")
        await wait_for_async(partial, 30, "model.bin half-written at its own name in staging", interval=0.0005)
        tg.cancel_scope.cancel()
    assert visible(dst) == [] and 0 < shard.stat().st_size < size
    result = await mirror.flush("again")
    assert result["ok"] and visible(dst) == ["step_001"]
    assert filecmp.cmp(d / "model.bin", dst / "step_001" / "model.bin", shallow=False)
    assert (dst / "step_001" / "model.bin").stat().st_mtime_ns == (d / "model.bin").stat().st_mtime_ns


@pytest.mark.asyncio
async def test_leftover_staging_is_verified_before_publishing(tmp_path, backend, events):
    """A killed run's staging holds a file the checkpoint no longer has: it must not be published."""
    src, dst = tmp_path / "local", tmp_path / "persistent"
    write_checkpoint(src, "step_001", style="dcp", shards=2, size=1000)
    stale = dst / ".supervise-staging-step_001"
    write_checkpoint(dst, ".supervise-staging-step_001", style="dcp", shards=2, size=1000)
    (stale / "shard_9.bin").write_bytes(b"from an older attempt")
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, backend=backend)
    assert (await mirror.flush("test"))["ok"]
    assert sorted(os.listdir(dst / "step_001")) == sorted(os.listdir(src / "step_001"))
    assert problems(dst, style="dcp", shards=2, size=1000) == []


def test_a_pointer_that_cannot_be_written_leaves_no_staging_file(tmp_path: Path) -> None:
    """A full persistent side while the pointer (``latest``) is written: the write fails, and its
    temp name must not stay behind (CI, stop 28: a chaos trial with the disk full through the
    end found ``.supervise-staging-latest`` after a clean end). A file size limit of 0 makes the
    write fail the way ENOSPC does, without root for a small tmpfs."""
    code = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from supervisor.sync import _fsops\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))\n"
        "try:\n"
        "    _fsops.write_atomic(Path(sys.argv[1]) / 'latest', b'step_000008', 0, fsync=True)\n"
        "except OSError as e:\n"
        "    print('failed', e.errno)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("failed"), (r.stdout, r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.asyncio
async def test_a_stop_waiting_for_its_checkpoint_does_not_wait_out_the_backoff(tmp_path, backend, events, tmpfs):
    """A failed pass backs off (60 s here) and a file event meanwhile waits for the retry;
    while a stop waits for its checkpoint (``Mirror.hurry``) none does, and the answer comes
    back with when it was completed and published (what the stop reads its rhythm from)."""
    mnt = tmpfs("16m")
    src, dst = tmp_path / "local", mnt / "ckpt"
    dst.mkdir()
    tmpfs.remount(mnt, "ro")
    src.mkdir()
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, sync_every=3600, backend=backend,
                    retry_base=60.0, retry_cap=60.0)
    async with running(mirror):
        write_checkpoint(src, "step_001", style="dcp", shards=2, size=10_000)
        await wait_for_async(lambda: events.of("sync-failed"), 20, what="a failed pass, then 60 s of backoff")
        tmpfs.remount(mnt, "rw")
        write_checkpoint(src, "step_002", style="dcp", shards=2, size=10_000)
        await anyio.sleep(1.5)
        assert mirror.published == 0, "the file events wait out the backoff"
        tmpfs.remount(mnt, "ro")
        asked = time.time()
        with mirror.hurry("stop-checkpoint"):
            await wait_for_async(lambda: len(events.of("sync-failed")) >= 2, 20, what="the stop's pass, failed: backing off again")
            tmpfs.remount(mnt, "rw")
            write_checkpoint(src, "step_003", style="dcp", shards=2, size=10_000)
            with anyio.fail_after(10):
                got = await mirror.wait_completed(asked, lambda done, since: done is not None and done >= since)
    assert got.ident is not None and got.ident[0] == "step_003"
    assert got.completed_at is not None and asked <= got.completed_at <= got.published_at <= time.time()
    assert mirror.publishes[0] == got and got.saved_at == got.completed_at  # the newest first
    assert events.of("sync-failed")[1]["trigger"] == "request:stop-checkpoint"
