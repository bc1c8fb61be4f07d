"""Restore before spawn, TensorBoard logs growing in place, retention, triggers, checks."""

from __future__ import annotations

import os
import time

import anyio
import pytest

from supervisor.config import SyncPair
from supervisor.errors import ConfigError
from supervisor.proctree import descendants
from supervisor.sync import Mirror
from supervisor.sync._pair import LOG_BATCH
from tests.support.checkpoints import problems, write_checkpoint
from tests.support.wait import wait_for_async

from ._util import many_files, running, visible


# ---- restore ------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_restore_picks_newest_complete_checkpoint(tmp_path, backend, events):
    src, dst = tmp_path / "local", tmp_path / "persistent"
    for k in (1, 3, 10):
        write_checkpoint(dst, f"step_{k:03d}", style="dcp", shards=2, size=5000)
    (dst / "step_020").mkdir()  # a torn copy from the old rsync loop: no marker
    (dst / "step_020" / "shard_0.bin").write_bytes(b"half")
    write_checkpoint(dst, ".supervise-staging-step_030", style="dcp", shards=2, size=5000)  # a killed run's staging
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst, restore=True)], emit=events, backend=backend)
    got = await mirror.restore()
    assert got == src / "step_010"
    assert visible(src) == ["step_010"]
    assert problems(src, style="dcp", shards=2, size=5000) == []
    (ev,) = events.of("restore")
    assert ev["checkpoint"] == "step_010" and ev["copied"] and ev["files"] >= 3
    # a second attempt on the same node already has it: nothing copied
    again = await mirror.restore()
    assert again == got and events.of("restore")[-1]["copied"] is False


@pytest.mark.asyncio
async def test_restore_follows_the_pointer_and_brings_it_along(tmp_path, backend, events):
    src, dst = tmp_path / "local", tmp_path / "persistent"
    for k in (1, 2, 3):
        write_checkpoint(dst, f"global_step{k}", style="quiet", shards=1, size=100)
    (dst / "latest").write_text("global_step2")  # global_step3 was never finished
    mirror = Mirror([SyncPair("ds", "checkpoint", src, dst, restore=True)], emit=events, backend=backend)
    assert await mirror.restore() == src / "global_step2"
    assert (src / "latest").read_text() == "global_step2"
    assert visible(src) == ["global_step2", "latest"]


@pytest.mark.asyncio
async def test_restore_with_nothing_to_restore(tmp_path, backend, events):
    mirror = Mirror([SyncPair("c", "checkpoint", tmp_path / "l", tmp_path / "p", restore=True),
                     SyncPair("n", "checkpoint", tmp_path / "l2", tmp_path / "p2")], emit=events, backend=backend)
    assert await mirror.restore() is None
    assert events.of("restore")[0]["checkpoint"] is None


# ---- logs -----------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_tensorboard_event_file_grows_in_place(tmp_path, backend, events):
    src, dst = tmp_path / "tb", tmp_path / "ptb"
    ev = src / "run1" / "events.out.tfevents.1700000000.node1"
    ev.parent.mkdir(parents=True)
    ev.write_bytes(b"A" * 1000)
    mirror = Mirror([SyncPair("tb", "log", src, dst)], emit=events, sync_every=3600, backend=backend)
    target = dst / "run1" / ev.name
    async with running(mirror):
        await wait_for_async(lambda: target.exists() and target.stat().st_size == 1000, 10, what="first copy")
        inode = target.stat().st_ino
        with open(target, "rb") as reader:  # TensorBoard keeps the file open and reads on
            assert reader.read() == b"A" * 1000
            for chunk in (b"B" * 500, b"C" * 300):
                with open(ev, "ab") as f:
                    f.write(chunk)
                await wait_for_async(lambda: target.stat().st_size == ev.stat().st_size, 10 + LOG_BATCH,
                                     what="watcher-driven growth (batched)")
            assert reader.read() == b"B" * 500 + b"C" * 300  # new points through the old handle
        assert target.stat().st_ino == inode
    assert target.read_bytes() == ev.read_bytes()
    assert (await mirror.flush("end"))["ok"] and mirror.pending() == []


@pytest.mark.asyncio
async def test_log_pending_lists_what_is_behind(tmp_path, backend, events, tmpfs):
    mnt = tmpfs("8m")
    src, dst = tmp_path / "tb", mnt / "logs"
    src.mkdir()
    (src / "a.log").write_bytes(b"x" * 100)
    mirror = Mirror([SyncPair("tb", "log", src, dst)], emit=events, backend=backend)
    assert (await mirror.flush("one"))["ok"]
    (src / "a.log").write_bytes(b"x" * 300)
    tmpfs.remount(mnt, "ro")
    result = await mirror.flush("two")
    assert not result["ok"] and result["pairs"]["tb"]["errno"] == "EROFS"
    assert any("a.log" in p or "failed" in p for p in mirror.pending())


# ---- retention, triggers ----------------------------------------------------------------

@pytest.mark.asyncio
async def test_keep_local_deletes_only_verified_older_checkpoints(tmp_path, backend, events):
    src, dst = tmp_path / "local", tmp_path / "persistent"
    for k in range(1, 5):
        write_checkpoint(src, f"step_{k:03d}", style="dcp", shards=1, size=1000)
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst, keep_local=2)], emit=events, backend=backend)
    await mirror.flush("test")
    assert visible(dst) == ["step_001", "step_002", "step_003", "step_004"]
    assert problems(dst, style="dcp", shards=1, size=1000) == []
    assert visible(src) == ["step_003", "step_004"]
    assert events.of("retention")[0]["removed"] == ["step_002", "step_001"]


@pytest.mark.asyncio
async def test_keep_local_keeps_everything_while_the_destination_fails(tmp_path, backend, events, tmpfs):
    mnt = tmpfs("8m")
    src, dst = tmp_path / "local", mnt / "c"
    dst.mkdir()
    tmpfs.remount(mnt, "ro")
    for k in range(1, 5):
        write_checkpoint(src, f"step_{k:03d}", style="dcp", shards=1, size=1000)
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst, keep_local=1)], emit=events, backend=backend)
    await mirror.flush("test")
    assert len(visible(src)) == 4 and not events.of("retention")


@pytest.mark.asyncio
async def test_requests_during_a_transfer_coalesce_into_one_more(tmp_path, backend, events):
    src, dst = tmp_path / "local", tmp_path / "persistent"
    src.mkdir()
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, sync_every=3600, backend=backend)
    async with running(mirror):
        await wait_for_async(lambda: mirror.pending() == [], 10, what="first pass")
        build = tmp_path / "build" / "step_001"
        many_files(build, 3000)
        (build / ".metadata").write_bytes(b"m")
        os.rename(build, src / "step_001")  # appears whole: the watcher starts a pass
        await wait_for_async(lambda: (dst / ".supervise-staging-step_001").exists(), 20, "transfer under way", interval=0.001)
        for i in range(10):
            mirror.request(f"r{i}")
        await wait_for_async(lambda: any(e["kind"] == "sync" and e["trigger"].startswith("request") for e in events), 20,
                             what="the coalesced pass")
        await anyio.sleep(0.5)  # would-be extra passes have time to show up
    passes = [e for e in events.of("sync") if e["trigger"].startswith("request")]
    assert len(passes) == 1, passes
    assert passes[0]["trigger"] == "request:r0"
    assert mirror.published == 1


@pytest.mark.asyncio
async def test_published_count_and_last_activity(tmp_path, backend, events):
    src, dst = tmp_path / "local", tmp_path / "persistent"
    src.mkdir()
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, sync_every=3600, backend=backend)
    assert mirror.last_activity() is None and mirror.backend_name == backend
    async with running(mirror):
        before = mirror.published
        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            async def write() -> None:
                await anyio.sleep(0.2)
                await anyio.to_thread.run_sync(lambda: write_checkpoint(src, "step_001", style="dcp", size=100))
            tg.start_soon(write)
            await wait_for_async(lambda: mirror.published > before, 20, what="the checkpoint published")
    assert mirror.published == before + 1
    assert mirror.last_activity() is not None and mirror.last_activity() >= t0


# ---- checks ---------------------------------------------------------------------------

def test_check_rejects_bad_pairs_and_warns_about_doubtful_ones(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()

    def check(*pairs: SyncPair, **kw) -> list[str]:
        return Mirror(pairs, emit=lambda *a, **k: {}, **kw).check()

    with pytest.raises(ConfigError, match="same path"):
        check(SyncPair("x", "checkpoint", a, a))
    with pytest.raises(ConfigError, match="inside the other"):
        check(SyncPair("x", "checkpoint", a, a / "sub"))
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="not a directory"):
        check(SyncPair("x", "checkpoint", a, tmp_path / "file"))
    with pytest.raises(ConfigError, match="overlaps"):
        check(SyncPair("x", "checkpoint", a, b), SyncPair("y", "log", tmp_path / "c", b / "logs"))
    warnings = check(SyncPair("x", "checkpoint", tmp_path / "missing", b))
    assert any("does not exist yet; it will be created at start" in w for w in warnings)
    assert any("node-local" in w or "not a shared filesystem" in w for w in warnings)
    monkeypatch.setenv("PATH", str(tmp_path))  # no rsync here
    with pytest.raises(ConfigError, match="rsync is not on PATH"):
        check(SyncPair("x", "checkpoint", a, b), backend="rsync")
    assert Mirror([], emit=lambda *a, **k: {}, backend="auto").backend_name == "python"


@pytest.mark.asyncio
async def test_missing_source_is_created_at_start(tmp_path, backend, events):
    src, dst = tmp_path / "later" / "ckpt", tmp_path / "persistent"
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, sync_every=3600, backend=backend)
    async with running(mirror):
        assert src.is_dir()
        write_checkpoint(src, "step_001", style="dcp", size=10)
        await wait_for_async(lambda: mirror.published == 1, 10, what="publish")
    assert events.of("sync-source")[0]["action"] == "created"




def _proc_nice(pid: str) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


@pytest.mark.asyncio
async def test_copier_runs_at_lowered_priority(tmp_path, backend, events):
    src, dst = tmp_path / "local", tmp_path / "persistent"
    many_files(src / "step_001", 3000)
    (src / "step_001" / ".metadata").write_bytes(b"m")
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, backend=backend, nice=7, ionice="none")
    staging = str(dst / ".supervise-staging-step_001").encode()
    pycopy = b"_pycopy.py"
    seen: set[int] = set()

    def look() -> bool:
        # Only this test's own copiers: another test or session may be copying at another priority.
        for pid in map(str, descendants(os.getpid())):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
                with open(f"/proc/{pid}/comm", "rb") as f:
                    comm = f.read().strip()
                # `nice` itself, caught before it lowers its priority and execs the copier, is not the copier
                if (staging in cmd or pycopy in cmd) and comm not in (b"nice", b"ionice"):
                    seen.add(_proc_nice(pid))
            except (OSError, ValueError, IndexError):
                continue
        return bool(seen)

    async with anyio.create_task_group() as tg:
        tg.start_soon(mirror.flush, "test")
        await wait_for_async(look, 20, "the copier process", interval=0.001)
    assert seen == {7}, seen
