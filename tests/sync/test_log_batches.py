"""Log pairs copy what grew, in batches: a training that logs every ~0.1 s costs one small copy
per LOG_BATCH, not a walk and copy of the whole log tree per file event."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import anyio
import pytest

from supervisor.config import SyncPair
from supervisor.sync import Mirror, _pair
from supervisor.sync._pair import LOG_BATCH
from tests.support.supervise import run_supervise
from tests.support.wait import wait_for_async

from ._util import many_files, running


@pytest.mark.asyncio
async def test_a_busy_log_is_copied_in_batches_and_only_what_grew(tmp_path, backend, events, monkeypatch):
    monkeypatch.setattr(_pair, "LOG_BATCH", 1.0)  # the engine's constant, shortened for the test's sake
    src, dst = tmp_path / "tb", tmp_path / "ptb"
    many_files(src / "static", 200)
    log = src / "run" / "events.out.tfevents.1"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"")
    mirror = Mirror([SyncPair("tb", "log", src, dst)], emit=events, sync_every=3600, backend=backend)
    target = dst / "run" / log.name
    async with running(mirror):
        await wait_for_async(lambda: target.exists() and len(list((dst / "static").iterdir())) == 200, 20, what="first copy")
        inode = target.stat().st_ino
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4.0:  # a point every 0.05 s for 4 s
            with open(log, "ab") as f:
                f.write(b"p" * 100)
            await anyio.sleep(0.05)
        await wait_for_async(lambda: target.stat().st_size == log.stat().st_size, 10, what="the last batch")
        assert target.stat().st_ino == inode  # grown in place: TensorBoard's open handle reads on
    batched = [e for e in events.of("sync") if e["trigger"] in ("watch", "settle") and e["files"]]
    # ~80 writes over 4 s: about one copy per second (gaps and scheduling allow a few more)
    assert 2 <= len(batched) <= 8, [(e["trigger"], e["files"]) for e in batched]
    assert all(e["files"] == 1 for e in batched), batched  # the growing file alone, never the 200
    assert target.read_bytes() == log.read_bytes()


@pytest.mark.asyncio
async def test_a_flush_does_not_wait_for_the_batch(tmp_path, backend, events):
    src, dst = tmp_path / "tb", tmp_path / "ptb"
    src.mkdir()
    (src / "a.log").write_bytes(b"x" * 10)
    mirror = Mirror([SyncPair("tb", "log", src, dst)], emit=events, sync_every=3600, backend=backend)
    async with running(mirror):
        await wait_for_async(lambda: (dst / "a.log").exists(), 10, what="first copy")
        with open(src / "a.log", "ab") as f:
            f.write(b"y" * 10)
        t0 = time.monotonic()
        assert (await mirror.flush("end"))["ok"]
        assert time.monotonic() - t0 < LOG_BATCH / 2
    assert (dst / "a.log").read_bytes() == b"x" * 10 + b"y" * 10
    assert mirror.pending() == []


WRITER = r"""
import os, sys, time
d = sys.argv[1]
os.makedirs(d + "/run", exist_ok=True)
for i in range(100):
    open(f"{d}/hparams-{i}.yaml", "w").write("lr: 0.1\n")
end = time.monotonic() + float(sys.argv[2])
with open(d + "/run/events.out.tfevents.1", "ab", buffering=0) as f:
    while time.monotonic() < end:
        f.write(b"scalar" * 20)
        time.sleep(0.1)
"""


def test_supervise_mirrors_a_busy_log_in_batches_end_to_end(tmp_path: Path) -> None:
    local, persistent, run = tmp_path / "logs", tmp_path / "persistent", tmp_path / "run"
    seconds = LOG_BATCH * 1.5
    r = run_supervise("-q", "--gpu-every", "0", "--run-dir", str(run), "--logs", str(local), str(persistent),
                      "--", sys.executable, "-c", WRITER, str(local), str(seconds), timeout=seconds + 60)
    assert r.returncode == 0, r.stderr
    assert (persistent / "run" / "events.out.tfevents.1").read_bytes() == (local / "run" / "events.out.tfevents.1").read_bytes()
    assert len(list(persistent.glob("hparams-*.yaml"))) == 100
    syncs = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    copies = [e for e in syncs if e["kind"] == "sync" and e.get("trigger") in ("watch", "settle") and e["files"]]
    # 150 writes over 1.5 batches: at most one copy per batch (and the start and end passes besides)
    assert 1 <= len(copies) <= 3, [(e["trigger"], e["files"], e.get("t")) for e in copies]
