"""Every version of a checkpoint rewritten in place is published under ``nodes > 1`` (issue 29, D1).

The PyTorch DDP tutorial's multi-node script (and most trainers after it) has global rank 0
``torch.save`` one file, ``snapshot.pt``, every epoch. Under ``nodes = 1`` each version is
published; under ``nodes = 2`` only the first was, every later one journaled ``sync-deferred
… not published again``, the final flush too. Here the real Mirror of node 0 (the leader) and
of node 1 run in this process over two local directories and one persistent one, as on the
cluster; no scheduler needed. Rank 0 may be on either node.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import pytest

from supervisor.config import SyncPair
from supervisor.sync import Mirror
from supervisor.sync._parts import PARTS_DIR

VERSIONS = 4


def pairs(tmp_path: Path) -> dict[int, SyncPair]:
    return {n: SyncPair(name="ckpt", kind="checkpoint", src=tmp_path / f"node{n}", dst=tmp_path / "persist", nodes=2,
                        settle=0.3, restore=True) for n in (0, 1)}


def mirror(p: SyncPair, node: int, events: list[tuple[int, str, dict]]) -> Mirror:
    """Node ``node``'s real Mirror of ``p``, journaling into ``events`` as (node, kind, fields)."""
    return Mirror([p], emit=lambda kind, **f: events.append((node, kind, f)) or f, sync_every=600, backend="python",
                  node_rank=node, parts_poll=0.2)


def save(path: Path, epoch: int) -> None:
    """A rewrite in place, as ``torch.save(obj, "snapshot.pt")`` does: truncate and write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(f"EPOCHS_RUN={epoch}\n".encode() * 200)
    # each version a second newer than the last (the tutorial: one an epoch, seconds apart)
    t = time.time() + epoch
    os.utime(path, (t, t))


def epoch_of(path: Path) -> int | None:
    try:
        return int(path.read_bytes().split(b"\n", 1)[0].split(b"=")[1])
    except (OSError, IndexError, ValueError):
        return None


@pytest.mark.parametrize("writer", [0, 1], ids=["rank0-on-the-leaders-node", "rank0-on-node-1"])
def test_every_version_of_a_file_rewritten_in_place_is_published(tmp_path: Path, writer: int) -> None:
    ps = pairs(tmp_path)
    events: list[tuple[int, str, dict]] = []
    dst = ps[0].dst / "snapshot.pt"
    seen: list[int | None] = []

    def publishes() -> list[dict]:
        return [f for n, k, f in events if n == 0 and k == "publish" and f["checkpoint"] == "snapshot.pt"]

    async def main() -> None:
        mirrors = {n: mirror(p, n, events) for n, p in ps.items()}
        async with anyio.create_task_group() as tg:
            for m in mirrors.values():
                await tg.start(m.run)
            for epoch in range(VERSIONS):
                save(ps[writer].src / "snapshot.pt", epoch)
                with anyio.fail_after(20):  # the file in place, then its publish event
                    while epoch_of(dst) != epoch or len(publishes()) <= epoch:
                        await anyio.sleep(0.05)
                seen.append(epoch_of(dst))
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert seen == list(range(VERSIONS))
    deferred = [f for _n, k, f in events if k == "sync-deferred"]
    assert not deferred, deferred
    published = publishes()
    assert len(published) == VERSIONS, published
    assert all(f["parts"] == {str(writer): 1} for f in published), published
    # nothing left behind but what a later version may use
    assert not any((ps[0].dst / PARTS_DIR).glob("snapshot.pt/node-*.json"))


def test_the_final_flush_publishes_the_newest_version(tmp_path: Path) -> None:
    """The training exits right after its last save: the flush publishes that version, not an
    older one, and nothing is left pending."""
    ps = pairs(tmp_path)
    events: list[tuple[str, dict]] = []

    async def main() -> dict:
        m = Mirror([ps[0]], emit=lambda kind, **f: events.append((kind, f)) or f, sync_every=600, backend="python",
                   node_rank=0, parts_poll=0.2)
        async with anyio.create_task_group() as tg:
            await tg.start(m.run)
            save(ps[0].src / "snapshot.pt", 0)
            with anyio.fail_after(20):
                while epoch_of(ps[0].dst / "snapshot.pt") != 0:
                    await anyio.sleep(0.05)
            save(ps[0].src / "snapshot.pt", 1)
            m.training_exited()
            result = await m.flush("final")
            tg.cancel_scope.cancel()
        return result

    result = anyio.run(main)
    assert epoch_of(ps[0].dst / "snapshot.pt") == 1
    assert result["ok"] and not result["pending"], result


def test_an_older_local_version_never_replaces_a_newer_published_one(tmp_path: Path) -> None:
    """Node 1 holds the version it restored (epoch 0) while rank 0 on node 0 writes newer ones:
    node 1's copy is never published over them."""
    ps = pairs(tmp_path)
    save(ps[0].dst / "snapshot.pt", 0)
    events: list[tuple[int, str, dict]] = []

    async def main() -> None:
        mirrors = {n: mirror(p, n, events) for n, p in ps.items()}
        for m in mirrors.values():
            await m.restore()
        async with anyio.create_task_group() as tg:
            for m in mirrors.values():
                await tg.start(m.run)
            for epoch in (1, 2):
                save(ps[0].src / "snapshot.pt", epoch)
                with anyio.fail_after(20):
                    while epoch_of(ps[0].dst / "snapshot.pt") != epoch:
                        await anyio.sleep(0.05)
            for m in mirrors.values():
                m.training_exited()
            for m in (mirrors[1], mirrors[0]):
                await m.flush("final")
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert epoch_of(ps[1].src / "snapshot.pt") == 0  # node 1 still holds what it restored
    assert epoch_of(ps[0].dst / "snapshot.pt") == 2
    assert not [f for n, k, f in events if n == 1 and k == "part"]


def hf_checkpoint(node_dir: Path, step: int, ranks: tuple[int, ...], whole: bool) -> None:
    """``checkpoint-N/`` as HF's Trainer writes it with ``save_on_each_node`` false: the node of
    global rank 0 writes the model and ``trainer_state.json`` (the marker, last), every rank
    its own ``rng_state_R.pth`` on its own node."""
    d = node_dir / f"checkpoint-{step}"
    d.mkdir(parents=True, exist_ok=True)
    for r in ranks:
        (d / f"rng_state_{r}.pth").write_bytes(b"rng" * 100 + bytes([r]))
    if whole:
        (d / "model.safetensors").write_bytes(b"w" * 4096)
        (d / "trainer_state.json").write_text(f'{{"global_step": {step}}}')


def test_a_part_of_a_published_checkpoint_is_not_owed_by_the_next_leader(tmp_path: Path) -> None:
    """HF across nodes: node 1 keeps ``checkpoint-5/`` with only its ranks' ``rng_state_*.pth``
    after ``checkpoint-5`` was published whole. When that node leads the next attempt, its
    leftover part is a part of what is published, not a torn checkpoint the end owes (before:
    ``end.not_durable`` named every such directory, "incomplete: torn")."""
    ps = pairs(tmp_path)
    events: list[tuple[int, str, dict]] = []

    async def attempt_1() -> None:
        mirrors = {n: mirror(p, n, events) for n, p in ps.items()}
        async with anyio.create_task_group() as tg:
            for m in mirrors.values():
                await tg.start(m.run)
            hf_checkpoint(ps[1].src, 5, (2, 3), whole=False)
            hf_checkpoint(ps[0].src, 5, (0, 1), whole=True)
            with anyio.fail_after(20):
                while not (ps[0].dst / "checkpoint-5" / "rng_state_3.pth").exists():
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    async def attempt_2() -> dict:
        leader = mirror(ps[1], 0, events)
        async with anyio.create_task_group() as tg:
            await tg.start(leader.run)
            leader.training_exited()
            result = await leader.flush("final")
            tg.cancel_scope.cancel()
        return result

    anyio.run(attempt_1)
    assert sorted(p.name for p in (ps[0].dst / "checkpoint-5").iterdir()) == [
        "model.safetensors", "rng_state_0.pth", "rng_state_1.pth", "rng_state_2.pth", "rng_state_3.pth",
        "trainer_state.json"]
    result = anyio.run(attempt_2)
    assert not result["pending"], result


def test_whole_checkpoints_on_each_node_are_published_with_node_0s_view(tmp_path: Path) -> None:
    """HF with ``save_on_each_node``: every node writes a whole checkpoint of its own (each with
    the marker), and ``trainer_state.json`` differs between them by design
    (``is_world_process_zero``). Node 0's view is published with every node's
    ``rng_state_R.pth``, the paths that differed named (before: a ``part-conflict``, never
    published); neither node owes anything at the end."""
    ps = pairs(tmp_path)
    events: list[tuple[int, str, dict]] = []

    def write(node: int) -> None:
        d = ps[node].src / "checkpoint-5"
        d.mkdir(parents=True)
        for r in (2 * node, 2 * node + 1):
            (d / f"rng_state_{r}.pth").write_bytes(b"rng" * 100 + bytes([r]))
        (d / "optimizer.pt").write_bytes(b"o" * 2048)
        (d / "trainer_state.json").write_text(f'{{"global_step": 5, "is_world_process_zero": {str(node == 0).lower()}}}')

    async def main() -> list[dict]:
        mirrors = {n: mirror(p, n, events) for n, p in ps.items()}
        async with anyio.create_task_group() as tg:
            for m in mirrors.values():
                await tg.start(m.run)
            write(1)
            write(0)
            with anyio.fail_after(20):
                while not [f for n, k, f in events if n == 0 and k == "publish"]:
                    await anyio.sleep(0.05)
            for m in mirrors.values():
                m.training_exited()
            results = [await mirrors[n].flush("final") for n in (1, 0)]
            tg.cancel_scope.cancel()
        return results

    results = anyio.run(main)
    (pub,) = [f for n, k, f in events if n == 0 and k == "publish"]
    assert pub["differing"] == ["trainer_state.json"] and pub["parts"] == {"0": 4, "1": 4}, pub
    got = ps[0].dst / "checkpoint-5"
    assert sorted(p.name for p in got.iterdir()) == ["optimizer.pt", "rng_state_0.pth", "rng_state_1.pth",
                                                     "rng_state_2.pth", "rng_state_3.pth", "trainer_state.json"]
    assert '"is_world_process_zero": true' in (got / "trainer_state.json").read_text()
    assert not [f for _n, k, f in events if k in ("part-conflict", "sync-deferred")]
    assert all(not r["pending"] for r in results), results
