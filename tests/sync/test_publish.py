"""A slow writer never shows a torn checkpoint or an early marker on the destination.

A thread watches the destination continuously while a writer produces multi-file
checkpoints slowly and the mirror syncs on every file event and on a short timer.
"""

from __future__ import annotations

import os
import sys
import shutil
import threading
import time
from pathlib import Path

import anyio
import pytest

from supervisor.config import SyncPair
from supervisor.sync import Mirror
from tests.support.checkpoints import ckpt_name, pattern, problems, write_checkpoint
from tests.support.wait import wait_for_async

from ._util import running

N, SHARDS, SIZE = 4, 3, 256 << 10


class Watcher:
    """Checks the destination as fast as it can, from another thread, until stopped."""

    def __init__(self, dst: Path, style: str) -> None:
        self.dst, self.style = dst, style
        self.seen: list[str] = []
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.seen += problems(self.dst, style=self.style, shards=SHARDS, size=SIZE)
            self.rounds += 1
            time.sleep(0.002)  # leave the GIL to the writer and the mirror

    def __enter__(self) -> "Watcher":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_the_watcher_can_see_a_torn_checkpoint(tmp_path):
    """The checker is not vacuous: a copy made mid-write is reported."""
    write_checkpoint(tmp_path / "dst", "step_001", style="dcp", shards=SHARDS, size=SIZE)
    shard = tmp_path / "dst" / "step_001" / "shard_1.bin"
    shard.write_bytes(pattern("step_001", 1, SIZE)[: SIZE // 2])
    assert problems(tmp_path / "dst", style="dcp", shards=SHARDS, size=SIZE) == [
        f"step_001: shard_1.bin torn ({SIZE // 2} of {SIZE} bytes)"]
    (tmp_path / "dst2" / "step_002").mkdir(parents=True)
    (tmp_path / "dst2" / "latest").write_text("step_002")
    assert problems(tmp_path / "dst2", style="deepspeed", shards=1, size=1)


@pytest.mark.parametrize("style", ["dcp", "user", "deepspeed", "megatron", "quiet"])
@pytest.mark.asyncio
async def test_slow_writer_never_shows_partial_checkpoint(tmp_path, backend, events, style):
    src, dst = tmp_path / "local", tmp_path / "persistent"
    src.mkdir()
    pair = SyncPair("ckpt", "checkpoint", src, dst, markers=(".complete",) if style == "user" else (),
                    settle=1.0)
    mirror = Mirror([pair], emit=events, sync_every=0.3, backend=backend)
    names = [ckpt_name(style, k) for k in range(1, N + 1)]

    def writer() -> None:
        for name in names:
            # pauses between shards stay under the settle time, as a live writer's would
            write_checkpoint(src, name, style=style, shards=SHARDS, size=SIZE, delay=0.01, pause=0.2)

    with Watcher(dst, style) as w:
        async with running(mirror):
            await anyio.to_thread.run_sync(writer)
            await wait_for_async(lambda: mirror.published >= N, 30, what="every checkpoint published")
            if style in ("deepspeed", "megatron"):
                ptr = "latest" if style == "deepspeed" else "latest_checkpointed_iteration.txt"
                await wait_for_async(lambda: (dst / ptr).exists() and (dst / ptr).read_text() == (src / ptr).read_text(),
                                     10, what="pointer published")
    assert w.rounds > 50, "the watcher did not get to look"
    assert w.seen == []
    assert problems(dst, style=style, shards=SHARDS, size=SIZE) == []
    assert sorted(n for n in (p.name for p in dst.iterdir()) if not n.startswith(".") and "latest" not in n) == names
    assert {e["checkpoint"] for e in events.of("publish") if not e.get("pointer")} == set(names)
    assert not events.of("sync-failed")
    assert all(e["lag_s"] is not None and e["lag_s"] < 20 for e in events.of("publish"))
    assert mirror.pending() == []


@pytest.mark.asyncio
async def test_pointer_lands_after_its_checkpoint(tmp_path, backend, events):
    """DeepSpeed writes ``latest`` in place; on the destination it appears only after its target."""
    src, dst = tmp_path / "local", tmp_path / "persistent"
    write_checkpoint(src, "global_step1", style="deepspeed", shards=2, size=1 << 20)
    mirror = Mirror([SyncPair("ds", "checkpoint", src, dst)], emit=events, backend=backend)
    await mirror.flush("test")
    kinds = [(e["kind"], e.get("checkpoint")) for e in events if e["kind"] == "publish"]
    assert kinds == [("publish", "global_step1"), ("publish", "latest")]
    assert (dst / "latest").read_text() == "global_step1"


@pytest.mark.asyncio
async def test_settled_checkpoint_is_published_by_the_timer(tmp_path, backend, events):
    """No marker: published once quiet for ``settle``, with no file event to wake us."""
    src, dst = tmp_path / "local", tmp_path / "persistent"
    src.mkdir()
    mirror = Mirror([SyncPair("q", "checkpoint", src, dst, settle=0.5)], emit=events, sync_every=3600, backend=backend)
    async with running(mirror):
        await anyio.to_thread.run_sync(lambda: write_checkpoint(src, "step_001", style="quiet", shards=2, size=1000))
        await wait_for_async(lambda: mirror.published >= 1, 10, what="settled checkpoint published")
    (pub,) = events.of("publish")
    assert pub["why"] == "settled" and pub["trigger"] == "settle"
    assert problems(dst, style="quiet", shards=2, size=1000) == []


@pytest.mark.asyncio
async def test_file_changed_while_copied_is_copied_again(tmp_path, backend, events):
    src, dst = tmp_path / "local", tmp_path / "persistent"
    d = src / "step_001"
    from ._util import many_files
    many_files(d, 2000)
    (d / "a.bin").write_bytes(b"old")
    (d / ".metadata").write_bytes(b"m")
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, backend=backend)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mirror.flush, "test")
        await wait_for_async(lambda: (dst / ".supervise-staging-step_001").exists(), 10, "copy under way", interval=0.001)
        with open(d / "a.bin", "ab") as f:
            f.write(b"+new")
    assert (dst / "step_001" / "a.bin").read_bytes() == b"old+new"
    assert mirror.published == 1


@pytest.mark.asyncio
async def test_a_newer_checkpoint_is_not_kept_waiting_behind_a_pass_of_older_ones(tmp_path, events, monkeypatch):
    """A pass that began with six checkpoints to publish, at a slow copier (rsync behind a 1 s
    pause, as persistent storage at CI load), yields to a seventh that completes meanwhile: it
    is published next, not after all the older ones (the chaos trial at stop 28: a pass over
    older checkpoints went on for 11 s after the stop's own was durable, and the bounded flush
    then left the newer ones behind). The older ones are all published after it."""
    real = shutil.which("rsync")
    if real is None:
        pytest.skip("rsync is not on PATH (apt-get install rsync)")
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "rsync").write_text(f'#!/bin/sh\ncase "$*" in *--version*) exec {real} --version;; esac\n'
                                f'sleep 1\nexec {real} "$@"\n')
    (slow / "rsync").chmod(0o755)
    monkeypatch.setenv("PATH", f"{slow}:{os.environ['PATH']}")
    src, dst = tmp_path / "local", tmp_path / "persistent"
    for k in range(1, 7):
        write_checkpoint(src, f"step_{k:03d}", style="dcp", shards=2, size=4096)
    mirror = Mirror([SyncPair("ckpt", "checkpoint", src, dst, settle=0.5)], emit=events, backend="rsync")

    def order() -> list[str]:
        return [e["checkpoint"] for e in events.of("publish") if not e.get("pointer")]

    async with running(mirror):
        await wait_for_async(lambda: order(), 60, what="the first publish of the pass")
        assert order() == ["step_006"], order()
        await anyio.to_thread.run_sync(lambda: write_checkpoint(src, "step_007", style="dcp", shards=2, size=4096))
        await wait_for_async(lambda: len(order()) == 7, 120, what="every checkpoint published")
    published = order()
    assert published.index("step_007") < published.index("step_002"), published
    assert sorted(published) == [f"step_{k:03d}" for k in range(1, 8)], published
    assert problems(dst, style="dcp", shards=2, size=4096) == []
    assert mirror.pending() == []


# DeepSpeed's layout, saved every 0.12 s as its ZeRO-1 run with 2 ranks did in the issue: three
# files per global_stepN, the recovery scripts rewritten beside them at every save, then `latest`.
DEEPSPEED_LIKE = """
import os, sys, time
out, saves, every = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
for step in range(3, 3 * saves + 1, 3):
    d = os.path.join(out, f"global_step{step}")
    os.makedirs(d)
    for f in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
              "zero_pp_rank_1_mp_rank_00_optim_states.pt"):
        with open(os.path.join(d, f), "wb") as fh:
            fh.write(os.urandom(64 << 10))
    for helper in ("zero_to_fp32.py", "zero_to_torch.py"):
        with open(os.path.join(out, helper), "w") as fh:
            fh.write("# DeepSpeed's recovery script, copied beside the checkpoints\\n" * 400)
    with open(os.path.join(out, "latest"), "w") as fh:
        fh.write(f"global_step{step}")
    time.sleep(every)
"""


def test_files_beside_the_checkpoints_never_starve_the_newest(tmp_path: Path) -> None:
    """Issue 30, 2: DeepSpeed rewrites zero_to_fp32.py and zero_to_torch.py at every save; each
    was published as a single-file checkpoint, first in every pass (its name sorts after
    global_step*), and a pass yields after one publish when a trigger waits: the newest
    global_stepN waited 10 s and more. Now they are plain files beside the checkpoints, and
    the newest durable checkpoint stays within a copy time + 1 s of the newest complete one."""
    from supervisor.journal import read_journal
    from tests.support.supervise import start_supervise
    from tests.support.staleness import staleness

    run, local, persistent = tmp_path / "run", tmp_path / "local", tmp_path / "persistent"
    local.mkdir()
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persistent), "--gpu-every", "0",
                        "--", sys.executable, "-c", DEEPSPEED_LIKE, str(local), "100", "0.12")
    _out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err[-3000:]
    events = read_journal(run).events
    exited = next(e["t"] for e in events if e["kind"] == "child-exit")
    samples = staleness(events, until=exited)
    copies = sorted(float(e["seconds"]) for e in events if e["kind"] == "sync" and e.get("published")
                    and e["t"] <= exited)
    assert samples and copies, (samples, copies)
    bound = copies[-1] + 1.0  # one pass's copy time (the first one copies the files beside them too) + 1 s
    assert max(samples) <= bound, f"staleness up to {max(samples):.2f} s while training (bound {bound:.2f} s)"
    pubs = [e for e in events if e["kind"] == "publish" and not e.get("pointer")]
    helpers = {e["checkpoint"] for e in pubs if e.get("restorable") is False}
    assert helpers == {"zero_to_fp32.py", "zero_to_torch.py"}, helpers
    assert (persistent / "global_step300").is_dir() and (persistent / "latest").read_text() == "global_step300"
    assert (persistent / "zero_to_fp32.py").read_text() == (local / "zero_to_fp32.py").read_text()
