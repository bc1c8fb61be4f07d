"""A per-node pair on an object store, in this process (no cluster): two real Mirrors, node 0
(the leader) and node 1, each with its own local disk and no shared directory, one real S3
server. Each node uploads its own part; the leader publishes the manifest only once both
parts are there, and only then; both nodes restore the leader's choice, every rank's shards.
The cluster version (srun, torchrun, requeues, nodes killed) is
tests/multinode/test_ddp_tutorial.py's object-store test."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from supervisor.config import StoreSpec, SyncPair
from supervisor.sync import Mirror
from tests.support.s3 import Bucket, S3Server
from tests.support.wait import wait_for_async

SHARDS = {0: [".metadata", "__0_0.distcp", "__1_0.distcp"], 1: ["__2_0.distcp", "__3_0.distcp"]}


def write(d: Path, names: list[str], tag: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for n in names:
        (d / n).write_bytes(f"{tag}:{n}".encode() * 1000)


def test_the_leader_publishes_only_once_every_nodes_part_is_in_the_bucket(
        bucket: Bucket, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    url = bucket.url("job/ckpt")
    pairs = {n: SyncPair(name="ckpt", kind="checkpoint", src=tmp_path / f"node{n}", dst=Path(url), nodes=2, settle=0.5,
                         restore=True, profile="dcp", store=StoreSpec.parse(url)) for n in (0, 1)}
    events: list[tuple[int, str, dict]] = []

    def said(node: int, kind: str) -> bool:
        return any(n == node and k == kind for n, k, _f in events)

    def mirror(n: int) -> Mirror:
        return Mirror([pairs[n]], emit=lambda kind, n=n, **f: events.append((n, kind, f)) or f, sync_every=600,
                      node_rank=n, parts_poll=0.2)

    async def main() -> None:
        mirrors = [mirror(0), mirror(1)]
        for m in mirrors:
            m.check()  # the probe: this run can list, write and delete there
        async with anyio.create_task_group() as tg:
            for m in mirrors:
                await tg.start(m.run)
            write(pairs[0].src / "step_00010", SHARDS[0], "10")  # rank 0's .metadata: node 0 says go
            # the leader's own evidence that it looked and waits: node 0's part is in, node 1's is not
            await wait_for_async(lambda: bucket.get("job/ckpt/.supervise/parts/step_00010/node-0.json")
                                 and said(0, "parts-waiting"), 60, lambda: f"node 0's part, waiting: {events}")
            assert bucket.manifest("job/ckpt", "step_00010") is None  # node 1's part is not there: nothing visible
            write(pairs[1].src / "step_00010", SHARDS[1], "10")
            # the publish is done when the leader says so (``publish``, after it removed the part
            # manifests), not when the checkpoint's manifest appears: that is its first step
            await wait_for_async(lambda: said(0, "publish"), 60, lambda: f"node 0's publish: {events}")
            tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        print("\n".join(f"{n} {k} {f}" for n, k, f in events))
    doc = bucket.manifest("job/ckpt", "step_00010")
    assert doc is not None and sorted(doc["files"]) == sorted(SHARDS[0] + SHARDS[1]) and bucket.whole(doc) == []
    assert doc["parts"] == {"0": 3, "1": 2}
    assert not bucket.keys("job/ckpt/.supervise/parts/"), "part manifests left after the publish"
    waiting = [f for n, k, f in events if k == "parts-waiting"]
    assert waiting and waiting[0]["missing"] == [1], waiting
    part1 = next(f for n, k, f in events if n == 1 and k == "part")
    assert part1["why"] in ("node 0 saw it complete", "settled"), part1
    publish = next(f for n, k, f in events if n == 0 and k == "publish")
    assert publish["why"] == "all 2 parts" and publish["nodes"] == 2, publish

    # a requeue onto two empty disks: the leader chooses, both restore the same, whole version
    for n in (0, 1):
        pairs[n] = SyncPair(**{**pairs[n].__dict__, "src": tmp_path / f"new{n}"})

    async def restore() -> list[Path | None]:
        leader, node = mirror(0), mirror(1)
        choice = await leader.choose()
        return [await leader.restore(choice), await node.restore(choice)]

    got = anyio.run(restore)
    assert got == [tmp_path / "new0" / "step_00010", tmp_path / "new1" / "step_00010"], got
    for d in got:
        assert d is not None and sorted(x.name for x in d.iterdir()) == sorted(SHARDS[0] + SHARDS[1])
        assert (d / "__3_0.distcp").read_bytes() == (tmp_path / "node1" / "step_00010" / "__3_0.distcp").read_bytes()
