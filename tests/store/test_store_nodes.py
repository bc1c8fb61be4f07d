"""A per-node pair on an object store, in this process (no cluster): two real Mirrors, node 0
(the leader) and node 1, each with its own local disk and no shared directory, one real S3
server. Each node uploads its own part; the leader publishes the manifest only once both
parts are there, and only then; both nodes restore the leader's choice, every rank's shards.
The cluster version (srun, torchrun, requeues, nodes killed) is
tests/multinode/test_ddp_tutorial.py's object-store test."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

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
    assert publish["why"] == "all 2 parts" and publish["nodes"] == 2 and publish["shared"] == [], publish

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


def test_a_leader_stopped_between_the_manifest_and_removing_the_parts_leaves_nothing_the_next_attempt_trips_on(
        bucket: Bucket, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader's publish is the checkpoint's manifest, then the removal of the part manifests
    and the go object. A leader killed between the two leaves all three behind. The next
    attempt's leader collects them (the part manifests as parts the published version holds,
    the go object as a word no part of node 0's stands behind), and a node that rewrites that
    checkpoint's directory is not told by the old go object that node 0 saw it complete:
    it waits for the leader's word on the new version (``settle`` is long here)."""
    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    url = bucket.url("job/ckpt")
    parts = "job/ckpt/.supervise/parts/step_00010/"
    events: list[tuple[int, str, dict]] = []

    def mirror(n: int, src: Path, settle: float) -> Mirror:
        pair = SyncPair(name="ckpt", kind="checkpoint", src=src, dst=Path(url), nodes=2, settle=settle,
                        restore=True, profile="dcp", store=StoreSpec.parse(url))
        return Mirror([pair], emit=lambda kind, n=n, **f: events.append((n, kind, f)) or f, sync_every=600,
                      node_rank=n, parts_poll=0.2)

    def said(node: int, kind: str, since: int = 0) -> list[dict]:
        return [f for n, k, f in events[since:] if n == node and k == kind]

    async def until(ms: list[Mirror], cond: Callable[[], object], what: str) -> None:
        """``ms`` running until ``cond`` holds."""
        async with anyio.create_task_group() as tg:
            for m in ms:
                await tg.start(m.run)
            await wait_for_async(cond, 60, lambda: f"{what}: {events}")
            tg.cancel_scope.cancel()

    # Attempt 1, one agent at a time, so each step is seen whole: node 0's part and its go
    # word, node 1's part, then the leader's publish. Written long ago: a later version is newer.
    for n in (0, 1):
        write(tmp_path / f"node{n}" / "step_00010", SHARDS[n], "10")
        for f in (tmp_path / f"node{n}" / "step_00010").iterdir():
            os.utime(f, (time.time() - 100, time.time() - 100))
    anyio.run(until, [mirror(0, tmp_path / "node0", 0.5)],
              lambda: bucket.get(parts + "node-0.json") and bucket.get(parts + "go"), "node 0's part and go")
    anyio.run(until, [mirror(1, tmp_path / "node1", 0.5)], lambda: bucket.get(parts + "node-1.json"), "node 1's part")
    left = {k: bucket.get(k) for k in bucket.keys(parts)}
    assert sorted(k.rsplit("/", 1)[1] for k in left) == ["go", "node-0.json", "node-1.json"], left
    anyio.run(until, [mirror(0, tmp_path / "node0", 0.5)], lambda: said(0, "publish"), "the publish")
    first = bucket.manifest("job/ckpt", "step_00010")
    assert first is not None and first["parts"] == {"0": 3, "1": 2} and not bucket.keys(parts)
    for k, data in left.items():  # as the leader left them, killed right after the manifest
        assert data is not None
        bucket.put(k, data)

    # Attempt 2, on other disks. The leader's first pass collects what the killed one left.
    at = len(events)
    mark = [0]  # where node 0's new files were written

    async def attempt2() -> None:
        leader, node = mirror(0, tmp_path / "new0", 0.5), mirror(1, tmp_path / "new1", 600)
        async with anyio.create_task_group() as tg:
            await tg.start(leader.run)
            await wait_for_async(lambda: any(f["trigger"] == "start" for f in said(0, "sync", at)), 60,
                                 lambda: f"the leader's first pass: {events[at:]}")
            assert not bucket.keys(parts), "the killed leader's part manifests and go word left after the next one's first pass"
            await tg.start(node.run)
            # the training rewrites that directory (a name reused); node 1's shards first
            write(tmp_path / "new1" / "step_00010", SHARDS[1], "20")
            await wait_for_async(lambda: any("step_00010 (incomplete" in line for line in node.pending()), 60,
                                 lambda: f"node 1 judging its new files: {node.pending()} {events[at:]}")
            assert not said(1, "part", at), f"node 1 staged before node 0 said go: {events[at:]}"
            mark[0] = len(events)
            write(tmp_path / "new0" / "step_00010", SHARDS[0], "20")  # rank 0's .metadata: the go for this version
            await wait_for_async(lambda: said(0, "publish", mark[0]), 60, lambda: f"the second publish: {events[at:]}")
            tg.cancel_scope.cancel()

    anyio.run(attempt2)
    part1 = said(1, "part", at)  # once, on the word node 0 gave after its marker: not before it was written
    assert [f["why"] for f in part1] == ["node 0 saw it complete"] and part1 == said(1, "part", mark[0]), events[at:]
    doc = bucket.manifest("job/ckpt", "step_00010")
    assert doc is not None and doc["parts"] == {"0": 3, "1": 2} and bucket.whole(doc) == [], doc
    for n in (0, 1):
        for name in SHARDS[n]:
            got = bucket.get(doc["files"][name]["key"])
            assert got == (tmp_path / f"new{n}" / "step_00010" / name).read_bytes(), name
    assert not bucket.keys(parts), "part manifests left after the second publish"


def test_a_node_waits_for_node_0s_word_on_every_version_of_a_reused_directory(
        bucket: Bucket, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory rewritten in place (one name, version after version): node 1's part of each
    version is complete only on node 0's word for that version (``settle`` is long here), not on
    the word it had for the one before, which the leader's publish removed."""
    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    url = bucket.url("job/ckpt")
    events: list[tuple[int, str, dict]] = []

    def mirror(n: int, settle: float) -> Mirror:
        pair = SyncPair(name="ckpt", kind="checkpoint", src=tmp_path / f"node{n}", dst=Path(url), nodes=2,
                        settle=settle, restore=True, profile="dcp", store=StoreSpec.parse(url))
        return Mirror([pair], emit=lambda kind, n=n, **f: events.append((n, kind, f)) or f, sync_every=600,
                      node_rank=n, parts_poll=0.2)

    def said(node: int, kind: str, since: int) -> list[dict]:
        return [f for n, k, f in events[since:] if n == node and k == kind]

    async def main() -> None:
        leader, node = mirror(0, 0.5), mirror(1, 600)
        async with anyio.create_task_group() as tg:
            for m in (leader, node):
                await tg.start(m.run)
            for version in ("v1", "v22"):  # other sizes: within 1 s, same-sized files look like one version
                at = len(events)
                write(tmp_path / "node1" / "step_00010", SHARDS[1], version)
                await wait_for_async(lambda: any("step_00010 (incomplete" in line for line in node.pending())
                                     or said(1, "part", at), 60, lambda: f"node 1 judging version {version}: {events[at:]}")
                assert not said(1, "part", at), f"node 1 staged version {version} before node 0 said go: {events[at:]}"
                mark = len(events)
                write(tmp_path / "node0" / "step_00010", SHARDS[0][1:] + SHARDS[0][:1], version)  # .metadata last
                await wait_for_async(lambda: said(0, "publish", mark), 60, lambda: f"publish {version}: {events[at:]}")
                assert [f["why"] for f in said(1, "part", at)] == ["node 0 saw it complete"], events[at:]
                doc = bucket.manifest("job/ckpt", "step_00010")
                assert doc is not None and doc["parts"] == {"0": 3, "1": 2} and bucket.whole(doc) == [], doc
                for n in (0, 1):
                    for name in SHARDS[n]:
                        assert bucket.get(doc["files"][name]["key"]) == f"{version}:{name}".encode() * 1000, name
                await node.flush("after the publish")  # a pass of node 1's that sees its part taken
            tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        print("\n".join(f"{n} {k} {f}" for n, k, f in events))
