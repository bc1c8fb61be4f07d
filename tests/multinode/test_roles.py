"""Node K's role on its own (no cluster needed): the two defects the bar test found.

* Node K never sees rank 0's ``.metadata``; once a restore had put a checkpoint carrying one
  beside the new ones, node K's parts waited for that marker for ever (nothing published).
  Now they settle, and at once when the leader says node 0 saw the checkpoint complete.
* A host that was node 0 in the attempt before keeps a newer, unpublished checkpoint of
  ranks 0-1: an ordinary pair resumes from "the newer local one"; here it is set aside and
  the newest published checkpoint (every rank's shards) is restored.

Real files, the real Mirror with the python backend, in this process.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio

from supervisor.config import SyncPair
from supervisor.sync import Mirror
from supervisor.sync._aside import SET_ASIDE_DIR
from supervisor.sync._parts import go_path, manifest_path, write_go

SHARDS = [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]


def write(d: Path, names: list[str], tag: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for n in names:
        (d / n).write_bytes(f"{tag}:{n}".encode() * 100)


def pair(tmp_path: Path, settle: float) -> SyncPair:
    return SyncPair(name="ckpt", kind="checkpoint", src=tmp_path / "local", dst=tmp_path / "persist", nodes=2,
                    settle=settle, restore=True, profile="dcp")


def test_node_k_part_beside_a_restored_checkpoint_takes_the_leaders_word(tmp_path: Path) -> None:
    p = pair(tmp_path, settle=30.0)  # quiescence alone would take 30 s
    write(p.dst / "step_00010", SHARDS, "10")
    events: list[tuple[str, dict]] = []

    async def main() -> float:
        m = Mirror([p], emit=lambda kind, **f: events.append((kind, f)) or f, sync_every=600, backend="python",
                   node_rank=1, parts_poll=0.2)
        restored = await m.restore()
        assert restored == p.src / "step_00010" and (restored / ".metadata").exists()
        async with anyio.create_task_group() as tg:
            await tg.start(m.run)
            write(p.src / "step_00020", SHARDS[3:], "20")  # node 1's ranks 2-3, no marker here
            await anyio.sleep(1.0)
            assert not manifest_path(p.dst, "step_00020", 1).exists()  # waits: no word, not settled
            t = time.monotonic()
            write_go(p.dst, "step_00020")  # the leader saw rank 0's .metadata
            with anyio.fail_after(20):
                while not manifest_path(p.dst, "step_00020", 1).exists():
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
            return time.monotonic() - t

    took = anyio.run(main)
    # The leader's word, not quiet time: well inside the 30 s settle even on a loaded machine
    # (a copier process starts in between); the event below says which rule decided.
    assert took < 15.0, took
    part = next(f for k, f in events if k == "part")
    assert part["checkpoint"] == "step_00020" and part["why"] == "node 0 saw it complete"
    assert sorted(x.name for x in (p.dst / ".supervise-parts" / "step_00020" / "node-1").iterdir()) == SHARDS[3:]
    assert go_path(p.dst, "step_00020").exists()


def test_an_unpublished_local_checkpoint_is_set_aside_and_the_published_one_restored(tmp_path: Path) -> None:
    p = pair(tmp_path, settle=1.0)
    write(p.dst / "step_00020", SHARDS, "20")
    write(p.src / "step_00020", SHARDS[:3], "20")  # written as node 0 before: ranks 0-1 only
    write(p.src / "step_00030", SHARDS[:3], "30")  # newer, complete by its marker, never published
    events: list[tuple[str, dict]] = []

    async def main() -> Path | None:
        m = Mirror([p], emit=lambda kind, **f: events.append((kind, f)) or f, sync_every=600, backend="python",
                   node_rank=1, parts_poll=0.2)
        return await m.restore()

    restored = anyio.run(main)
    assert restored == p.src / "step_00020"
    assert sorted(x.name for x in restored.iterdir()) == SHARDS  # every rank's shards, not the old two
    assert not (p.src / "step_00030").exists()
    assert sorted(x.name for x in (p.src / SET_ASIDE_DIR / "step_00030").iterdir()) == SHARDS[:3]
    aside = [f for k, f in events if k == "part-set-aside"]
    assert [(f["checkpoint"], f["node"]) for f in aside] == [("step_00030", 1)]


def test_a_single_file_checkpoint_from_one_node_is_published_whole(tmp_path: Path) -> None:
    """Rank 0 on a node other than the batch node saves ``model_00010.pt`` (torch.save, only
    there): node 1's part is the whole checkpoint; the leader publishes it without node 0's."""
    torch = __import__("pytest").importorskip("torch")
    leader_pair = SyncPair(name="ckpt", kind="checkpoint", src=tmp_path / "n1", dst=tmp_path / "persist", nodes=2,
                           settle=0.5, profile="torch-save")
    node_pair = SyncPair(name="ckpt", kind="checkpoint", src=tmp_path / "n2", dst=tmp_path / "persist", nodes=2,
                         settle=0.5, profile="torch-save")
    events: list[tuple[int, str, dict]] = []

    async def main() -> None:
        mirrors = [Mirror([pp], emit=lambda kind, n=n, **f: events.append((n, kind, f)) or f, sync_every=600,
                          backend="python", node_rank=n, parts_poll=0.2) for n, pp in ((0, leader_pair), (1, node_pair))]
        async with anyio.create_task_group() as tg:
            for m in mirrors:
                await tg.start(m.run)
            node_pair.src.mkdir(parents=True, exist_ok=True)
            torch.save({"w": torch.arange(1000)}, node_pair.src / "model_00010.pt.tmp")
            (node_pair.src / "model_00010.pt.tmp").rename(node_pair.src / "model_00010.pt")
            with anyio.fail_after(15):  # the leader's journal line, not the file: it is there a moment before the line
                while not any(n == 0 and k == "publish" for n, k, _f in events):
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    anyio.run(main)
    got = torch.load(leader_pair.dst / "model_00010.pt")
    assert torch.equal(got["w"], torch.arange(1000))
    publish = next(f for n, k, f in events if n == 0 and k == "publish")
    assert publish["checkpoint"] == "model_00010.pt" and publish["parts"] == {"1": 1}
