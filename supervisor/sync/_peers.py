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
  published version's content manifest takes its hash from there, unread);
- the leader chooses the newest version that is whole **across** the offers (``across``: a
  single file on any node, a directory once every node's part is there, one file from one
  node) when it is newer than the newest published one, else that published one, and names
  for each file the nodes that hold it;
- every node then fills the version from its own copies, then the holders (``remote``), then
  persistent storage, each file verified against its sha256 (``_fill``).

The version chosen from the nodes is published once the persistent side answers again: the
nodes' own passes go on offering it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from functools import partial
from pathlib import Path
from typing import Any, Mapping

import anyio
from anyio.abc import TaskStatus

from supervisor.config import SyncPair
from supervisor.reach import addresses
from supervisor.sync import _content
from supervisor.sync._aside import SET_ASIDE_DIR
from supervisor.sync._complete import Entry, Listing
from supervisor.sync._fill import Fetch, Mismatch
from supervisor.sync._manifest import checkpoint_doc, entry_of
from supervisor.sync._peer import PeerError, PeerServer, fetch, new_token
from supervisor.sync._profiles import Profile

log = logging.getLogger("supervise")

PEER_DIR = ".supervise-peer"   # LOCAL/.supervise-peer/: copies pushed by partner nodes (hidden: never a checkpoint)
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
    server = PeerServer(served, secret, inbox=f"{pairs[0].name}.peer", quota_bytes=QUOTA_BYTES)
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

    def _addrs(self, node: int) -> list[tuple[str, int]]:
        if node not in self._where:
            try:
                got = json.loads((_node_dir(self.run_dir, node) / PEER_FILE).read_text(encoding="utf-8"))
                self._where[node] = [(str(h), int(got["port"])) for h in got["hosts"] if not str(h).startswith("127.")] \
                    or [(str(h), int(got["port"])) for h in got["hosts"]]
            except (OSError, ValueError, KeyError, TypeError):
                self._where[node] = []
        return self._where[node]

    def fetcher(self, node: int, root: str, name: str) -> Fetch:
        """Files of checkpoint ``name`` from node ``node``'s ``root`` (``_fill.Fetch``)."""

        async def one(rel: str, f: Mapping[str, Any], target: Path) -> int:
            if node in self.dead:
                raise Mismatch(f"node {node} did not answer before")
            if self._token is None:
                self._token = await anyio.to_thread.run_sync(token, self.run_dir)
            addrs = await anyio.to_thread.run_sync(self._addrs, node)
            why = "no address"
            for addr in addrs[:2]:
                try:
                    return await fetch(addr, self._token, root, f"{name}/{rel}" if rel else name, size=int(f["size"]),
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
    it (what they offered), the next ones after this node first; no other node is asked (at a
    thousand nodes, a file missing everywhere would cost a thousand refusals)."""
    if book is None or not holders:
        return []
    named = {int(k) for k in holders} - {book.me}
    order = sorted(named, key=lambda k: (k - book.me) % nodes)
    return [(f"node-{k}", book.fetcher(k, pair, name)) for k in order]


def holdings(p: SyncPair, local: Listing, profile: Profile | None) -> dict[str, Any]:
    """This node's newest ``HELD_VERSIONS`` whole local versions of ``p`` (judged as finished),
    each a manifest-like document: every file's size, mtime and sha256 (taken from the published
    version's content manifest where size and mtime are its own, else read here: a version
    never published is hashed, an old published one is not). Blocking."""
    out: dict[str, Any] = {}
    whole = sorted((e for e in local.entries.values() if e.complete and e.restorable), key=lambda e: e.order,
                   reverse=True)
    for e in whole[:HELD_VERSIONS]:
        known = _content.read(p.dst, e.name) if p.store is None else None
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


def across(offers: Mapping[int, Mapping[str, Any]], nodes: int) -> dict[str, dict[str, Any]]:
    """Every version whole across the nodes' ``offers`` (node → name → document): a single
    file held by any node (the newest copy by mtime), a directory whose parts from every one of
    ``nodes`` nodes together hold no path twice with different bytes. Each comes back with
    ``holders`` (node → its files)."""
    by_name: dict[str, dict[int, Mapping[str, Any]]] = {}
    for node, held in offers.items():
        for name, doc in held.items():
            by_name.setdefault(name, {})[node] = doc
    out: dict[str, dict[str, Any]] = {}
    for name, docs in by_name.items():
        if all(not d["is_dir"] for d in docs.values()):
            node = max(docs, key=lambda k: int(docs[k]["files"][""]["mtime_ns"]))
            out[name] = {**docs[node], "holders": {str(k): [""] for k, d in docs.items()
                                                   if d["files"][""]["sha256"] == docs[node]["files"][""]["sha256"]}}
            continue
        if any(not d["is_dir"] for d in docs.values()) or set(docs) != set(range(nodes)):
            continue
        union: dict[str, Any] = {}
        holders: dict[str, list[str]] = {}
        clash = False
        for node in sorted(docs):
            for rel, f in docs[node]["files"].items():
                if rel in union and union[rel]["sha256"] != f["sha256"]:
                    clash = True
                union.setdefault(rel, f)
                holders.setdefault(str(node), []).append(rel)
        if clash:
            continue
        first = docs[min(docs)]
        out[name] = {**first, "files": dict(sorted(union.items())), "bytes": sum(int(f["size"]) for f in union.values()),
                     "newest_ns": max(int(f["mtime_ns"]) for f in union.values()), "holders": holders,
                     "markers": sorted({m for d in docs.values() for m in d.get("markers") or ()})}
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
                  entry: Entry | None, *, silent: bool = False) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The leader's choice for one pair from what every node holds (``held``: node → name →
    document) and the newest published version (``published``, its listing ``entry``): the
    choice's value, and what ``restore-choice`` says of it. ``silent``: the persistent side did
    not answer the leader; the nodes then do not wait for it either."""
    value, said = _choose(across(held, nodes), held, published, entry)
    if silent:
        return ({**value, "silent": True} if value is not None else None), {**said, "silent": True}
    return value, said


def _choose(whole: Mapping[str, dict[str, Any]], held: Mapping[int, Mapping[str, Any]], published: str | None,
            entry: Entry | None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    newer = [d for d in whole.values() if newer_than(d, entry)]
    offered = {str(k): sorted(v) for k, v in sorted(held.items())}
    if newer:
        best = newer[0]
        for d in newer[1:]:
            if _later(entry_of(d), entry_of(best)):
                best = d
        said = {"checkpoint": best["checkpoint"], "source": "nodes", "holders": sorted(best["holders"], key=int),
                "published": published, "offered": offered,
                "why": "whole across the nodes and newer than the newest published" if published
                else "whole across the nodes; nothing published"}
        return {**best, "source": "nodes"}, said
    if published is None:
        return None, {"checkpoint": None, "source": None, "offered": offered,
                      "why": "nothing published, nothing whole across the nodes"}
    holders = _holding(held, published, entry)
    return ({"checkpoint": published, "source": "persistent", "holders": holders},
            {"checkpoint": published, "source": "persistent", "holders": sorted(holders, key=int), "offered": offered,
             "why": "the newest published; nothing newer whole across the nodes"})


def wanted(want: str | Mapping[str, Any] | None) -> tuple[str | None, dict[str, Any] | None, Mapping[str, Any] | None]:
    """A choice's value as (name, the version's document when only the nodes hold it, the
    nodes that hold its files)."""
    if want is None or isinstance(want, str):
        return want, None, None
    name = str(want["checkpoint"])
    doc = {k: v for k, v in want.items() if k not in ("holders", "source", "silent")} \
        if want.get("source") == "nodes" else None
    return name, doc, want.get("holders") or {}


def _holding(held: Mapping[int, Mapping[str, Any]], name: str, entry: Entry | None) -> dict[str, list[str]]:
    """The nodes that hold files of the published ``name`` as published (size and mtime its
    listing's: a node's older version of the same name is not that version), and which."""
    if entry is None:
        return {}
    out: dict[str, list[str]] = {}
    for node, docs in held.items():
        doc = docs.get(name)
        rels = [rel for rel, f in (doc or {}).get("files", {}).items()
                if entry.snap.files.get(rel) == (int(f["size"]), int(f["mtime_ns"]))]
        if rels:
            out[str(node)] = rels
    return out
