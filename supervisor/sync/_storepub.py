"""Checkpoint publishing and restore where the persistent side is an object store.

``StoreSide`` is the persistent side (``_side.Side``) that ``_publish.Publisher`` is given for
an ``s3://`` pair: a checkpoint's files are uploaded concurrently as objects addressed by
their content, checked against the local side once more, and only then does its manifest land
(``_manifest.py``), with ``If-None-Match: *`` for a name this run never published and
``If-Match`` on the ETag read before for a new version of its own. A second run writing the
same prefix is refused, never overwritten (``sync-refused``). Pointers are manifests too,
moved the same way. ``StoreRestore`` is the side ``_restore.Restorer`` is given: it lists the
manifests, downloads in parallel into a local staging name, verifies each file's size and
sha256, and renames it into place.

Bytes moved in proportion to bytes changed (issue 45). A file under ``CHUNK`` (8 MiB) is one
object, ``.supervise/objects/<run>/<sha256>`` (``_manifest.space``: this run's, shared by its
attempts and nodes); a larger one is parts of at most ``CHUNK``, each an object by its own
hash, cut at its tensors for a safetensors file and at fixed offsets for any other (``_cuts``).
Every file is hashed before it goes up, and an object the bucket holds (one listing per
upload: ``present``) is not sent again: a frozen base, a config, identical replicas (HF's
``save_on_each_node``), and the parts of a whole-state file that hold frozen tensors go up
once, and a manifest names objects earlier versions uploaded. Parts, not whole files: HF saves
the whole state dict each time, and ``bench/s3.py --shapes frozen`` measured one object per
file at 1.22x the changed bytes on sharded safetensors and 5.5x on one file, fixed 8 MiB parts
at 1.00x and 1.55x, parts cut at the tensors at 1.00x and 1.004x. Deleting: only objects of this run's space that no manifest and no part
manifest under the prefix names (``referenced``), and none an upload of this process pins
(``Store.pinned``, until its manifest is written); objects put before this process's start
check that nothing names (a pass killed between its uploads and its manifest) go at the first
pass (``collect``). Rules: docs/sync.md, "Object stores".
"""

from __future__ import annotations

import datetime
import math
import os
import secrets
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import anyio

from supervisor.sync._backend import CopyResult
from supervisor.sync._complete import Entry, Listing, Pointer, Snap
from supervisor.sync._manifest import (
    MANIFESTS, PARTS, POINTERS, checkpoint_doc, claim_rel, dumps, entry_of, keys_of, loads, manifest_rel, pointer_doc,
    pointer_of, pointer_rel, profile_of, space, stored_as,
)
from supervisor.sync._content import holds_version
from supervisor.sync._fill import Fetch, Mismatch, fill, local_candidates
from supervisor.sync._peers import PERSISTENT_WAIT_S
from supervisor.sync._side import RECOPY_TRIES, Brought, Landed, Ledger, same_files
from supervisor.sync._state import PairState, to_thread
from supervisor.sync._backend import first_failure
from supervisor.sync._store import (
    BATCH_BYTES, BATCH_FILES, CHUNK, SMALL, Changed, Exists, Store, StoreError, download_parts, put_parts,
)


async def upload(store: Store, root: Path, e: Entry, owner: str,
                 pins: list[str]) -> tuple[dict[str, dict[str, Any]], int, int]:
    """Every file of ``e`` (under ``root``) to its objects by content (module docstring),
    concurrently: rel → key (or parts: key, size, sha256 each, for a file of ``CHUNK`` or
    more), size, sha256, mtime_ns (the snapshot's: what was judged complete), the bytes sent
    and the objects sent (an object there already is not sent). Small files go in batches,
    each read in one worker-thread call; larger ones each on its own. Every key stays pinned (``Store.pinned``; listed in
    ``pins``) until the caller unpins it, its manifest written. A file gone under the upload raises ``FileNotFoundError``
    (the caller tells a rotated checkpoint from a failure)."""
    out: dict[str, dict[str, Any]] = {}
    sent = [0, 0]
    small = sorted(rel for rel, (size, _m) in e.snap.files.items() if size < SMALL)
    have = await present(store, owner, pins)
    key_of = partial(object_key, store, owner)

    def done(rel: str, size: int, digest: str, n: int, parts: Sequence[Mapping[str, Any]] | None = None,
             objects: int | None = None) -> None:
        out[rel] = {**({"parts": list(parts)} if parts is not None else {"key": key_of(digest)}),
                    "size": size, "sha256": digest, "mtime_ns": e.snap.files[rel][1]}
        sent[0] += n
        sent[1] += objects if objects is not None else bool(n)

    async def one(rel: str) -> None:
        if e.snap.files[rel][0] >= CHUNK:
            done(rel, *await put_parts(store, path_of(root, rel), key_of, have))
        else:
            done(rel, *await store.put_file_content(path_of(root, rel), key_of, have))

    async def batch(rels: list[str]) -> None:
        got = await store.put_small_content([path_of(root, rel) for rel in rels], key_of, have)
        for rel, (size, digest, n) in zip(rels, got):
            done(rel, size, digest, n)

    await first_failure([partial(one, rel) for rel in sorted(set(e.snap.files) - set(small))]
                        + [partial(batch, rels) for rels in _batches(small, e.snap)])
    return out, sent[0], sent[1]


def object_key(store: Store, owner: str, sha256: str) -> str:
    return store.key(f"{space(owner)}{sha256}")


async def present(store: Store, owner: str, pins: list[str]) -> Present:
    """The objects of this run's space now (one listing), as an upload asks of them; what
    it pins is added to ``pins`` (the caller unpins them, ``Store.unpin``)."""
    epoch = store.epoch
    return Present({m["path"]: int(m["size"]) for m in await store.list(space(owner))}, epoch, store, pins)


class Present:
    """What a listing found, less what this process deleted since it was taken."""

    def __init__(self, sizes: Mapping[str, int], epoch: int, store: Store, pins: list[str]) -> None:
        self.sizes, self.epoch, self.store, self.pins = dict(sizes), epoch, store, pins

    def pin(self, key: str) -> None:
        self.store.pin(key)
        self.pins.append(key)

    def holds(self, key: str, size: int) -> bool:
        """Is ``key`` there with ``size`` bytes? Called right after pinning it: a delete that
        comes later skips it; one that came before is seen here (``Store.dropped``)."""
        return self.sizes.get(key) == size and self.store.dropped.get(key, -1) < self.epoch

    def add(self, key: str, size: int) -> None:
        self.sizes[key] = size


async def referenced(store: Store) -> set[str]:
    """Every key a manifest or a part manifest under the prefix names (one GET each)."""
    keys: set[str] = set()
    for where in (MANIFESTS, PARTS):
        for meta in await store.list(where):
            if not str(meta["path"]).endswith(".json"):
                continue
            got = await store.get(meta["path"])
            doc = loads(got[0]) if got is not None else None
            files = doc.get("files") if doc is not None else None
            if isinstance(files, dict):
                keys |= {k for f in files.values() if isinstance(f, dict) for k in keys_of(f)}
    return keys


async def unnamed(store: Store, owner: str, *, before: datetime.datetime | None = None,
                  among: Iterable[str] | None = None) -> list[str]:
    """This run's objects no manifest names: listed first, then the manifests read (an object
    listed was put before its upload's manifest, which the reading then finds). ``before``:
    only those put earlier (the store's clock); ``among``: only these keys."""
    objs = {m["path"]: m.get("last_modified") for m in await store.list(space(owner))}
    if among is not None:
        objs = {k: t for k, t in objs.items() if k in set(among)}
    if not objs:
        return []
    named = await referenced(store)
    return sorted(k for k, t in objs.items() if k not in named and (before is None or (t is not None and t < before)))


async def collect(store: Store, owner: str, *, before: datetime.datetime | None = None,
                  among: Iterable[str] | None = None) -> list[str]:
    """Delete what ``unnamed`` finds, less what an upload of this process pins; the keys deleted."""
    return [*await store.drop_objects(await unnamed(store, owner, before=before, among=among))]


async def superseded(store: Store, owner: str, before: Mapping[str, Any] | None, now: Mapping[str, Any]) -> None:
    """The objects of a replaced version that nothing names any more: of this run's space,
    those no manifest names (another version may share them); a key of the layout before
    issue 45 (``<checkpoint>/<path>``, ``.supervise/data/…``: one version's own), those the new
    manifest does not name."""
    if before is None:
        return
    keep = {k for f in now["files"].values() for k in keys_of(f)}
    old = {k for f in before["files"].values() for k in keys_of(f)} - keep
    mine = store.key(space(owner))
    await store.delete(sorted(k for k in old if not k.startswith(mine)))
    if any(k.startswith(mine) for k in old):
        await collect(store, owner, among=[k for k in old if k.startswith(mine)])


def path_of(root: Path, rel: str) -> Path:
    return root / rel if rel else root


def _batches(rels: list[str], snap: Snap) -> list[list[str]]:
    out: list[list[str]] = [[]]
    held = 0
    for rel in rels:
        size = snap.files[rel][0]
        if out[-1] and (len(out[-1]) >= BATCH_FILES or held + size > BATCH_BYTES):
            out.append([])
            held = 0
        out[-1].append(rel)
        held += size
    return [b for b in out if b]


def uploaded_whole(files: Mapping[str, Mapping[str, Any]], snap: Snap) -> bool:
    """Did every upload read as many bytes as the snapshot says (nothing rewritten meanwhile)?"""
    return files.keys() == snap.files.keys() and all(int(files[r]["size"]) == snap.files[r][0] for r in snap.files)


class StoreManifests:
    """The manifests of one pair's prefix, read as the publisher and the restorer need them."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def read(self, rel: str) -> tuple[dict[str, Any], str] | None:
        got = await self.store.get(self.store.key(rel))
        if got is None:
            return None
        doc = loads(got[0])
        return (doc, got[1]) if doc is not None else None

    async def listing(self) -> tuple[Listing, dict[str, dict[str, Any]]]:
        """Every manifest as a listing of complete entries (and pointers), with the documents."""
        listing, docs = Listing(), {}  # type: tuple[Listing, dict[str, Any]]
        for meta in await self.store.list(MANIFESTS):
            rel = self.store.rel(meta["path"])
            got = await self.read(rel)
            if got is None:
                continue
            doc = got[0]
            e = entry_of(doc)
            listing.entries[e.name], docs[e.name] = e, doc
            if listing.profile is None and profile_of(doc) is not None:
                listing.profile, listing.evidence = profile_of(doc), rel
        for meta in await self.store.list(POINTERS):
            got = await self.read(self.store.rel(meta["path"]))
            if got is not None:
                ptr = pointer_of(got[0])
                listing.pointers[ptr.name] = ptr
        return listing, docs


class StoreSide:
    """The persistent side as an object store (``_side.Side``): what publishing asks of it,
    answered from manifests, and the conditional put of one (``commit``). ``ledger``: what
    this run directory may replace and what it refused (``_side.Ledger``, the publisher's
    too); ``rescan(name)`` lists that one local entry again (blocking)."""

    def __init__(self, state: PairState, store: Store, *, ledger: Ledger, rescan: Callable[[str], Listing]) -> None:
        self.state = state
        self.pair, self.emit = state.pair, state.emit
        self.store = store
        self.ledger = ledger
        self.rescan = rescan
        self.manifests = StoreManifests(store)
        self.etags: dict[str, str] = {}          # manifest (rel) → its ETag when we wrote or read it
        self.docs: dict[str, dict[str, Any]] = {}  # checkpoint → its manifest on the store
        self.pointer_docs: dict[str, dict[str, Any]] = {}  # pointer → its manifest on the store
        self.claimed: set[str] = set()            # names whose own keys this run holds

    async def there(self, name: str) -> Snap | None:
        """The published version of ``name`` (its manifest, read now; kept in ``docs``), or None."""
        got = await self.manifests.read(manifest_rel(name))
        if got is None:
            self.docs.pop(name, None)
            self.etags.pop(manifest_rel(name), None)
            return None
        self.docs[name], self.etags[manifest_rel(name)] = got
        return entry_of(got[0]).snap

    async def drop(self, name: str) -> None:
        return None  # objects without a manifest are never restored; the next upload writes over them

    async def pointer_there(self, name: str) -> bool:
        got = await self.manifests.read(pointer_rel(name))
        if got is not None:
            self.etags[pointer_rel(name)] = got[1]
            self.pointer_docs[name] = got[0]
        return got is not None

    async def write_pointer(self, ptr: Pointer, target: str) -> bool:
        rel = pointer_rel(ptr.name)
        if rel not in self.etags:
            await self.pointer_there(ptr.name)
        was = self.pointer_docs.get(ptr.name)
        if was is not None and was.get("target") == target and pointer_of(was).content == ptr.content:
            return False  # that very pointer is there (a restored ``latest``)
        if await self.commit(rel, dumps(pointer_doc(ptr, target)), self.etags.get(rel)) is None:
            self.ledger.refuse(ptr.name, "pointer")
            return False
        # the pointer's own bytes beside its checkpoint, for a reader by hand (the manifest decides)
        await self.store.put_bytes(self.store.key(ptr.name), target.encode() if ptr.link else ptr.content)
        return True

    async def land(self, e: Entry, stats: CopyResult) -> Landed | None:
        """Upload, re-check the local side, then the manifest. None: the checkpoint vanished,
        stopped being complete, kept changing, or another writer's manifest is there."""
        p = self.pair
        rel = manifest_rel(e.name)
        await self.there(e.name)  # the manifest there now, and its ETag: what a new version moves
        before = self.docs.get(e.name)
        token = await self.place(e.name, self.state.owner) if before is None or self.ledger.owns(e.name) else False
        if token is False:
            self.ledger.refuse(e.name)  # another run's manifest or claim is there
            return None
        for _attempt in range(RECOPY_TRIES):
            pins: list[str] = []
            try:
                files, sent, objects = await upload(self.store, p.src / e.name, e, self.state.owner, pins)
                again: Listing = await to_thread(self.rescan, e.name)
                now = again.entries.get(e.name)
                if now is None or not now.complete:
                    return None
                stats.files += objects
                stats.bytes += sent
                if now.snap.files != e.snap.files or not uploaded_whole(files, e.snap):
                    e = now  # changed while uploaded: again, before it counts
                    continue
                doc = checkpoint_doc(e, files, profile=self.state.profile)
                if await self.commit(rel, dumps(doc), self.etags.get(rel)) is None:
                    self.ledger.refuse(e.name)  # another run's manifest landed first
                    return None
            except FileNotFoundError:
                if await to_thread(os.path.lexists, p.src / e.name):
                    raise
                return None  # rotated away under the upload: not a failure
            finally:
                self.store.unpin(pins)
            await self.superseded(before, doc)
            self.docs[e.name] = doc
            return Landed(e, again, {"manifest": self.store.key(manifest_rel(e.name))})
        self.emit("sync-deferred", pair=p.name, checkpoint=e.name,
                  reason=f"changed while being uploaded, {RECOPY_TRIES} times; trying again on the next pass")
        return None

    async def commit(self, rel: str, data: bytes, etag: str | None) -> str | None:
        """Put a manifest: created where none was read, else moved from the ETag read. None:
        refused (another writer's is there, or it moved since)."""
        try:
            new = await self.store.put_bytes(self.store.key(rel), data, create=etag is None, if_match=etag)
        except (Exists, Changed):
            return None
        self.etags[rel] = new
        return new

    async def superseded(self, before: Mapping[str, Any] | None, now: Mapping[str, Any]) -> None:
        """The objects of the version a new manifest replaced that nothing names any more."""
        await superseded(self.store, self.state.owner, before, now)

    async def place(self, name: str, owner: str) -> str | None | bool:
        """Where a version of ``name`` goes: ``None``, its own keys (the first version; the name
        claimed for this run first, with ``If-None-Match``: a second run's upload never writes
        over the first's objects, whatever the timing), a fresh token for a later version, or
        ``False``: another run holds the name (refused)."""
        if name in self.docs:
            return secrets.token_hex(6)
        if name in self.claimed:
            return None
        key = self.store.key(claim_rel(name))
        mine = dumps({"v": 1, "owner": owner})
        try:
            await self.store.put_bytes(key, mine, create=True)
        except Exists:
            got = await self.store.get(key)
            if got is None or got[0] != mine:
                return False
        self.claimed.add(name)
        return None


class StoreRestore:
    """A restore from an object store (``_side.RestoreSide``): the manifests are its listing;
    a version comes back from the nearest copy whose sha256 is the manifest's, downloaded
    where no nearer one is."""

    unverified_as = "torn"
    none_verified = "no checkpoint on persistent storage whose objects match its manifest"
    repoints_kept = False

    def __init__(self, state: PairState, store: Store) -> None:
        self.state = state
        self.pair, self.emit = state.pair, state.emit
        self.store = store
        self.manifests = StoreManifests(store)

    async def listing(self, doc: Mapping[str, Any] | None, slow: bool) -> tuple[Listing, dict[str, Any]]:
        """The manifests; with ``doc`` (a version only the nodes hold), its document among
        them, marked ``_persistent`` where the store's copy of that name has the very same
        files (then downloaded from their keys). A version only the nodes hold does not wait
        for a store that does not answer."""
        listing, docs = Listing(), {}  # type: tuple[Listing, dict[str, Any]]
        with anyio.move_on_after((0.0 if slow else PERSISTENT_WAIT_S) if doc is not None else math.inf):
            listing, docs = await self.manifests.listing()
        if doc is not None:
            name = entry_of(doc).name
            published = docs.get(name)
            docs = {**docs, name: {**doc, "_persistent": published is not None and same_files(published, doc)}}
            if published is not None:
                docs[name]["files"] = {r: {**f, **stored_as(published["files"][r])} if r in published["files"] else f
                                       for r, f in doc["files"].items()}
        return listing, docs

    def failed_reason(self, chosen: bool) -> str:
        return "no copy of it verifies against its manifest"

    async def bring(self, best: Entry, docs: Mapping[str, Any], listing: Listing, local: Listing, *,
                    keep_newer: bool, doc: Mapping[str, Any] | None,
                    peers: Sequence[tuple[str, Fetch]]) -> Brought:
        """``best`` onto local disk from the nearest copy whose sha256 is the manifest's: the
        node's own (live or set aside), the other nodes that hold it (``peers``), else
        downloaded (``_fill``); a version only the nodes hold is downloaded only where the
        store's copy of that name has the very same bytes."""
        p = self.pair
        dest = p.src / best.name
        version = docs[best.name]
        stored = bool(version.get("_persistent", True))
        filled = await fill(version, dest, candidates=local_candidates(p.src, best.name), peers=peers,
                            fetch=self._download if stored else None)
        self.emit("restore-verify", pair=p.name, checkpoint=best.name, result="verified", **filled.fields())
        got = filled.came.get("persistent", 0)
        return Brought(dest, CopyResult(files=filled.files.get("persistent", 0), bytes=got),
                       self.store.key(manifest_rel(best.name)) if stored else "nodes", bool(got))

    async def _download(self, rel: str, f: Mapping[str, Any], target: Path) -> int:
        """One object of the manifest, checked against its size and sha256 as it streams."""
        try:
            if "parts" in f:
                return await download_parts(self.store, f["parts"], target, f["sha256"], int(f["size"]))
            return await self.store.download(f["key"], target, f["sha256"], int(f["size"]))
        except StoreError as err:
            if err.code not in ("EBADMSG", "ENOENT"):
                raise
            await to_thread(target.unlink, missing_ok=True)
            raise Mismatch(str(err)) from err


def file_is(path: Path, doc: Mapping[str, Any]) -> bool:
    """Is the local single-file checkpoint at ``path`` the very version ``doc`` names? Blocking."""
    return _hashes_match(path, doc)


def _hashes_match(dest: Path, doc: Mapping[str, Any]) -> bool:
    """Is the local copy that very version (each file's sha256 as the manifest's)? Blocking."""
    return holds_version(dest, doc)
