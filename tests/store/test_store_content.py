"""A checkpoint's objects addressed by content (issue 45): an unchanged file (a frozen base,
a config) and identical replicas go up once across versions; replacing or pruning a version
deletes only the objects no kept manifest names; a supervise killed mid-upload leaves nothing
the next attempt does not collect; a restore verifies every byte and downloads only what the
node lacks. Real SeaweedFS, the real ``supervise``, the bytes counted as the client sent them
(the ``sync`` events). docs/sync.md, "Object stores"; the layout: supervisor/sync/_storepub.py."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from pathlib import Path

from supervisor.sync._manifest import keys_of
from tests.support.journal import events
from tests.support.s3 import Bucket, S3Server
from tests.support.supervise import killed_on_exit, run_supervise, start_supervise
from tests.support.wait import wait_for

WRITER = Path(__file__).parents[1] / "helpers" / "frozen_writer.py"
PY = sys.executable
MiB = 1 << 20


def _sent(run: Path, pair: str, attempt: int | None = None) -> tuple[int, int]:
    """Bytes and objects the checkpoint pair's uploads sent, as the client counted them."""
    ev = [e for e in events(run / "events.jsonl", "sync") if e["pair"] == pair and (attempt is None or e["attempt"] == attempt)]
    return sum(e["bytes"] for e in ev), sum(e["files"] for e in ev)


def _objects(bucket: Bucket, prefix: str) -> dict[str, int]:
    return bucket.keys(f"{prefix}/.supervise/objects/")


def _keys(doc: dict) -> set[str]:
    return {k for f in doc["files"].values() for k in keys_of(f)}


def _named(bucket: Bucket, prefix: str) -> set[str]:
    return {k for doc in bucket.manifests(prefix).values() for k in _keys(doc)}


def _run(run: Path, local: Path, bucket: Bucket, prefix: str, s3: S3Server, *args: str, restore: bool = False):
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), bucket.url(prefix),
                      *(["--restore"] if restore else []), "--", PY, str(WRITER), str(local), *args,
                      env=s3.env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_an_unchanged_file_and_identical_replicas_go_up_once_and_a_restore_fetches_only_what_the_node_lacks(
        bucket: Bucket, s3_server: S3Server, tmp_path: Path) -> None:
    local, run, prefix = tmp_path / "ckpt", tmp_path / "run", "cas/frozen"
    _run(run, local, bucket, prefix, s3_server, "--steps", "4", "--base", str(9 * MiB), "--adapter", str(MiB),
         "--model", str(16 * MiB))
    docs = bucket.manifests(prefix)
    assert sorted(docs) == [f"step_{n:06d}" for n in (1, 2, 3, 4)], sorted(docs)
    for doc in docs.values():
        assert bucket.whole(doc) == [], doc["checkpoint"]
    sizes = {k: f["size"] for doc in docs.values() for f in doc["files"].values() if "key" in f for k in [f["key"]]}
    sizes.update({p["key"]: p["size"] for doc in docs.values() for f in doc["files"].values() for p in f.get("parts", ())})
    sent, objects = _sent(run, local.name)
    # each distinct object once: the base's two parts, model.bin's two frozen 8 MiB parts and the
    # config once; each step's adapter, its model tail, one of its two replicas
    assert sent == sum(sizes.values()) and objects == len(sizes), (sent, objects, len(sizes))
    first = 9 * MiB + 17 * MiB + MiB + 4096 + 28 + 1
    changed = first + 3 * (2 * MiB + 4096 + 1)  # after the first: the adapter, model.bin's tail, a replica, the marker
    assert sent <= changed, (sent, changed)
    every = sum(f["size"] for doc in docs.values() for f in doc["files"].values())
    assert every > 4 * 26 * MiB and sent < every / 3, (sent, every)  # the layout before sent every byte of every version
    assert _objects(bucket, prefix).keys() == _named(bucket, prefix)

    # a requeue onto the same node: step 4's base, model and config are still there, its adapter
    # and marker lost, one replica damaged (same size and mtime, other bytes): only those come
    # down, each verified
    newest = local / "step_000004"
    (newest / "adapter.bin").unlink()
    (newest / ".metadata").unlink()
    st = (newest / "rank_1.bin").stat()
    (newest / "rank_1.bin").write_bytes(b"\0" * 4096)
    os.utime(newest / "rank_1.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
    for d in sorted(local.glob("step_00000[123]")):
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    _run(run, local, bucket, prefix, s3_server, "--steps", "4", restore=True)
    restore = [e for e in events(run / "events.jsonl", "restore") if e["attempt"] == 2][0]
    assert restore["checkpoint"] == "step_000004", restore
    assert restore["bytes"] == MiB + 4096 + 1, restore  # the adapter, the damaged replica, the marker; never the base
    for rel, f in docs["step_000004"]["files"].items():
        assert hashlib.sha256((newest / rel).read_bytes()).hexdigest() == f["sha256"], rel


def test_replacing_and_pruning_a_version_delete_only_the_objects_no_kept_manifest_names(
        bucket: Bucket, s3_server: S3Server, tmp_path: Path) -> None:
    local, run, prefix = tmp_path / "ckpt", tmp_path / "run", "cas/retain"
    # snapshot/ rewritten each step with that step's adapter: each version it replaces shares
    # its adapter with step_N and its base with every version
    _run(run, local, bucket, prefix, s3_server, "--steps", "3", "--snapshot", "--base", str(2 * MiB), "--step-time", "1.5")
    docs = bucket.manifests(prefix)
    assert sorted(docs) == ["snapshot", "step_000001", "step_000002", "step_000003"], sorted(docs)
    assert docs["snapshot"]["files"]["adapter.bin"]["sha256"] == docs["step_000003"]["files"]["adapter.bin"]["sha256"]
    for doc in docs.values():
        assert bucket.whole(doc) == [], doc["checkpoint"]  # the replaced snapshots' adapters: still step_1's and step_2's
    assert _objects(bucket, prefix).keys() == _named(bucket, prefix)

    # pruned by hand: step_1's manifest removed; the next attempt's first pass removes what only it named
    only = _keys(docs["step_000001"]) - {k for n, d in docs.items() if n != "step_000001" for k in _keys(d)}
    assert only and len(only) < len(docs["step_000001"]["files"])  # its adapter and replicas; not the base, the config
    _delete(bucket, f"{prefix}/.supervise/manifests/step_000001.json")
    (local / "step_000001" / ".metadata").unlink()  # and locally, so the next pass does not publish it again
    _run(run, local, bucket, prefix, s3_server, "--steps", "3")
    objs = _objects(bucket, prefix)
    assert not only & objs.keys(), only & objs.keys()
    assert objs.keys() == _named(bucket, prefix)
    for doc in bucket.manifests(prefix).values():
        assert bucket.whole(doc) == [], doc["checkpoint"]
    collected = [e for e in events(run / "events.jsonl", "store-collected") if e["attempt"] == 2]
    assert collected and collected[0]["objects"] == len(only), collected


def _delete(bucket: Bucket, key: str) -> None:
    import obstore

    obstore.delete(bucket.store, key)


def _left_behind(bucket: Bucket, prefix: str) -> dict[str, int]:
    """The killed attempt's objects, once the store's clock is past the second the newest was
    put in and a listing then finds no more. S3's Last-Modified counts whole seconds, and the
    collection takes only objects put before the start check's second (an upload of the new
    attempt may share it): one put in that second is left for the attempt after (docs/sync.md,
    "Object stores"). And a put whose body reached the server before its client died still
    completes there, after the kill."""
    import obstore

    def clock_past(newest: object) -> bool:
        key = f"clock/{os.getpid()}"
        obstore.put(bucket.store, key, b"now")
        return obstore.head(bucket.store, key)["last_modified"] > newest

    left: dict[str, int] = {}
    while (now := _objects(bucket, prefix)) != left:
        left = now
        newest = max(obstore.head(bucket.store, k)["last_modified"] for k in left)
        wait_for(lambda: clock_past(newest), 10, "the store's clock past the killed attempt's last put", interval=0.1)
    return left


def test_a_supervise_killed_mid_upload_leaves_nothing_the_next_attempt_does_not_collect(
        bucket: Bucket, s3_server: S3Server, tmp_path: Path) -> None:
    local, run, prefix = tmp_path / "ckpt", tmp_path / "run", "cas/killed"
    # one checkpoint of 12 files of 24 MiB, all different: its objects go up one after another
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), bucket.url(prefix), "--",
                        PY, str(WRITER), str(local), "--steps", "1", "--distinct", "12", "--adapter", str(24 * MiB),
                        "--step-time", "0.1", env=s3_server.env, start_new_session=True)
    with killed_on_exit(p):
        wait_for(lambda: len(_objects(bucket, prefix)) >= 2, 120, "objects uploaded", interval=0.02)
        os.kill(p.pid, signal.SIGKILL)  # between its uploads and its manifest
        p.wait(10)
        try:
            os.killpg(p.pid, signal.SIGKILL)  # and what was left of its group
        except ProcessLookupError:
            pass
    left = _left_behind(bucket, prefix)
    assert bucket.manifests(prefix) == {} and left, left  # objects that no manifest names
    _run(run, local, bucket, prefix, s3_server, "--steps", "0")
    doc = bucket.manifest(prefix, "step_000001")
    assert doc is not None and bucket.whole(doc) == []  # the next attempt published it
    assert _objects(bucket, prefix).keys() == _named(bucket, prefix)
    collected = [e for e in events(run / "events.jsonl", "store-collected") if e["attempt"] == 2]
    assert collected and collected[0]["objects"] == len(left), (collected, left)  # attempt 1's, before any upload


def _put_before(bucket: Bucket, prefix: str, name: str, files: dict[str, bytes]) -> dict:
    """A version as issue 34's layout wrote it: each file under its own key
    (``<checkpoint>/<path>``, a 9 MiB file as one object), named by the same manifest format."""
    doc = {"v": 1, "checkpoint": name, "is_dir": True, "bytes": sum(len(d) for d in files.values()),
           "why": "marker .metadata", "done_at": None, "step": int(name.split("_")[-1]) if name.startswith("step_") else None,
           "restorable": True, "markers": [".metadata"],
           "newest_ns": 1_700_000_000_000_000_000, "profile": None, "nodes": 1, "published_at": 1_700_000_000.0,
           "files": {rel: {"key": f"{prefix}/{name}/{rel}", "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                           "mtime_ns": 1_700_000_000_000_000_000} for rel, data in files.items()}}
    for rel, data in files.items():
        bucket.put(f"{prefix}/{name}/{rel}", data)
    bucket.put(f"{prefix}/.supervise/manifests/{name}.json", json.dumps(doc).encode())
    return doc


def test_a_bucket_in_the_layout_before_still_restores_verified(bucket: Bucket, s3_server: S3Server, tmp_path: Path) -> None:
    """Issue 34's layout: restored and verified."""
    local, run, prefix = tmp_path / "ckpt", tmp_path / "run", "cas/before"
    files = {"base.bin": b"b" * (9 * MiB), "adapter.bin": b"a" * MiB, ".metadata": b"1"}
    doc = _put_before(bucket, prefix, "step_000001", files)
    r = _run(run, local, bucket, prefix, s3_server, "--steps", "1", restore=True)
    assert "resumed 1" in r.stdout, r.stdout
    restore = [e for e in events(run / "events.jsonl", "restore") if e["attempt"] == 1][0]
    assert restore["checkpoint"] == "step_000001" and restore["bytes"] == doc["bytes"], restore
    for rel, data in files.items():
        assert (local / "step_000001" / rel).read_bytes() == data, rel
    assert bucket.keys(f"{prefix}/.supervise/objects/") == {}  # nothing sent again: the restored version is the published one


def test_a_version_in_the_layout_before_replaced_leaves_none_of_its_keys_and_another_keeps_all(
        bucket: Bucket, s3_server: S3Server, tmp_path: Path) -> None:
    """A run whose first attempt published before issue 45 (``snapshot`` under its own keys:
    written here in that layout over what attempt 1 published, as the supervise before wrote
    it) and a version of another run beside it (``step_000009``). Attempt 2 rewrites
    ``snapshot``: the new version's manifest names objects by content, and the keys only the
    replaced version named are deleted; ``step_000009``, which nothing replaced, keeps every
    key (docs/sync.md, "Object stores")."""
    local, run, prefix = tmp_path / "ckpt", tmp_path / "run", "cas/replaced"
    _run(run, local, bucket, prefix, s3_server, "--steps", "1", "--snapshot", "--base", str(MiB))
    files = {rel: (local / "snapshot" / rel).read_bytes() for rel in ("base.bin", "adapter.bin", "config.json",
                                                                      "rank_0.bin", "rank_1.bin", ".metadata")}
    before = _put_before(bucket, prefix, "snapshot", files)
    other = _put_before(bucket, prefix, "step_000009", {"base.bin": b"k" * MiB, ".metadata": b"9"})
    _run(run, local, bucket, prefix, s3_server, "--steps", "2", "--snapshot", "--base", str(MiB))
    docs = bucket.manifests(prefix)
    assert docs["snapshot"]["files"]["adapter.bin"]["sha256"] == docs["step_000002"]["files"]["adapter.bin"]["sha256"]
    assert bucket.whole(docs["snapshot"]) == [] and docs["step_000009"] == other and bucket.whole(other) == []
    left = bucket.keys(f"{prefix}/")
    assert not {f["key"] for f in before["files"].values()} & left.keys(), sorted(left)  # the replaced version's own keys
    assert {f["key"] for f in other["files"].values()} <= left.keys(), sorted(left)


def test_one_changed_tensor_of_a_safetensors_file_sends_about_that_tensor_and_restores_byte_for_byte(
        bucket: Bucket, s3_server: S3Server, tmp_path: Path) -> None:
    """One ``model.safetensors`` of 21 MiB whose ``b.weight`` (3 MiB, straddling the 8 MiB
    offset) changes between two checkpoints, the rest the same: a whole-state save with a
    frozen base. Its parts are cut at the tensors (``_cuts``): the second version sends that
    tensor, not the fixed 8 MiB parts it straddles (16 MiB)."""
    local, run, prefix = tmp_path / "ckpt", tmp_path / "run", "cas/tensors"
    _run(run, local, bucket, prefix, s3_server, "--steps", "1", "--safetensors")
    _run(run, local, bucket, prefix, s3_server, "--steps", "2", "--safetensors")  # attempt 2: step 2 only
    path = local / "step_000002" / "model.safetensors"
    data = path.read_bytes()
    header = 8 + int.from_bytes(data[:8], "little")
    start, end = json.loads(data[8:header])["b.weight"]["data_offsets"]
    tensor = end - start
    sent, objects = _sent(run, local.name, attempt=2)
    assert sent <= 1.05 * (tensor + header) + 1, (sent, tensor, header, objects)  # and the marker's byte
    doc = bucket.manifests(prefix)["step_000002"]
    f = doc["files"]["model.safetensors"]
    assert sum(p["size"] for p in f["parts"]) == f["size"] == len(data) and bucket.file(f) == data
    assert bucket.whole(doc) == [] and _objects(bucket, prefix).keys() == _named(bucket, prefix)

    # the restore onto a node that has nothing: brought back from its parts, byte for byte
    for d in local.glob("step_*"):
        for g in d.iterdir():
            g.unlink()
        d.rmdir()
    _run(run, local, bucket, prefix, s3_server, "--steps", "2", "--safetensors", restore=True)
    restore = [e for e in events(run / "events.jsonl", "restore") if e["attempt"] == 3][0]
    assert restore["checkpoint"] == "step_000002" and restore["bytes"] == len(data) + 1, restore  # and the marker
    assert path.read_bytes() == data


def test_an_object_an_upload_of_this_process_holds_is_never_deleted_and_one_deleted_first_is_sent_again(
        bucket: Bucket, s3_server: S3Server) -> None:
    """The guard between this process's uploads and its deletions, against the real server
    (the race it closes has no reliable timing end to end): an object an upload found and
    pinned survives a collection that would delete it, until unpinned; an object deleted
    after the upload's listing and before its pin is not taken as held (it is sent again)."""
    import anyio

    from supervisor.sync._manifest import space
    from supervisor.sync._store import Store, StoreSpec
    from supervisor.sync._storepub import collect, present

    prefix, owner = "cas/pins", "/runs/pins"
    store = Store(StoreSpec.parse(bucket.url(prefix)), s3_server.env)
    pinned, dropped = (store.key(f"{space(owner)}{c * 64}") for c in "ab")
    for key in (pinned, dropped):
        bucket.put(key, b"x" * 1000)  # objects no manifest names: what a collection deletes

    async def main() -> None:
        pins: list[str] = []
        have = await present(store, owner, pins)  # the upload lists both
        have.pin(pinned)
        assert have.holds(pinned, 1000)
        assert await collect(store, owner) == [dropped]  # the collection spares the pinned one
        have.pin(dropped)
        assert not have.holds(dropped, 1000)  # deleted since the listing: not held, sent again
        store.unpin(pins)
        assert await collect(store, owner) == [pinned]  # unpinned, its manifest written (here: none)

    anyio.run(main)
    assert _objects(bucket, prefix) == {}
