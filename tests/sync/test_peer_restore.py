"""Issue 43, the peer tier: the leader chooses the newest version whole across the nodes'
copies, and every node fills it from its own disk, then from the node that holds it (over
``_peer``), then from persistent storage, each file verified against its sha256.

Two mirrors in one process stand for node 0 (the leader) and node 1 of a per-node pair, each
with its own local directory and a real peer server; they share the persistent directory and
the run directory, as the nodes of a job do. The offer, the choice and the restore are the
calls the leader and a node agent make before the spawn (``conduct/fleet.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from supervisor.sync import Mirror
from tests.support.emit import Events
from tests.support.node_mirrors import before_the_spawn, flip, pair, save


async def _publish(tmp_path: Path, dst: Path, data: bytes) -> None:
    """snapshot.pt saved on node 0 and published (whole on node 0), with its content manifest."""
    save(tmp_path / "n0", data)
    m0 = Mirror([pair(tmp_path / "n0", dst)], emit=Events(), node_rank=0, backend="python")
    m0.training_exited()
    await m0.flush("test")
    assert (dst / "snapshot.pt").read_bytes() == data
    assert json.loads((dst / ".supervise" / "manifests" / "snapshot.pt.json").read_text())["checkpoint"] == "snapshot.pt"


@pytest.mark.asyncio
async def test_a_requeue_onto_the_same_nodes_reads_nothing_back_from_persistent_storage(tmp_path: Path) -> None:
    dst = tmp_path / "persist"
    v1 = os.urandom(300_000)
    await _publish(tmp_path, dst, v1)
    ev0, ev1 = Events(), Events()
    choice, got0, got1 = await before_the_spawn(tmp_path, dst, (ev0, ev1))
    assert choice["ckpt"]["checkpoint"] == "snapshot.pt" and choice["ckpt"]["source"] == "persistent"
    assert choice["ckpt"]["holders"] == {"0": [""]}
    assert got1 == tmp_path / "n1" / "snapshot.pt" and got1.read_bytes() == v1
    (v,) = ev1.of("restore-verify")
    assert v["result"] == "verified" and v["from"] == {"node-0": len(v1)} and v["moved"] == len(v1), v
    (v,) = ev0.of("restore-verify")
    assert v["from"] == {"live": len(v1)} and v["moved"] == 0, v


@pytest.mark.asyncio
async def test_the_newest_version_whole_on_the_nodes_is_chosen_while_persistent_storage_refuses_writes(
        tmp_path: Path, tmpfs) -> None:
    mnt = tmpfs("16m")
    dst = mnt / "persist"
    v1, v2 = os.urandom(200_000), os.urandom(200_000)
    await _publish(tmp_path, dst, v1)
    tmpfs.remount(mnt, "ro")  # the persistent side refuses every write from now on
    save(tmp_path / "n0", v2)  # epoch 2, saved on node 0 only, never published
    ev0, ev1 = Events(), Events()
    choice, got0, got1 = await before_the_spawn(tmp_path, dst, (ev0, ev1))
    (said,) = ev0.of("restore-choice")
    assert said["source"] == "nodes" and said["published"] == "snapshot.pt" and said["holders"] == ["0"], said
    assert got0.read_bytes() == v2 and got1.read_bytes() == v2  # every node resumes from epoch 2, not epoch 1
    (v,) = ev1.of("restore-verify")
    assert v["from"] == {"node-0": len(v2)}, v
    assert (dst / "snapshot.pt").read_bytes() == v1
    # the persistent side takes writes again: the version the nodes resumed from is published
    tmpfs.remount(mnt, "rw")
    m0 = Mirror([pair(tmp_path / "n0", dst)], emit=Events(), node_rank=0, backend="python")
    m0.training_exited()
    await m0.flush("test")
    assert (dst / "snapshot.pt").read_bytes() == v2


@pytest.mark.asyncio
async def test_a_corrupt_byte_in_a_peers_copy_is_never_loaded(tmp_path: Path) -> None:
    dst = tmp_path / "persist"
    v1 = os.urandom(300_000)
    await _publish(tmp_path, dst, v1)
    ev0, ev1 = Events(), Events()
    # node 0's copy rots after it said what it holds: node 1 detects it and takes persistent storage's
    choice, got0, got1 = await before_the_spawn(tmp_path, dst, (ev0, ev1),
                                                 spoil=lambda: flip(tmp_path / "n0" / "snapshot.pt"))
    assert got1.read_bytes() == v1
    (v,) = ev1.of("restore-verify")
    assert v["from"] == {"persistent": len(v1)}, v
    assert [(f["from"], f["file"]) for f in v["failed"]] == [("node-0", "")] and "sha256" in v["failed"][0]["why"], v
    # and node 0 itself: its own copy fails; node 1 did not offer it (the choice names node 0 alone as
    # holding it), so persistent storage gives the good bytes
    (v,) = ev0.of("restore-verify")
    assert got0.read_bytes() == v1 and v["from"] == {"persistent": len(v1)}, v
    # (set aside first: it is not the published version, and then fails verification there)
    assert [(f["from"], f["file"]) for f in v["failed"]] == [("aside", "")], v


@pytest.mark.asyncio
async def test_a_node_holding_an_older_version_of_the_name_is_not_named_as_holding_it(tmp_path: Path) -> None:
    """A requeue onto other nodes: the new leader's host kept the snapshot.pt it restored as node 1
    in the attempt before, an older version of the published name. Nobody is sent to it."""
    dst = tmp_path / "persist"
    v1 = os.urandom(100_000)
    await _publish(tmp_path, dst, v1)
    old = tmp_path / "n0" / "snapshot.pt"
    old.write_bytes(os.urandom(100_000))
    os.utime(old, ns=(1_600_000_000 * 10**9, 1_600_000_000 * 10**9))  # saved (and restored) long before
    ev0, ev1 = Events(), Events()
    choice, got0, got1 = await before_the_spawn(tmp_path, dst, (ev0, ev1))
    assert choice["ckpt"]["source"] == "persistent" and choice["ckpt"]["holders"] == {}, choice
    assert got0.read_bytes() == got1.read_bytes() == v1
    (v,) = ev1.of("restore-verify")
    assert v["from"] == {"persistent": len(v1)} and v["failed"] == [], v
