"""The ring: each node's complete versions copied to the next node's disk while the training
runs (issue 43, ``peer_copies = 1``).

A version on one node's local disk alone dies with that node. Persistent storage closes that
window within seconds while it answers; while it is slow, full or hung, the window lasts the
outage. So node K pushes every complete version of its per-node pair (its part: a DCP node's
shards, rank 0's ``snapshot.pt``, DeepSpeed's node-local files) to node K+1's local disk
(mod the node count, a different host), directly between agents (``_peer``), not through
shared storage and not waiting on the persistent side:

- the ring looks at the few names of the local side written last and the highest steps,
  after every pass and every ``LOOK_S`` (a pass hung on the store does not hold it up), judges each as the pass does
  (``rescan``: open-file evidence, the framework's marker), and pushes a complete one it has
  not pushed in this form;
- every file lands as ``.supervise-peer/node-K/NAME/…`` on the partner, hashed as it is
  sent and verified as it lands; the version's manifest (size, mtime, sha256 of each file)
  goes last, to ``.supervise-peer/node-K/.manifests/NAME.json``, and only when no file
  changed while it was sent: a manifest names a whole, unchanged copy or nothing;
- the partner keeps the newest two (``HELD_VERSIONS``): the ring drops what it pushed
  before those, and each start prunes what earlier attempts left (``_peers.copies``);
- each copy is journaled (``peer-copy``: the version's single-copy exposure, from its save
  to the partner holding it whole); a push that fails is journaled once per version
  (``peer-copy-failed``) and tried again at the next look.

At the next start the copies are offered with the node's own versions (``_peers.copies``),
so a version whole only across the survivors' disks can be chosen, and a node without its
part fetches it from the partner (``_peers.remote``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from supervisor._units import natural_key
from supervisor.bell import Bell
from supervisor.config import SyncPair
from supervisor.journal import Emit
from supervisor.sync import _content
from supervisor.sync._complete import Entry, Listing
from supervisor.sync._manifest import checkpoint_doc
from supervisor.sync._peer import PeerError
from supervisor.sync._peers import HELD_VERSIONS, MANIFESTS, Book
from supervisor.sync._profiles import Profile
from supervisor.sync._state import to_thread

log = logging.getLogger("supervise")

LOOK_S = 2.0          # the ring looks at the local side this often when no pass rang it
CANDIDATES = 3        # the names written last (their own mtime), and the highest steps, judged at each look


def partner(node: int, nodes: int) -> int:
    """The node that keeps node ``node``'s copies: the next one round the ring."""
    return (node + 1) % nodes


class Ring:
    """Node ``node``'s pusher for one per-node pair (module docstring)."""

    def __init__(self, pair: SyncPair, node: int, book: Book, *, rescan: Callable[[str], Listing], emit: Emit,
                 profile: Callable[[], Profile | None]) -> None:
        self.pair, self.node, self.book = pair, node, book
        self.to = partner(node, pair.nodes)
        self.rescan, self.emit, self.profile = rescan, emit, profile
        self.bell = Bell()
        self.sent: dict[str, dict[str, tuple[int, int]]] = {}   # name → its files as last pushed whole
        self.order: list[tuple[tuple, str]] = []                # (version order, name) of those pushed whole
        self.failed: set[tuple[str, int]] = set()               # (name, newest_ns) whose failure was journaled

    @property
    def root(self) -> str:
        """The partner's inbox for this pair (``_peers.roots``)."""
        return f"{self.pair.name}.peer"

    async def run(self, restored: Path | None = None) -> None:
        """Until cancelled: look, push what is new, wait for a pass's listing or ``LOOK_S``.
        The version ``restored`` before the spawn is on every node already: not pushed again."""
        if restored is not None:
            e = (await to_thread(self.rescan, restored.name)).entries.get(restored.name)
            if e is not None:
                self.sent[e.name] = dict(e.snap.files)
        while True:
            for e in reversed(await to_thread(self._complete)):  # the older first: the newer is kept past it
                if self.sent.get(e.name) != e.snap.files and not self._superseded(e):
                    await self._copy(e)
            await self.bell.wait(LOOK_S)

    def _superseded(self, e: Entry) -> bool:
        """Would the partner drop ``e`` at once? Older than the ``HELD_VERSIONS`` newer ones it
        keeps (a version whose directory something touched after it was dropped)."""
        newer = [o for o, n in self.order if n != e.name and o > e.order]
        return len(newer) >= HELD_VERSIONS

    def _complete(self) -> list[Entry]:
        """The newest complete versions on the local side, judged now. Blocking."""
        src = self.pair.src
        try:
            names = [(d.stat(follow_symlinks=False).st_mtime_ns, d.name) for d in os.scandir(src)
                     if not d.name.startswith(".")]
        except OSError:
            return []
        newest = {n for _m, n in sorted(names, reverse=True)[:CANDIDATES]}     # written last (a file saved again)
        newest |= set(sorted((n for _m, n in names), key=natural_key)[-CANDIDATES:])  # the highest steps
        out = []
        for name in sorted(newest):
            e = self.rescan(name).entries.get(name)
            if e is not None and e.complete and e.restorable and e.snap.files:
                out.append(e)
        out.sort(key=lambda e: e.order, reverse=True)
        return out[:HELD_VERSIONS]

    async def _copy(self, e: Entry) -> None:
        t0 = time.monotonic()
        here = f"node-{self.node}"
        hashes: dict[str, str] = {}
        try:
            for rel in sorted(e.snap.files):
                path = self.pair.src / e.name / rel if rel else self.pair.src / e.name
                sent = await self.book.send(self.to, self.root, path, f"{here}/{e.name}/{rel}" if rel else f"{here}/{e.name}")
                hashes[rel] = sent.sha256
            if not await to_thread(_unchanged, self.pair.src / e.name, e):
                return  # written again while it was sent: the next look takes the new version
            doc = checkpoint_doc(e, {rel: _content.entry(s, m, hashes[rel]) for rel, (s, m) in e.snap.files.items()},
                                 profile=self.profile(), extra={"node": self.node, "copied_at": round(time.time(), 3)})
            await self._send_doc(f"{here}/{MANIFESTS}/{e.name}.json", doc)
        except PeerError as err:
            if (e.name, e.snap.newest_ns) not in self.failed:
                self.failed.add((e.name, e.snap.newest_ns))
                self.emit("peer-copy-failed", pair=self.pair.name, node=self.node, partner=self.to,
                          checkpoint=e.name, error=str(err))
                log.warning("node %d: copying %s to node %d failed (%s); tried again at the next look",
                            self.node, e.name, self.to, err)
            return
        exposure = max(0.0, time.time() - e.snap.newest_ns / 1e9)
        self.sent[e.name] = dict(e.snap.files)
        self.order = sorted([o for o in self.order if o[1] != e.name] + [(e.order, e.name)])
        dropped = await self._drop_old(here)
        self.emit("peer-copy", pair=self.pair.name, node=self.node, partner=self.to, checkpoint=e.name,
                  files=len(e.snap.files), bytes=e.snap.bytes, seconds=round(time.monotonic() - t0, 3),
                  exposure_s=round(exposure, 3), dropped=dropped)

    async def _send_doc(self, rel: str, doc: dict[str, Any]) -> None:
        """``doc`` to the partner at ``rel``, through a temp file (a push sends a file)."""
        tmp = await to_thread(_temp_json, doc)
        try:
            await self.book.send(self.to, self.root, tmp, rel)
        finally:
            await to_thread(tmp.unlink)

    async def _drop_old(self, here: str) -> list[str]:
        """The partner keeps the newest ``HELD_VERSIONS`` this node pushed: older ones go,
        their manifest first (a copy without its manifest is never offered). The names dropped."""
        dropped = []
        while len(self.order) > HELD_VERSIONS:
            _o, old = self.order.pop(0)
            self.sent.pop(old, None)
            try:
                await self.book.remove(self.to, self.root, f"{here}/{MANIFESTS}/{old}.json")
                await self.book.remove(self.to, self.root, f"{here}/{old}")
            except PeerError as err:
                log.info("node %d: dropping %s on node %d failed (%s); its next start prunes it", self.node, old,
                         self.to, err)
            else:
                dropped.append(old)
        return dropped


def _temp_json(doc: dict[str, Any]) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=".supervise-ring-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return Path(tmp)


def _unchanged(path: Path, e: Entry) -> bool:
    """Are ``e``'s files still the size and mtime they were judged at? Blocking."""
    for rel, (size, mtime) in e.snap.files.items():
        try:
            st = os.lstat(path / rel if rel else path)
        except OSError:
            return False
        if (st.st_size, st.st_mtime_ns) != (size, mtime):
            return False
    return True
