"""DeepSpeed's node-local mode under ``nodes = 2`` on its own (no cluster needed; issue 29, item 5).

With ``"checkpoint": {"use_node_local_storage": true}`` each node's local rank 0 writes the
model states on its node, every rank its own ZeRO shard, and global rank 0 alone ``latest``,
on node 0, with no barrier behind the other ranks' shards. Before:

* node 0's part waited for ranks 2-3's shards, which are on node 1, for ever: the profile
  asked one node for every rank's shard (``dp_world_size`` of the model states). Nothing
  was published;
* after a restore, node 1 holds the ``latest`` it restored, which nothing rewrites there:
  its next part waited for that pointer to name it, for ever, and once the training ended
  it called its own parts torn ("newer than latest"): ``end.not_durable`` named them;
* when that host became node 0 (the batch node died), the leader published that stale
  ``latest`` over the newer one on persistent storage, and the restore then called every
  checkpoint published since torn: every rank resumed from an older one.

Now every node's part holds its own ranks' shards, the parts together are asked for every
rank's (a late rank's shard keeps the checkpoint unpublished until its node's part is taken
again), and node 1 takes the leader's word past its stale ``latest``. The real Mirrors of
node 0 and node 1 in this process, as on the cluster; DeepSpeed's files as it names them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import pytest

from supervisor.config import SyncPair
from supervisor.sync import Mirror

MODEL = "mp_rank_00_model_states.pt"


def shard(rank: int) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def pairs(tmp_path: Path, attempt: int) -> dict[int, SyncPair]:
    # settle 30 s: node 1's parts are taken on the leader's word, never by quiet time here
    return {n: SyncPair(name="ckpt", kind="checkpoint", src=tmp_path / f"a{attempt}-node{n}", dst=tmp_path / "persist",
                        nodes=2, settle=30.0, restore=True) for n in (0, 1)}


def save(torch, ps: dict[int, SyncPair], step: int, late: int | None = None) -> None:  # noqa: ANN001
    """``engine.save_checkpoint(dir, tag=f"global_step{step}")`` of 4 ranks, 2 a node: the model
    states on each node (the same bytes), each rank's shard on its node (not ``late``'s),
    then ``latest`` on node 0."""
    tag = f"global_step{step}"
    for node, p in ps.items():
        (p.src / tag).mkdir(parents=True)
        if node == 0:
            torch.save({"module": {"w": torch.full((8,), float(step))}, "dp_world_size": 4}, p.src / tag / MODEL)
        else:
            shutil.copyfile(ps[0].src / tag / MODEL, p.src / tag / MODEL)
        for rank in (2 * node, 2 * node + 1):
            if rank != late:
                (p.src / tag / shard(rank)).write_bytes(f"{tag} rank {rank}".encode() * 50)
    (ps[0].src / "latest").write_text(tag)


async def wait_published(dst: Path, name: str, timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while not (dst / name).is_dir() or not (dst / "latest").exists() or (dst / "latest").read_text() != name:
            await anyio.sleep(0.05)


def test_node_local_deepspeed_checkpoints_are_published_and_resumed_on_every_node(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    events: list[tuple[int, str, dict]] = []
    whole = sorted([MODEL, *(shard(r) for r in range(4))])

    def mirrors(ps: dict[int, SyncPair]) -> dict[int, Mirror]:
        return {n: Mirror([p], emit=lambda kind, n=n, **f: events.append((n, kind, f)) or f, sync_every=600,
                          backend="python", node_rank=n, parts_poll=0.2) for n, p in ps.items()}

    async def attempt1() -> None:
        ps = pairs(tmp_path, 1)
        async with anyio.create_task_group() as tg:
            for m in mirrors(ps).values():
                await tg.start(m.run)
            save(torch, ps, 3)
            await wait_published(ps[0].dst, "global_step3")  # before: node 0 waited for ranks 2-3 for ever
            tg.cancel_scope.cancel()

    async def attempt2() -> None:
        """A requeue onto empty disks: every node restores global_step3 with ``latest``."""
        ps = pairs(tmp_path, 2)
        ms = mirrors(ps)
        choice = await ms[0].choose()
        assert choice == {"ckpt": "global_step3"}, choice
        for m in ms.values():
            await m.restore(choice)
        for p in ps.values():
            assert (p.src / "latest").read_text() == "global_step3"
            assert sorted(x.name for x in (p.src / "global_step3").iterdir()) == whole
        async with anyio.create_task_group() as tg:
            for m in ms.values():
                await tg.start(m.run)
            save(torch, ps, 6)
            await wait_published(ps[0].dst, "global_step6")  # before: node 1 waited for its `latest`
            # rank 3 late: node 1's part is taken on the leader's word without its shard
            save(torch, ps, 9, late=3)
            with anyio.fail_after(20):
                while not [f for n, k, f in events if k == "parts-waiting" and f.get("shards")]:
                    await anyio.sleep(0.05)
            await anyio.sleep(1.0)
            assert not (ps[0].dst / "global_step9").exists(), "published without rank 3's shard"
            (ps[1].src / "global_step9" / shard(3)).write_bytes(b"global_step9 rank 3" * 50)
            await wait_published(ps[0].dst, "global_step9")
            # the training ends: every node's checkpoints are durable (node 1 called its own
            # torn, "newer than latest", the one it restored, and the end named them not durable)
            for m in ms.values():
                m.training_exited()
                await m.flush("final")
                assert m.pending() == [], m.pending()
            tg.cancel_scope.cancel()

    async def attempt3() -> None:
        """Node 1's host is node 0 now (the batch node died), holding the ``latest`` it
        restored in attempt 2: never published over the newer one (it was, before, and the
        restore then called global_step6 and global_step9 torn and resumed from global_step3)."""
        ps = pairs(tmp_path, 3)
        ps[0] = SyncPair(name="ckpt", kind="checkpoint", src=tmp_path / "a2-node1", dst=tmp_path / "persist",
                         nodes=2, settle=30.0, restore=True)
        ms = mirrors(ps)
        choice = await ms[0].choose()
        assert (ps[0].dst / "latest").read_text() == "global_step9"
        assert choice == {"ckpt": "global_step9"}, choice

    anyio.run(attempt1)
    anyio.run(attempt2)
    anyio.run(attempt3)
    dst = tmp_path / "persist"
    for step in (3, 6, 9):
        assert sorted(x.name for x in (dst / f"global_step{step}").iterdir()) == whole, step
    assert torch.load(dst / "global_step9" / MODEL)["module"]["w"][0] == 9.0
    (waiting,) = [f for n, k, f in events if k == "parts-waiting" and f.get("shards")]
    assert waiting["checkpoint"] == "global_step9" and waiting["missing"] == [] and shard(3) in waiting["shards"], waiting
    publishes = [f for n, k, f in events if n == 0 and k == "publish" and f["checkpoint"].startswith("global_step")]
    assert [f["checkpoint"] for f in publishes] == ["global_step3", "global_step6", "global_step9"], publishes
    assert all(f["parts"] == {"0": 3, "1": 3} and f["shared"] == [MODEL] for f in publishes), publishes
    assert not [f for n, k, f in events if k == "part-conflict"]
    deferred = [(f["checkpoint"], f["reason"]) for n, k, f in events if k == "sync-deferred"]
    assert deferred == [("latest", "names global_step3, older than the global_step9 it names on persistent storage: "
                                   "never published over it")], deferred
