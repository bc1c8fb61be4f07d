"""A checkpoint's files on an object store, addressed by content (issue 45): bytes moved in
proportion to bytes changed.

Every file of a version is one object, ``.supervise/objects/<run>/<sha256>``, where ``<run>``
is the first 16 hex digits of the sha256 of this run's directory (``PairState.owner``: the
run every attempt and node of it share). A file is hashed first; an object of that hash
already there (one listing per upload) is not sent again, so what no step changes (a frozen
base, a tokenizer, a config) and what several nodes hold alike (HF's ``save_on_each_node``)
go up once, and a version's manifest names objects an earlier version uploaded.

Per file, not per fixed part of a file: the manifest, the restore and its verification are
per file already (size, sha256, each file verified as it streams), and a framework that
keeps a base frozen saves it as a file of its own (an adapter beside its base, the shards
of a sharded save); ``bench/s3.py`` measured fixed parts of one whole-state safetensors
file (the ``frozen`` case).

Deleting: only objects of this run's own space that no manifest and no part manifest under
the prefix names (``referenced``), and none an upload of this process is using (``Store.
pinned``). An object put before this process's start check that nothing names (a pass
killed between its uploads and its manifest) is collected by the first pass (``collect``).
Rules: docs/sync.md, "Object stores".
"""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path
from typing import Any, Iterable, Mapping

from supervisor.sync._manifest import MANIFESTS, PARTS, ROOT, loads
from supervisor.sync._store import Store

OBJECTS = f"{ROOT}/objects/"


def space(owner: str) -> str:
    """This run's objects: ``.supervise/objects/<run>/`` (rel to the prefix)."""
    return f"{OBJECTS}{hashlib.sha256(owner.encode()).hexdigest()[:16]}/"


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


def keys_of(f: Mapping[str, Any]) -> list[str]:
    """The objects a manifest's file is made of: its key, or its parts' (a file of ``CHUNK`` or more)."""
    if isinstance(f.get("parts"), list):
        return [str(p["key"]) for p in f["parts"] if isinstance(p, dict) and "key" in p]
    return [str(f["key"])] if "key" in f else []


def stored_as(f: Mapping[str, Any]) -> dict[str, Any]:
    """Where a manifest's file is: ``key`` or ``parts``."""
    return {k: f[k] for k in ("key", "parts") if k in f}


def path_of(root: Path, rel: str) -> Path:
    return root / rel if rel else root
