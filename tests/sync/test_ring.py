"""Issue 43, the ring (``peer_copies = 1``): while the training runs, each node's complete
versions are copied to the next node's disk, so a node's disk lost while persistent storage
refuses writes loses nothing its partner had copied.

Two mirrors in one process stand for node 0 (the leader) and node 1 of a per-node pair, each
with its own local directory and a real peer server, running their real passes and rings
(``Mirror.run``); the persistent directory is a tmpfs remounted read-only (every publish
refused). Then node 0's disk is gone: a new node 0, with an empty disk, and node 1 offer,
choose and restore as ``conduct/fleet.py`` has them before the spawn.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import anyio
import pytest

from supervisor.sync._fill import PEER_DIR
from supervisor.sync._peers import MANIFESTS
from tests.support.emit import Events
from tests.support.node_mirrors import before_the_spawn, flip, mirrors, save
from tests.support.wait import wait_for_async

SHARDS = {0: [".metadata", "__0_0.distcp", "__1_0.distcp"], 1: ["__2_0.distcp", "__3_0.distcp"]}


def _shards(local: Path, node: int, step: int) -> None:
    """DCP's save on one node: its ranks' shards in ``step_N`` (``.metadata`` by rank 0, on node 0)."""
    d = local / f"step_{step}"
    d.mkdir(parents=True, exist_ok=True)
    for name in SHARDS[node]:
        (d / name).write_bytes(f"{name} of step {step}".encode() * 1000)


def _copied(copy: Path, data: bytes) -> bool:
    """Is ``data`` on the partner whole, its manifest (written last) naming it?"""
    try:
        doc = json.loads((copy.parent / MANIFESTS / f"{copy.name}.json").read_text())
        return copy.read_bytes() == data and doc["files"][""]["mtime_ns"] == copy.stat().st_mtime_ns
    except (OSError, ValueError):
        return False


async def _training(tmp_path: Path, dst: Path, saves, until) -> tuple[Events, Events]:  # noqa: ANN001
    """Both nodes' mirrors run (peer servers, passes, rings) while ``saves()`` writes; returns once
    ``until(events0, events1)`` holds."""
    run, ev0, ev1 = tmp_path / "run", Events(), Events()
    m0, m1 = mirrors(tmp_path, dst, (ev0, ev1))
    async with anyio.create_task_group() as tg:
        await tg.start(m0.serve_peers, run)
        await tg.start(m1.serve_peers, run)
        await tg.start(m0.run)
        await tg.start(m1.run)
        await anyio.to_thread.run_sync(saves)
        await wait_for_async(lambda: until(ev0, ev1), 60, "the ring's copies")
        tg.cancel_scope.cancel()
    return ev0, ev1


async def _after_node_0_died(tmp_path: Path, dst: Path, spoil=None) -> tuple[dict, Events, Events, Path | None, Path | None]:  # noqa: ANN001
    """Node 0's disk is gone; a new node 0 and node 1 offer, choose and restore."""
    shutil.rmtree(tmp_path / "n0")
    (tmp_path / "n0").mkdir()
    ev0, ev1 = Events(), Events()
    choice, got0, got1 = await before_the_spawn(tmp_path, dst, (ev0, ev1), spoil)
    return choice, ev0, ev1, got0, got1


@pytest.fixture
def refusing(tmpfs) -> Path:  # noqa: ANN001
    """A persistent directory that refuses every write (a filesystem at quota, a dead server)."""
    mnt = tmpfs("16m")
    (mnt / "persist").mkdir()
    tmpfs.remount(mnt, "ro")
    return mnt / "persist"


@pytest.mark.asyncio
async def test_rank_0s_saves_are_on_node_1_and_survive_node_0s_disk_while_persistent_storage_refuses(
        tmp_path: Path, refusing: Path) -> None:
    versions = [os.urandom(150_000) for _ in range(3)]
    copy = tmp_path / "n1" / PEER_DIR / "node-0" / "snapshot.pt"

    def saves() -> None:
        for v in versions:  # the tutorial's epochs: one save, then the next once it is copied
            save(tmp_path / "n0", v)
            for _ in range(600):
                if _copied(copy, v):
                    break
                time.sleep(0.1)

    ev0, _ev1 = await _training(tmp_path, refusing, saves, lambda e0, e1: len(e0.of("peer-copy")) >= 3)
    copies = ev0.of("peer-copy")
    assert [c["partner"] for c in copies] == [1, 1, 1] and all(c["checkpoint"] == "snapshot.pt" for c in copies), copies
    assert all(0 <= c["exposure_s"] < 30 and c["bytes"] == 150_000 for c in copies), copies
    assert ev0.of("sync-failed"), "the persistent side refused every publish"
    assert not os.listdir(refusing)

    choice, ev0, ev1, got0, got1 = await _after_node_0_died(tmp_path, refusing)
    (said,) = ev0.of("restore-choice")
    assert said["source"] == "nodes" and said["holders"] == ["1/0"] and said["checkpoint"] == "snapshot.pt", said
    assert got0.read_bytes() == got1.read_bytes() == versions[-1]  # the last save, from node 1's copy
    (v0,) = ev0.of("restore-verify")
    assert v0["result"] == "verified" and v0["from"] == {"node-1-copy": 150_000}, v0
    (v1,) = ev1.of("restore-verify")
    assert v1["from"] == {"copy": 150_000} and v1["moved"] == 0, v1  # its own disk: linked, nothing moved


@pytest.mark.asyncio
async def test_a_dcp_nodes_shards_survive_its_disk_from_the_partners_copy_and_the_partner_keeps_two(
        tmp_path: Path, refusing: Path) -> None:
    def saves() -> None:
        for step in (1, 2, 3):
            _shards(tmp_path / "n0", 0, step)
            _shards(tmp_path / "n1", 1, step)
            time.sleep(0.6)

    def both_copied(e0: Events, e1: Events) -> bool:
        return all(any(c["checkpoint"] == "step_3" for c in e.of("peer-copy")) for e in (e0, e1))

    ev0, ev1 = await _training(tmp_path, refusing, saves, both_copied)
    # node 0's part on node 1's disk, node 1's on node 0's: the newest two versions only
    for held, writer in ((tmp_path / "n1", 0), (tmp_path / "n0", 1)):
        here = held / PEER_DIR / f"node-{writer}"
        kept = sorted(p.name for p in here.iterdir() if p.name != MANIFESTS)
        assert set(kept) <= {"step_2", "step_3"} and "step_3" in kept, kept
        assert sorted(os.listdir(here / "step_3")) == sorted(SHARDS[writer])
    # node 0's disk is gone; its part of step_3 is on node 1, as a copy
    choice, ev0, ev1, got0, got1 = await _after_node_0_died(tmp_path, refusing)
    (said,) = ev0.of("restore-choice")
    assert said["source"] == "nodes" and said["checkpoint"] == "step_3" and set(said["holders"]) == {"1", "1/0"}, said
    for got in (got0, got1):
        assert got is not None and sorted(os.listdir(got)) == sorted(SHARDS[0] + SHARDS[1]), got
        assert (got / "__0_0.distcp").read_bytes() == b"__0_0.distcp of step 3" * 1000
    size = {n: len(f"{n} of step 3") * 1000 for n in SHARDS[0] + SHARDS[1]}
    # node 1 (restored first): its own shards, and node 0's from the copy on its disk, nothing moved
    (v1,) = ev1.of("restore-verify")
    assert v1["from"] == {"live": sum(size[n] for n in SHARDS[1]), "copy": sum(size[n] for n in SHARDS[0])}, v1
    assert v1["moved"] == 0 and v1["failed"] == [], v1
    # the new node 0: node 1's shards from node 1, its own from node 1's copy of them; no node is
    # asked for a file it did not offer (before: each miss was journaled as a failed try)
    (v0,) = ev0.of("restore-verify")
    assert v0["result"] == "verified" and v0["failed"] == [], v0
    assert v0["from"] == {"node-1": sum(size[n] for n in SHARDS[1]), "node-1-copy": sum(size[n] for n in SHARDS[0])}, v0
    assert v0["moved"] == sum(size.values()), v0


@pytest.mark.asyncio
async def test_a_corrupt_byte_in_the_partners_copy_is_never_loaded(tmp_path: Path, refusing: Path) -> None:
    data = os.urandom(120_000)
    copy = tmp_path / "n1" / PEER_DIR / "node-0" / "snapshot.pt"
    await _training(tmp_path, refusing, lambda: save(tmp_path / "n0", data),
                    lambda e0, e1: bool(e0.of("peer-copy")))
    assert copy.read_bytes() == data
    choice, ev0, ev1, got0, got1 = await _after_node_0_died(tmp_path, refusing, spoil=lambda: flip(copy))
    assert choice["ckpt"]["holders"] == {"1/0": [""]}, choice
    # the copy is the only one, and its bytes are not the manifest's: neither node loads them
    for got in (got0, got1):
        assert got is None or got.read_bytes() != _flipped(data), got
    failed = [f for e in (ev0, ev1) for v in e.of("restore-verify") for f in v.get("failed", [])]
    bad = [f for f in failed if f["from"] in ("node-1-copy", "copy")]
    assert {f["from"] for f in bad} == {"node-1-copy", "copy"} and all("sha256" in f["why"] for f in bad), failed


def _flipped(data: bytes) -> bytes:
    b = bytearray(data)
    b[7] ^= 0xFF
    return bytes(b)



@pytest.mark.asyncio
async def test_a_partner_not_up_yet_is_journaled_once_and_copied_to_once_it_is(tmp_path: Path) -> None:
    """Node agents start one by one: node 0's ring finds no partner at first (``peer-copy-failed``,
    once for the version), then, node 1's server up, copies the version at its next look."""
    dst, run, ev0, ev1 = tmp_path / "persist", tmp_path / "run", Events(), Events()
    data = os.urandom(50_000)
    save(tmp_path / "n0", data)
    m0, m1 = mirrors(tmp_path, dst, (ev0, ev1))
    async with anyio.create_task_group() as tg:
        await tg.start(m0.serve_peers, run)
        await tg.start(m0.run)
        await wait_for_async(lambda: ev0.of("peer-copy-failed"), 30, "the ring's first push fails")
        await anyio.sleep(5)  # two more looks: the same version's failure is not journaled again
        (failed,) = ev0.of("peer-copy-failed")
        assert failed["partner"] == 1 and failed["checkpoint"] == "snapshot.pt" and "node 1" in failed["error"], failed
        await tg.start(m1.serve_peers, run)
        await wait_for_async(lambda: ev0.of("peer-copy"), 30, "the copy once node 1 listens")
        tg.cancel_scope.cancel()
    assert _copied(tmp_path / "n1" / PEER_DIR / "node-0" / "snapshot.pt", data)


@pytest.mark.asyncio
async def test_an_old_version_touched_after_it_was_dropped_is_not_copied_again(tmp_path: Path) -> None:
    """On the cluster (test_ring_nodes.py) the spare's ring pushed step_25 and step_30 three times
    each, each dropped at once (two newer ones were kept): something touched their directories,
    the next save was not complete yet, and the names written last were all the ring judged. Now
    it judges the highest steps too, and never pushes a version older than the two the partner
    keeps."""
    dst, run, ev0 = tmp_path / "persist", tmp_path / "run", Events()
    m0, m1 = mirrors(tmp_path, dst, (ev0, Events()))
    async with anyio.create_task_group() as tg:
        await tg.start(m0.serve_peers, run)
        await tg.start(m1.serve_peers, run)
        await tg.start(m0.run)
        for step in (1, 2, 3):
            _shards(tmp_path / "n0", 0, step)
            await wait_for_async(lambda s=step: any(c["checkpoint"] == f"step_{s}" for c in ev0.of("peer-copy")), 30,
                                 f"step_{step} copied")
        before = len(ev0.of("peer-copy"))
        (tmp_path / "n0" / "step_4").mkdir()  # the next save begins: not complete (no .metadata yet)
        (tmp_path / "n0" / "step_4" / "__0_0.distcp").write_bytes(b"x" * 1000)
        os.utime(tmp_path / "n0" / "step_1")  # its directory written again: the newest by mtime
        await anyio.sleep(5)  # two looks
        tg.cancel_scope.cancel()
    assert [c["checkpoint"] for c in ev0.of("peer-copy")][before:] == [], ev0.of("peer-copy")
    held = tmp_path / "n1" / PEER_DIR / "node-0"
    assert sorted(p.name for p in held.iterdir() if p.name != MANIFESTS) == ["step_2", "step_3"]


@pytest.mark.asyncio
async def test_a_link_to_a_checkpoint_is_not_copied_its_target_is(tmp_path: Path) -> None:
    """Lightning's ``save_last="link"``: ``last.ckpt`` is a symlink to the newest epoch file. The
    target is copied; the link is not (a restore makes it again), and no push of it fails."""
    dst, run, ev0 = tmp_path / "persist", tmp_path / "run", Events()
    local = tmp_path / "n0"
    local.mkdir()
    (local / "epoch=1-step=8.ckpt").write_bytes(os.urandom(20_000))
    os.symlink("epoch=1-step=8.ckpt", local / "last.ckpt")
    m0, m1 = mirrors(tmp_path, dst, (ev0, Events()))
    async with anyio.create_task_group() as tg:
        await tg.start(m0.serve_peers, run)
        await tg.start(m1.serve_peers, run)
        await tg.start(m0.run)
        await wait_for_async(lambda: ev0.of("peer-copy"), 30, "the epoch file copied")
        await anyio.sleep(5)  # two more looks
        tg.cancel_scope.cancel()
    assert [c["checkpoint"] for c in ev0.of("peer-copy")] == ["epoch=1-step=8.ckpt"], ev0.of("peer-copy")
    assert ev0.of("peer-copy-failed") == [], ev0.of("peer-copy-failed")


@pytest.mark.asyncio
async def test_a_published_version_whose_own_copy_is_corrupt_comes_from_the_partners_copy(tmp_path: Path) -> None:
    """The persistent side takes writes: ``step_2`` is published and both rings copied it. A
    byte of node 0's own shard flips (same size and mtime): node 0 takes that file from node
    1's copy of its part, not from persistent storage, which is read for nothing. Before, a
    published choice named only the nodes' own copies as holders (cluster:
    tests/multinode/test_flipped_bytes.py took the file from persistent storage)."""
    dst = tmp_path / "persist"

    def saves() -> None:
        for step in (1, 2):
            _shards(tmp_path / "n0", 0, step)
            _shards(tmp_path / "n1", 1, step)
            time.sleep(0.6)

    def published_and_copied(e0: Events, e1: Events) -> bool:
        return any(p.get("checkpoint") == "step_2" for p in e0.of("publish")) and all(
            any(c["checkpoint"] == "step_2" for c in e.of("peer-copy")) for e in (e0, e1))

    await _training(tmp_path, dst, saves, published_and_copied)
    ev0, ev1 = Events(), Events()
    choice, got0, got1 = await before_the_spawn(tmp_path, dst, (ev0, ev1),
                                                spoil=lambda: flip(tmp_path / "n0" / "step_2" / "__0_0.distcp"))
    (said,) = ev0.of("restore-choice")
    assert said["source"] == "persistent" and said["checkpoint"] == "step_2", said
    assert {"0", "1", "0/1", "1/0"} <= set(said["holders"]), said
    assert got0 is not None and (got0 / "__0_0.distcp").read_bytes() == b"__0_0.distcp of step 2" * 1000
    (v0,) = ev0.of("restore-verify")
    assert [(f["from"], f["file"]) for f in v0["failed"]] == [("live", "__0_0.distcp")], v0
    size = len("__0_0.distcp of step 2") * 1000
    assert v0["from"].get("node-1-copy") == size and "persistent" not in v0["from"], v0
