"""The peer tier of per-node pairs: what each node holds, the newest version whole across
the nodes, and files fetched from the node that holds them (issue 43).

A restore used to choose only among the versions on persistent storage, so a version saved
while the persistent side was down or slow (an object store SIGSTOPped, a directory at
quota) was lost with the attempt even though it lay whole on the nodes' disks, and a node
lacking a file always read it back from persistent storage. Now, before the leader chooses:

- every node serves its local sides to the others (``serve``: a ``_peer.PeerServer`` whose
  address is in ``RUN/nodes/node-K/peer.json``, with the run's token, ``RUN/nodes/peer-token``,
  0600);
- every node offers what it holds (``holdings``: each whole local version of each per-node
  pair, every file's size, mtime and sha256; a file whose size and mtime are those of the
  published version's content manifest takes its hash from there, unread), and the copies its
  partners pushed to it while the training ran (``copies``: ``_ring``);
- the leader chooses the newest version that is whole **across** the offers (``across``: a
  single file on any node, a directory once every node's part is there, on that node or as a
  partner's copy of it) when it is newer than the newest published one, else that published
  one, and names for each file the nodes that hold it (``"K"``: node K's own; ``"P/K"``:
  node P's copy of node K's part);
- every node then fills the version from its own copies, then the holders (``remote``), then
  persistent storage, each file verified against its sha256 (``_fill``).

The version chosen from the nodes is published once the persistent side answers again: the
nodes' own passes go on offering it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from functools import cmp_to_key, partial
from pathlib import Path
from typing import Any, Callable, Collection, Mapping

import anyio
from anyio.abc import TaskStatus

from supervisor.config import SyncPair
from supervisor.reach import addresses
from supervisor.sync import _content
from supervisor.sync._aside import SET_ASIDE_DIR
from supervisor.sync._complete import Entry, Listing
from supervisor.sync._fill import PEER_DIR, Fetch, Mismatch, NotHeld
from supervisor.sync._manifest import checkpoint_doc, entry_of
from supervisor.sync._peer import PeerError, PeerServer, Sent, drop, fetch, new_token, push
from supervisor.sync._profiles import Profile

log = logging.getLogger("supervise")

MANIFESTS = ".manifests"       # LOCAL/.supervise-peer/node-K/.manifests/NAME.json: a whole copy of node K's NAME
COPIES = ".copies"             # in a node's offer of a pair: the partners' copies it holds (``copies``), beside its own versions
TOKEN_FILE = "peer-token"      # RUN/nodes/peer-token
PEER_FILE = "peer.json"        # RUN/nodes/node-K/peer.json
QUOTA_BYTES = 1 << 50          # the inbox's bound; the ring's retention (two versions) keeps it small
FETCH_WAIT_S = 10.0            # one wait of one peer transfer (connect, a chunk): a dead node costs this once
HELD_VERSIONS = 2              # a node offers its newest two whole versions (a choice older than them reads persistent storage)
PERSISTENT_WAIT_S = 20.0       # the offer and the choice wait this long for the persistent side, then go on without it
SLOW_LOOK_S = 2.0              # the choice's listing, once the offer waited for the persistent side in vain


def _node_dir(run_dir: Path, node: int) -> Path:
    return run_dir / "nodes" / f"node-{node}"


def token(run_dir: Path) -> str:
    """The run's peer token: made once (0600, O_EXCL), read by every node after. Blocking."""
    path = run_dir / "nodes" / TOKEN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        for _ in range(50):  # another node is writing it this very moment
            text = path.read_text(encoding="ascii").strip()
            if text:
                return text
            time.sleep(0.1)
        raise OSError(f"{path} stays empty") from None
    text = new_token()
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return text


def roots(pairs: list[SyncPair]) -> dict[str, Path]:
    """What a node serves, per per-node pair: its local side, the versions it set aside, and
    its partners' copies."""
    out: dict[str, Path] = {}
    for p in pairs:
        out[p.name] = p.src
        out[f"{p.name}.aside"] = p.src / SET_ASIDE_DIR
        out[f"{p.name}.peer"] = p.src / PEER_DIR
    return out


async def serve(pairs: list[SyncPair], run_dir: Path, node: int, *,
                task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve this node's local sides to the other nodes until cancelled; ``started`` once
    ``RUN/nodes/node-K/peer.json`` says where."""
    served = roots(pairs)
    for path in served.values():
        await anyio.to_thread.run_sync(partial(path.mkdir, parents=True, exist_ok=True))
    secret = await anyio.to_thread.run_sync(token, run_dir)
    server = PeerServer(served, secret, inbox=[f"{p.name}.peer" for p in pairs], quota_bytes=QUOTA_BYTES)
    async with anyio.create_task_group() as tg:
        _host, port = await tg.start(server.serve)
        await anyio.to_thread.run_sync(_publish, run_dir, node, port)
        task_status.started()


def _publish(run_dir: Path, node: int, port: int) -> Path:
    path = _node_dir(run_dir, node) / PEER_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{PEER_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({"node": node, "host": socket.gethostname(), "hosts": addresses(), "port": port,
                               "pid": os.getpid()}), encoding="utf-8")
    os.replace(tmp, path)
    return path


class Book:
    """Where each node's peer server listens (``peer.json``), read when first asked; a node
    that did not answer once is not asked again in this restore."""

    def __init__(self, run_dir: Path, me: int) -> None:
        self.run_dir, self.me = run_dir, me
        self._token: str | None = None
        self._where: dict[int, list[tuple[str, int]]] = {}
        self.dead: set[int] = set()

    async def _secret(self) -> str:
        if self._token is None:
            self._token = await anyio.to_thread.run_sync(token, self.run_dir)
        return self._token

    async def send(self, node: int, root: str, src: Path, rel: str) -> Sent:
        """``src`` pushed into node ``node``'s inbox ``root`` at ``rel`` (``_peer.push``). A
        node that does not answer is looked up again next time (its agent may have started
        since, on a new port)."""
        secret, addrs = await self._secret(), await anyio.to_thread.run_sync(self._addrs, node)
        if not addrs:
            raise PeerError("connection", f"node {node} says nowhere where it listens")
        try:
            return await push(addrs[0], secret, src, rel, timeout=FETCH_WAIT_S, root=root)
        except PeerError as e:
            if e.why in ("connection", "timeout", "closed"):
                self._where.pop(node, None)
            raise

    async def remove(self, node: int, root: str, rel: str) -> None:
        """``rel`` removed from node ``node``'s inbox ``root``."""
        secret, addrs = await self._secret(), await anyio.to_thread.run_sync(self._addrs, node)
        if addrs:
            await drop(addrs[0], secret, rel, timeout=FETCH_WAIT_S, root=root)

    def _addrs(self, node: int) -> list[tuple[str, int]]:
        """Where node ``node`` listens, once its ``peer.json`` says (not yet: asked again next time)."""
        if node not in self._where:
            try:
                got = json.loads((_node_dir(self.run_dir, node) / PEER_FILE).read_text(encoding="utf-8"))
                self._where[node] = [(str(h), int(got["port"])) for h in got["hosts"] if not str(h).startswith("127.")] \
                    or [(str(h), int(got["port"])) for h in got["hosts"]]
            except (OSError, ValueError, KeyError, TypeError):
                return []
        return self._where[node]

    def fetcher(self, node: int, root: str, name: str, holds: Collection[str] | None = None) -> Fetch:
        """Files of checkpoint ``name`` from node ``node``'s ``root`` (``_fill.Fetch``); a file
        not in ``holds`` (what the node offered) is not asked for."""

        async def one(rel: str, f: Mapping[str, Any], target: Path) -> int:
            if holds is not None and rel not in holds:
                raise NotHeld(f"node {node} did not offer it")
            if node in self.dead:
                raise Mismatch(f"node {node} did not answer before")
            secret = await self._secret()
            addrs = await anyio.to_thread.run_sync(self._addrs, node)
            why = "no address"
            for addr in addrs[:2]:
                try:
                    return await fetch(addr, secret, root, f"{name}/{rel}" if rel else name, size=int(f["size"]),
                                       sha256=str(f["sha256"]), dest=target, timeout=FETCH_WAIT_S)
                except PeerError as e:
                    why = str(e)
                    if e.why not in ("connection", "timeout", "closed"):
                        raise Mismatch(why) from e
            self.dead.add(node)
            raise Mismatch(why)

        return one


def remote(book: Book | None, pair: str, name: str, holders: Mapping[str, Any] | None,
           nodes: int) -> list[tuple[str, Fetch]]:
    """The other nodes to ask for files of ``name``: those the leader's choice names as holding
    it (what they offered: ``"K"`` its own copy, ``"P/K"`` node P's copy of node K's), the next
    ones after this node first; no other node is asked (at a thousand nodes, a file missing
    everywhere would cost a thousand refusals). A copy on this node's own disk is a local
    candidate (``_fill.local_candidates``), not asked for here."""
    if book is None or not holders:
        return []
    named = {holder_key(k): set(rels) for k, rels in holders.items()}
    order = sorted((h for h in named if h[0] != book.me), key=lambda h: ((h[0] - book.me) % nodes, len(h), h))
    return [(f"node-{h[0]}", book.fetcher(h[0], pair, name, named[h])) if len(h) == 1 else
            (f"node-{h[0]}-copy", book.fetcher(h[0], f"{pair}.peer", f"node-{h[1]}/{name}", named[h])) for h in order]


def holder_key(holder: str | int) -> tuple[int, ...]:
    """``"K"`` → (K,): node K's own copy; ``"P/K"`` → (P, K): node P's copy of node K's."""
    return tuple(int(x) for x in str(holder).split("/"))


def copies(p: SyncPair) -> dict[str, dict[str, Any]]:
    """The whole copies partner nodes pushed here (``_ring``), per writer node (``"K"`` →
    name → document): a copy counts once its manifest (written last) is there and every file
    it names has its size and mtime. Past the newest ``HELD_VERSIONS`` of each writer, and
    whatever no such manifest names (a push cut short), is removed: the ring's bound, kept
    at each start for what earlier attempts left (nothing pushes before the spawn). Blocking."""
    out: dict[str, dict[str, Any]] = {}
    try:
        writers = [w for w in os.listdir(p.src / PEER_DIR) if w.startswith("node-") and w[5:].isdigit()]
    except OSError:
        return out
    for w in writers:
        here = p.src / PEER_DIR / w
        docs = []
        for m in sorted((here / MANIFESTS).glob("*.json")):
            try:
                doc = json.loads(m.read_text(encoding="utf-8"))
                whole = m.name == f"{doc['checkpoint']}.json" and all(
                    _same_file(here / doc["checkpoint"] / rel if rel else here / doc["checkpoint"], f)
                    for rel, f in doc["files"].items())
            except (OSError, ValueError, KeyError, TypeError):
                whole = False
            if whole:
                docs.append(doc)
            else:
                m.unlink(missing_ok=True)
        docs.sort(key=cmp_to_key(_by_save), reverse=True)
        keep = {d["checkpoint"]: d for d in docs[:HELD_VERSIONS]}
        for d in docs[HELD_VERSIONS:]:
            (here / MANIFESTS / f"{d['checkpoint']}.json").unlink(missing_ok=True)
        for n in os.listdir(here):
            if n != MANIFESTS and n not in keep:
                _remove_tree(here / n)
        if keep:
            out[w[5:]] = keep
    return out


def _by_save(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    ea, eb = entry_of(a), entry_of(b)
    return 1 if _later(ea, eb) else -1 if _later(eb, ea) else 0


def _same_file(path: Path, f: Mapping[str, Any]) -> bool:
    st = os.lstat(path)
    return (st.st_size, st.st_mtime_ns) == (int(f["size"]), int(f["mtime_ns"]))


def _remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def holdings(p: SyncPair, local: Listing, profile: Profile | None,
             published: Callable[[str], Mapping[str, Any] | None]) -> dict[str, Any]:
    """This node's newest ``HELD_VERSIONS`` whole local versions of ``p`` (judged as finished),
    each a manifest-like document: every file's size, mtime and sha256 (taken from the published
    version's content manifest, ``published(name)``, where size and mtime are its own, else read
    here: a version never published is hashed, an old published one is not). Blocking."""
    out: dict[str, Any] = {}
    whole = sorted((e for e in local.entries.values() if e.complete and e.restorable), key=lambda e: e.order,
                   reverse=True)
    for e in whole[:HELD_VERSIONS]:
        known = published(e.name)
        hashes = {rel: f"{_content.LINK}{f['link']}" if "link" in f else f["sha256"]
                  for rel, f in (known or {}).get("files", {}).items()
                  if rel in e.snap.files and (int(f["size"]), int(f["mtime_ns"])) == e.snap.files[rel]}
        try:
            hashes = _content.hash_files(p.src / e.name, e.snap, hashes)
        except OSError:
            continue
        files = {rel: _content.entry(s, m, hashes[rel]) for rel, (s, m) in e.snap.files.items()}
        out[e.name] = checkpoint_doc(e, files, profile=profile)
    return out


def across(offers: Mapping[int, Mapping[str, Any]], nodes: int,
           copies: Mapping[int, Mapping[str, Mapping[str, Any]]] | None = None) -> dict[str, dict[str, Any]]:
    """Every version whole across the nodes' ``offers`` (node → name → document) and the
    partners' ``copies`` (node P → node K → name → document: P's copy of K's part): a single
    file held by any node (the newest copy by mtime), a directory whose parts from every one of
    ``nodes`` nodes (each on its node, or a partner's copy of it) together hold no path twice
    with different bytes. Each comes back with ``holders`` (``"K"`` or ``"P/K"`` → its files)."""
    by_name: dict[str, dict[str, tuple[int, Mapping[str, Any]]]] = {}
    for node, held in offers.items():
        for name, doc in held.items():
            by_name.setdefault(name, {})[str(node)] = (node, doc)
    for holder, writers in (copies or {}).items():
        for k, held in writers.items():
            for name, doc in held.items():
                by_name.setdefault(name, {})[f"{holder}/{k}"] = (int(k), doc)
    out: dict[str, dict[str, Any]] = {}
    for name, docs in by_name.items():
        if all(not d["is_dir"] for _w, d in docs.values()):
            key = max(docs, key=lambda k: int(docs[k][1]["files"][""]["mtime_ns"]))
            sha = docs[key][1]["files"][""]["sha256"]
            out[name] = {**docs[key][1], "holders": {k: [""] for k, (_w, d) in docs.items() if d["files"][""]["sha256"] == sha}}
            continue
        if any(not d["is_dir"] for _w, d in docs.values()) or {w for w, _d in docs.values()} != set(range(nodes)):
            continue
        union: dict[str, Any] = {}
        holders: dict[str, list[str]] = {}
        clash = False
        for key in sorted(docs, key=holder_key):
            for rel, f in docs[key][1]["files"].items():
                if rel in union and union[rel]["sha256"] != f["sha256"]:
                    clash = True
                union.setdefault(rel, f)
                holders.setdefault(key, []).append(rel)
        if clash:
            continue
        first = docs[min(docs, key=holder_key)][1]
        out[name] = {**first, "files": dict(sorted(union.items())), "bytes": sum(int(f["size"]) for f in union.values()),
                     "newest_ns": max(int(f["mtime_ns"]) for f in union.values()), "holders": holders,
                     "markers": sorted({m for _w, d in docs.values() for m in d.get("markers") or ()})}
    return out


def _later(a: Entry, b: Entry) -> bool:
    """Is ``a`` a later save than ``b``? The later step where both names give one and they
    differ; else written later (the newest file's mtime): a ``snapshot.pt`` saved again, or
    Lightning's ``last.ckpt``, which has no step and is written after the newest ``step=N``
    file (comparing steps alone took a node's ``step=18`` file for newer than the published
    ``last.ckpt`` of step 20)."""
    if a.step is not None and b.step is not None and a.step != b.step:
        return a.step > b.step
    return max(m for _s, m in a.snap.files.values()) > max(m for _s, m in b.snap.files.values())


def newer_than(doc: Mapping[str, Any], published: Entry | None) -> bool:
    """Is the version ``doc`` (whole across the nodes) a later save than the newest published one?"""
    return published is None or _later(entry_of(doc), published)


def choose_across(held: Mapping[int, Mapping[str, Any]], nodes: int, published: str | None,
                  entry: Entry | None, *, silent: bool = False,
                  copies: Mapping[int, Mapping[str, Mapping[str, Any]]] | None = None,
                  ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The leader's choice for one pair from what every node holds (``held``: node → name →
    document; ``copies``: node → the partners' copies it holds, ``copies``'s shape) and the
    newest published version (``published``, its listing ``entry``): the choice's value, and
    what ``restore-choice`` says of it. ``silent``: the persistent side did not answer the
    leader; the nodes then do not wait for it either."""
    value, said = _choose(across(held, nodes, copies), held, published, entry, copies)
    said["offered"].update({f"{k}/{w}": sorted(v) for k, ws in sorted((copies or {}).items()) for w, v in sorted(ws.items())})
    if silent:
        return ({**value, "silent": True} if value is not None else None), {**said, "silent": True}
    return value, said


def _choose(whole: Mapping[str, dict[str, Any]], held: Mapping[int, Mapping[str, Any]], published: str | None,
            entry: Entry | None, copies: Mapping[int, Mapping[str, Mapping[str, Any]]] | None,
            ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    newer = [d for d in whole.values() if newer_than(d, entry)]
    offered = {str(k): sorted(v) for k, v in sorted(held.items())}
    if newer:
        best = newer[0]
        for d in newer[1:]:
            if _later(entry_of(d), entry_of(best)):
                best = d
        said = {"checkpoint": best["checkpoint"], "source": "nodes", "holders": sorted(best["holders"], key=holder_key),
                "published": published, "offered": offered,
                "why": "whole across the nodes and newer than the newest published" if published
                else "whole across the nodes; nothing published"}
        return {**best, "source": "nodes"}, said
    if published is None:
        return None, {"checkpoint": None, "source": None, "offered": offered,
                      "why": "nothing published, nothing whole across the nodes"}
    holders = _holding(held, published, entry, copies)
    return ({"checkpoint": published, "source": "persistent", "holders": holders},
            {"checkpoint": published, "source": "persistent", "holders": sorted(holders, key=holder_key), "offered": offered,
             "why": "the newest published; nothing newer whole across the nodes"})


def wanted(want: str | Mapping[str, Any] | None) -> tuple[str | None, dict[str, Any] | None, Mapping[str, Any] | None]:
    """A choice's value as (name, the version's document when only the nodes hold it, the
    nodes that hold its files)."""
    if want is None or isinstance(want, str):
        return want, None, None
    if want.get("checkpoint") is None:  # nothing to restore (every version passed over)
        return None, None, None
    name = str(want["checkpoint"])
    doc = {k: v for k, v in want.items() if k not in ("holders", "source", "silent", "passed_over")} \
        if want.get("source") == "nodes" else None
    return name, doc, want.get("holders") or {}


def _holding(held: Mapping[int, Mapping[str, Any]], name: str, entry: Entry | None,
             copies: Mapping[int, Mapping[str, Mapping[str, Any]]] | None = None) -> dict[str, list[str]]:
    """The nodes that hold files of the published ``name`` as published (size and mtime its
    listing's: a node's older version of the same name is not that version), and which: ``"K"``
    its own copy, ``"P/K"`` node P's copy of node K's (the ring's: nearer than persistent
    storage, and the only other copy of a file whose own copy fails verification)."""
    if entry is None:
        return {}

    def same(doc: Mapping[str, Any] | None) -> list[str]:
        return [rel for rel, f in (doc or {}).get("files", {}).items()
                if entry.snap.files.get(rel) == (int(f["size"]), int(f["mtime_ns"]))]

    out: dict[str, list[str]] = {str(node): same(docs.get(name)) for node, docs in held.items()}
    for holder, writers in (copies or {}).items():
        for k, docs in writers.items():
            out[f"{holder}/{k}"] = same(docs.get(name))
    return {k: rels for k, rels in out.items() if rels}
