"""Parallel copy streams (``sync_streams``, issue 25): a checkpoint's files are shared among
N copiers running at once (rsync ``--files-from`` or N ``_pycopy.py`` children); every file
lands with its content, mode and times; one copier failing stops the others and fails the
publish, and nothing partial is published. Both backends, real copiers."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import anyio
import pytest

from supervisor import proctree
from supervisor.config import SyncPair
from supervisor.sync import Mirror
from supervisor.sync._backend import share
from tests.support.supervise import run_supervise, start_supervise
from tests.support.wait import wait_for_async

from ._util import running, visible

MB = 1 << 20


def test_share_deals_large_files_one_per_stream_and_small_files_evenly() -> None:
    big = {"shard_0.bin": (4 << 30, 1), "shard_1.bin": (4 << 30, 1), "meta.json": (100, 1)}
    two = share(big, (), 2)
    assert sorted(len(s) for s in two) == [1, 2] and {"shard_0.bin", "shard_1.bin"} not in [set(s) for s in two]
    small = {f"d{i % 7}/f{i:05d}": (4096, i) for i in range(10_000)}
    four = share(small, ("d0/f00000",), 4)
    assert [len(s) for s in four] == [2500, 2500, 2500, 2499]
    dealt = [n for s in four for n in s]
    assert len(dealt) == len(set(dealt)) == 9_999 and set(dealt) == set(small) - {"d0/f00000"}
    order = {n: i for i, n in enumerate(small)}
    assert all([order[n] for n in s] == sorted(order[n] for n in s) for s in four), "each share in the snapshot's order"
    assert share({"a": (1, 1)}, (), 8) == [["a"]] and share({"a": (1, 1)}, ("a",), 2) == []
    assert share(small, (), 1) == [list(small)]


class Copiers:
    """Samples this process's copier children (rsync, _pycopy.py) from /proc in a thread:
    the most seen alive at once, and, with ``kill_at``, SIGKILLs one once that many run."""

    def __init__(self, kill_at: int | None = None, parent: int | None = None) -> None:
        self.parent = os.getpid() if parent is None else parent
        self.most = 0
        self.killed: int | None = None
        self.kill_at = kill_at
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def alive(self) -> list[int]:
        out = []
        for p in proctree.all_processes():
            if p.ppid != self.parent or p.state == "Z":
                continue
            try:
                cmd = Path(f"/proc/{p.pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"_pycopy.py" in cmd or p.comm == "rsync":
                out.append(p.pid)
        return out

    def _sample(self) -> None:
        while not self._stop.is_set():
            now = self.alive()
            self.most = max(self.most, len(now))
            if self.kill_at is not None and self.killed is None and len(now) >= self.kill_at:
                self.killed = now[0]
                os.kill(now[0], signal.SIGKILL)
            time.sleep(0.001)

    def __enter__(self) -> "Copiers":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def write_tree(root: Path, name: str, *, big: int = 2, big_size: int = 24 * MB, small: int = 300) -> Path:
    """A checkpoint with nested directories, odd names, a private file and directory, a
    symlink inside, large shards for each stream and many small files; ``.metadata`` last."""
    d = root / name
    for sub in ("model", "optim/state", "odd dir", "private"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    for i in range(big):
        (d / "model" / f"shard_{i}.bin").write_bytes(os.urandom(64) * (big_size // 64))
    for i in range(small):
        (d / ("optim/state" if i % 2 else "odd dir") / f"s {i:04d}*[?]").write_bytes(f"{name}:{i}".encode() * 40)
    (d / "private" / "key").write_bytes(b"secret")
    (d / "private" / "key").chmod(0o600)
    (d / "private").chmod(0o700)
    (d / "line\nbreak").write_bytes(b"newline in a name")
    os.symlink("model/shard_0.bin", d / "weights")
    os.utime(d / "optim", ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    (d / ".metadata").write_bytes(b"meta:" + name.encode())
    return d


def same_tree(a: Path, b: Path) -> list[str]:
    """What differs between two trees: names, content, link targets, modes, file mtimes."""
    bad = []
    for dirpath, dirs, files in os.walk(a):
        rel = os.path.relpath(dirpath, a)
        other = b / rel
        if not other.is_dir():
            bad.append(f"{rel}: missing directory")
            continue
        if sorted(os.listdir(other)) != sorted(dirs + files):
            bad.append(f"{rel}: {sorted(os.listdir(other))} != {sorted(dirs + files)}")
        if (os.lstat(dirpath).st_mode & 0o7777) != (os.lstat(other).st_mode & 0o7777):
            bad.append(f"{rel}: directory mode")
        for f in files:
            x, y = Path(dirpath) / f, other / f
            sx, sy = os.lstat(x), os.lstat(y)
            if os.path.islink(x):
                if not os.path.islink(y) or os.readlink(x) != os.readlink(y):
                    bad.append(f"{rel}/{f}: link")
                continue
            if x.read_bytes() != y.read_bytes():
                bad.append(f"{rel}/{f}: content")
            if (sx.st_mode & 0o7777) != (sy.st_mode & 0o7777) or sx.st_mtime_ns // 10**9 != sy.st_mtime_ns // 10**9:
                bad.append(f"{rel}/{f}: mode or mtime")
    return bad


@pytest.mark.asyncio
@pytest.mark.parametrize("streams", [1, 2, 5])
async def test_every_file_lands_and_the_streams_copy_at_once(tmp_path, backend, events, streams):
    src, dst = tmp_path / "local", tmp_path / "persistent"
    src.mkdir()
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, sync_every=3600, backend=backend,
                    streams=streams, nice=0, ionice="none")
    async with running(mirror):
        with Copiers() as seen:
            d = await anyio.to_thread.run_sync(lambda: write_tree(src, "step_001", big=max(2, streams)))
            await wait_for_async(lambda: mirror.published >= 1, 60, what="the checkpoint published")
    assert visible(dst) == ["step_001"]
    assert same_tree(d, dst / "step_001") == []
    assert (dst / "step_001" / "optim").stat().st_mtime_ns // 10**9 == 1_600_000_000, "directory times kept"
    assert [e["checkpoint"] for e in events.of("publish")] == ["step_001"]
    assert not events.of("sync-failed")
    # at least as many copiers at once as asked for (one big shard each); one stream: one
    assert seen.most == streams if streams == 1 else seen.most >= 2, seen.most


@pytest.mark.asyncio
async def test_a_stream_killed_fails_the_publish_and_nothing_partial_lands(tmp_path, backend, events):
    """One of two copiers is SIGKILLed mid-copy (as the OOM killer would): the other is
    stopped too, the publish fails and is retried, and until then the persistent side shows
    neither the checkpoint nor its staging; the retry publishes it whole."""
    src, dst = tmp_path / "local", tmp_path / "persistent"
    src.mkdir()
    mirror = Mirror([SyncPair("c", "checkpoint", src, dst)], emit=events, sync_every=3600, backend=backend,
                    streams=2, retry_base=3.0, retry_cap=3.0)
    async with running(mirror):
        with Copiers(kill_at=2) as copiers:
            d = await anyio.to_thread.run_sync(lambda: write_tree(src, "step_001", big=2, big_size=96 * MB))
            await wait_for_async(lambda: events.of("sync-failed") or mirror.published, 60, what="the publish to fail")
            copiers._stop.set()
        assert copiers.killed is not None, "a copier was killed while two ran"
        assert mirror.published == 0, "a publish with a stream killed must fail"
        failed = events.of("sync-failed")[0]
        assert "killed by SIGKILL" in failed["error"], failed
        assert os.listdir(dst) == [], "no checkpoint and no staging left on the persistent side"
        await wait_for_async(lambda: not copiers.alive(), 10, what="every copier gone")
        await wait_for_async(lambda: mirror.published >= 1, 60, what="the retry to publish")
    assert same_tree(d, dst / "step_001") == []
    assert events.of("sync-recovered")


def test_supervise_takes_sync_streams_from_the_flag_and_says_so(tmp_path: Path) -> None:
    """``--sync-streams`` reaches the mirror of a real ``supervise`` (``check`` names it), and
    a real run with 3 streams publishes a checkpoint whole, its copiers running at once."""
    src, dst = tmp_path / "local", tmp_path / "persistent"
    src.mkdir()
    r = run_supervise("check", "--sync-streams", "3", "--checkpoints", str(src), str(dst), "--", "true",
                      cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "3 copy streams (sync_streams)" in r.stdout, r.stdout
    d = write_tree(tmp_path / "made", "step_001", big=3)
    os.rename(d, src / "step_001")
    p = start_supervise("--run-dir", str(tmp_path / "run"), "--sync-streams", "3", "--gpu-every", "0",
                        "--checkpoints", str(src), str(dst), "--", "sleep", "30", cwd=tmp_path,
                        env={"SUPERVISE_SYNC_NICE": "0", "SUPERVISE_SYNC_IONICE": "none"})
    try:
        with Copiers(parent=p.pid) as seen:
            deadline = time.monotonic() + 120
            while not (dst / "step_001").exists():
                assert time.monotonic() < deadline and p.poll() is None, "the checkpoint was not published"
                time.sleep(0.05)
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
    assert same_tree(src / "step_001", dst / "step_001") == []
    assert seen.most >= 2, seen.most
