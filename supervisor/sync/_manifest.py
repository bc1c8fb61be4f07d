"""What an object store holds for a pair, and the manifests that make it a checkpoint.

An object store has no rename, so a checkpoint cannot appear there whole in one step as a
directory does. Its files are uploaded first, then its **manifest**, one small JSON object
written last with a conditional put: a checkpoint exists for a restore only through its
manifest, which names every object with its size and sha256. Layout under the pair's prefix
(docs/sync.md, "Object stores")::

    .supervise/objects/<run>/<sha256>              a file (under 8 MiB) or a part of one, by content: shared by versions
    <checkpoint>[/<path>], .supervise/data/…       a file's object before issue 45 (still restored)
    .supervise/manifests/<checkpoint>.json         the manifest: the commit point
    .supervise/claims/<checkpoint>                 the run whose a name's own keys are (the first to claim it)
    .supervise/pointers/<pointer>.json             a pointer (``latest``, ``last.ckpt``): its target
    <pointer>                                      the pointer's own content, for a reader by hand
    .supervise/parts/<checkpoint>/node-<K>.json    node K's part of a per-node checkpoint
    .supervise/parts/<checkpoint>/go               node 0 saw that checkpoint complete
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any, Mapping

from supervisor.sync._complete import Entry, Pointer, Snap
from supervisor.sync._profiles import PROFILES, Profile

MANIFEST_V = 1
ROOT = ".supervise"
MANIFESTS = f"{ROOT}/manifests/"
POINTERS = f"{ROOT}/pointers/"
PARTS = f"{ROOT}/parts/"
DATA = f"{ROOT}/data/"
CLAIMS = f"{ROOT}/claims/"
OBJECTS = f"{ROOT}/objects/"


def space(owner: str) -> str:
    """This run's objects by content: ``.supervise/objects/<run>/`` (rel to the prefix), ``<run>``
    16 hex digits of the sha256 of its run directory (every attempt and node of it share it)."""
    return f"{OBJECTS}{hashlib.sha256(owner.encode()).hexdigest()[:16]}/"


def keys_of(f: Mapping[str, Any]) -> list[str]:
    """The objects a manifest's file is made of: its key, or its parts' (a file of 8 MiB or more)."""
    if isinstance(f.get("parts"), list):
        return [str(p["key"]) for p in f["parts"] if isinstance(p, dict) and "key" in p]
    return [str(f["key"])] if "key" in f else []


def stored_as(f: Mapping[str, Any]) -> dict[str, Any]:
    """Where a manifest's file is: ``key`` or ``parts``."""
    return {k: f[k] for k in ("key", "parts") if k in f}


def manifest_rel(name: str) -> str:
    return f"{MANIFESTS}{name}.json"


def pointer_rel(name: str) -> str:
    return f"{POINTERS}{name}.json"


def part_rel(name: str, node: int) -> str:
    return f"{PARTS}{name}/node-{node}.json"


def claim_rel(name: str) -> str:
    return f"{CLAIMS}{name}"


def go_rel(name: str) -> str:
    return f"{PARTS}{name}/go"


def data_rel(name: str, rel: str, token: str | None) -> str:
    """Where a file of a checkpoint goes: its own name for the first version, a fresh place
    for a later one (the published version's objects stay whole until its manifest moves)."""
    base = name if token is None else f"{DATA}{name}/{token}/{name}"
    return f"{base}/{rel}" if rel else base


def checkpoint_doc(e: Entry, files: Mapping[str, Mapping[str, Any]], *, profile: Profile | None, nodes: int = 1,
                   extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of ``e`` whose files were uploaded as ``files`` (rel → key, size, sha256, mtime_ns)."""
    return {"v": MANIFEST_V, "checkpoint": e.name, "is_dir": e.is_dir, "files": dict(sorted(files.items())),
            "bytes": sum(int(f["size"]) for f in files.values()), "why": e.why, "done_at": e.done_at,
            "step": e.step, "restorable": e.restorable, "markers": list(e.markers), "newest_ns": e.snap.newest_ns,
            "profile": profile.name if profile is not None else None, "nodes": nodes,
            "published_at": round(time.time(), 3), **(extra or {})}


def entry_of(doc: Mapping[str, Any]) -> Entry:
    """A manifest as the listing entry a restore chooses among: complete by construction."""
    files = {rel: (int(f["size"]), int(f["mtime_ns"])) for rel, f in doc["files"].items()}
    snap = Snap(files, int(doc.get("newest_ns") or max((m for _, m in files.values()), default=0)), int(doc["bytes"]))
    return Entry(name=str(doc["checkpoint"]), is_dir=bool(doc["is_dir"]), snap=snap, complete=True,
                 why=str(doc.get("why") or "manifest"), done_at=doc.get("done_at"), markers=tuple(doc.get("markers") or ()),
                 step=doc.get("step"), restorable=bool(doc.get("restorable", True)))


def snap_of(doc: Mapping[str, Any]) -> Snap:
    return entry_of(doc).snap


def pointer_doc(ptr: Pointer, target: str) -> dict[str, Any]:
    return {"v": MANIFEST_V, "pointer": ptr.name, "target": target, "link": ptr.link, "mode": ptr.mode,
            "mtime_ns": ptr.mtime_ns, "content": base64.b64encode(ptr.content).decode("ascii"),
            "published_at": round(time.time(), 3)}


def pointer_of(doc: Mapping[str, Any]) -> Pointer:
    return Pointer(name=str(doc["pointer"]), content=base64.b64decode(doc["content"]), mtime_ns=int(doc["mtime_ns"]),
                   target=doc.get("target"), link=bool(doc.get("link")), mode=int(doc.get("mode") or 0o644))


def profile_of(doc: Mapping[str, Any]) -> Profile | None:
    return PROFILES.get(str(doc.get("profile") or ""))


def dumps(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def loads(data: bytes) -> dict[str, Any] | None:
    """A manifest, or None when it is not one of ours (a reader never trusts a torn one)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("v") == MANIFEST_V else None
