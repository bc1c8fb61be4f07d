"""The persistent side of one pair as its jobs ask it: a port, chosen once per pair.

As httpx's client takes a transport instead of being subclassed per transport, the
publishers (``_publish.Publisher``, ``_partpublish.PartPublisher``), the leader's assembly
and node K's hand-over (``_assembly.Assembly``, ``_partpublish.Handover``), the roles
(``_roles.py``) and the restorer (``_restore.Restorer``) take the persistent side they are
given and never ask which kind it is. ``Side`` is what publishing whole checkpoints asks of
it, ``PartSide`` what staging one node's parts asks, ``GatherSide`` what gathering every
node's parts asks, ``RestoreSide`` what a restore asks, ``Logs`` a log pair's pass.
``Storage`` hands a pair's jobs their sides; ``_pair.storage_for`` chooses it, once. A
directory answers them in ``_dirside.py`` (``Directory``), an object store in
``_storeroles.py`` (``ObjectStore``, its parts and gathering) with ``_storepub.py`` (publish,
restore) and ``_storelogs.py``; a new kind of persistent storage is one more implementation
of the same questions.

What a side needs of the publisher (may this run replace a name, refuse it) is the
``Ledger`` both are given, never an attribute of the other.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from supervisor.sync._backend import CopyResult
from supervisor.sync._complete import Entry, Listing, Pointer, Snap
from supervisor.sync._fill import Fetch
from supervisor.sync._state import PairState

RECOPY_TRIES = 3  # a version that changed while copied is copied again at most this often per pass


@dataclass
class Landed:
    """A version that is on the persistent side now: ``entry`` as published (the last copy's),
    ``again`` the local side's listing of it after the copy, ``fields`` what the ``publish``
    (or ``part``) event says besides (an object store: its ``manifest`` key)."""

    entry: Entry
    again: Listing
    fields: dict[str, Any]


class Ledger:
    """What this run directory may replace on the persistent side, and what it refused there:
    the publisher's facts that a side needs, handed to both explicitly. ``ours``: names this
    run directory published in earlier attempts (None: history unknown, every entry may be
    replaced as before)."""

    def __init__(self, state: PairState, ours: set[str] | None = None) -> None:
        self.state = state
        self.ours = ours
        self.refused: set[str] = set()
        self.pointers_done: dict[str, bytes] = {}  # pointer → the content published

    def owns(self, name: str) -> bool:
        """This run directory published ``name`` (a checkpoint, or a pointer or link, in this
        attempt or an earlier one), whatever it has turned into since (a Lightning
        ``last.ckpt`` link replaced by a regular file): it may replace it (issue 22)."""
        return self.ours is None or name in self.ours or name in self.state.published or name in self.pointers_done

    def refuse(self, name: str, what: str = "checkpoint") -> None:
        """An entry of that name is on the persistent side and this run never published it
        (another run's, sharing the directory): it is never replaced. Journaled once; the
        local one stays pending, so ``end.not_durable`` and the report name it."""
        if name not in self.refused:
            self.refused.add(name)
            self.state.emit("sync-refused", pair=self.state.pair.name, checkpoint=name, what=what,
                            why="on the persistent side already and not published by this run directory: not replaced")


class Side(Protocol):
    """The persistent side as publishing whole checkpoints asks it."""

    async def there(self, name: str) -> Snap | None:
        """What the persistent side holds under ``name`` (None: nothing)."""

    async def drop(self, name: str) -> None:
        """A failed publish's leftovers (never published, so ours)."""

    async def pointer_there(self, name: str) -> bool:
        """Is a pointer or link of that name on the persistent side?"""

    async def write_pointer(self, ptr: Pointer, target: str) -> bool:
        """The pointer or link on the persistent side, as the local one; False: it was there
        already (or, refused, it is another run's)."""

    async def land(self, e: Entry, stats: CopyResult) -> Landed | None:
        """Stage, verify and commit ``e`` (copies add to ``stats``): after it, the version is
        published whole, or not at all. None: it vanished, stopped being complete, kept
        changing (journaled), or another run holds the name (refused)."""


class PartSide(Protocol):
    """The persistent side as staging one node's parts of a per-node pair asks it."""

    async def published_as(self, e: Entry) -> tuple[Snap | None, bool] | None:
        """``e.name`` on persistent storage, if it is there: (its snapshot, whether it holds
        this node's ``e``)."""

    async def inside_published(self, e: Entry) -> bool:
        """Are this node's files of ``e`` (incomplete here) all in the published ``e.name``?"""

    async def part_there(self, e: Entry) -> bool:
        """Is this node's part of ``e`` staged already, from these very files (an earlier
        attempt)? An older part of this node's is withdrawn (``part-withdrawn``)."""

    async def stage_part(self, e: Entry, stats: CopyResult) -> Landed | None:
        """This node's files of ``e`` staged, verified, then its part manifest. None: it
        vanished, stopped being complete, kept changing (journaled), or refused."""

    async def drop_part(self, name: str) -> None:
        """A part that failed to stage (never published): dropped."""


@dataclass
class Brought:
    """A version brought back onto local disk (``RestoreSide.bring``): where, what moved from
    the persistent side (``stats``; ``copied``: whether anything did), and the ``restore``
    event's ``source`` (the persistent copy, or ``"nodes"``)."""

    dest: Path
    stats: CopyResult
    source: str | Path
    copied: bool


class RestoreSide(Protocol):
    """The persistent side as a restore asks it. What a restore says differs a little by side,
    and is the side's to say: ``unverified_as``, the ``restore`` event's field naming the
    versions skipped because no copy verified; ``none_verified``, its reason when none did;
    ``repoints_kept``, whether a local checkpoint kept over the persistent one gets its profile
    pointer rewritten to name it (``Restorer._repoint``)."""

    unverified_as: str
    none_verified: str
    repoints_kept: bool

    async def listing(self, doc: Mapping[str, Any] | None, slow: bool) -> tuple[Listing, dict[str, Any]]:
        """Its checkpoints and pointers as a listing judged as finished, with the manifests
        that describe them where it keeps them with the listing (name → document; else {}).
        ``doc``: the leader chose a version only the nodes hold (its manifest); ``slow``: the
        persistent side did not answer before, so a choice the nodes can serve waits no more."""

    async def bring(self, best: Entry, docs: Mapping[str, Any], listing: Listing, local: Listing, *,
                    keep_newer: bool, doc: Mapping[str, Any] | None,
                    peers: Sequence[tuple[str, Fetch]]) -> Brought:
        """``best`` onto local disk from the nearest copy that verifies against its manifest
        (``_fill``), journaled (``restore-verify``). Raises ``Unverified`` when no copy does."""

    def failed_reason(self, chosen: bool) -> str:
        """``restore-verify``'s reason for a version no copy verified (``chosen``: the leader's
        choice for every node, which is that version or nothing)."""



@dataclass
class Whole:
    """A per-node pair's checkpoint published whole from its parts (``GatherSide.assemble``):
    the version now published, its files and bytes, its completion time (the latest part's),
    and what the ``publish`` event says besides (after ``nodes``)."""

    version: Snap
    files: int
    bytes: int
    done_at: float | None
    fields: dict[str, Any]


class GatherSide(Protocol):
    """The persistent side as a per-node pair's gathering asks it: the leader's
    (``_assembly.Assembly``, the leader's parts watch and leftovers) and node K's
    (``_partpublish.Handover``, its parts watch and judgement). ``have``: what the side lists
    of a checkpoint's parts (its own shape, handed back to ``current``); ``manifests``: node →
    its part manifest."""

    async def write_go(self, name: str) -> bool:
        """Node 0's word that ``name`` is complete, for the other nodes; False: said already."""

    def persistent_target(self, name: str) -> str | None:
        """The checkpoint the persistent pointer ``name`` names, or None. Blocking."""

    async def parts_waiting(self) -> list[tuple[str, Any]]:
        """Each checkpoint with parts there, newest name first, with what is there of them."""

    async def current(self, name: str, have: Any) -> dict[int, dict[str, Any]]:
        """The part manifests of ``name`` holding a version not yet published; those the
        published version already holds (or a newer one replaced) are released here."""

    def snap_of(self, manifest: Mapping[str, Any]) -> Snap:
        """What a part manifest says its node's files are."""

    async def short(self, name: str, manifests: Mapping[int, Mapping[str, Any]]) -> str | None:
        """The ranks' shards that no node's part of ``name`` holds (None: none missing, or not asked)."""

    async def assemble(self, name: str, manifests: Mapping[int, Mapping[str, Any]], single: bool) -> Whole | None:
        """Every part into the checkpoint, published whole or not at all. None: refused
        (another run's). Raises ``_parts.PartConflict`` (two nodes' bytes differ at one path),
        ``PartsChanged`` or ``FileNotFoundError`` (a node is staging its part again)."""

    async def release(self, name: str, manifests: Mapping[int, Mapping[str, Any]]) -> None:
        """After ``assemble``: the parts it took are released (their nodes see them taken)."""

    async def parts_now(self) -> tuple[Any, bool]:
        """The leader's look at every node's parts: something to compare with the last look,
        and whether any part is there. Raises ``OSError`` when the side does not answer."""

    def leftovers(self) -> list[Path]:
        """The leader's leftovers on the persistent side to remove at start. Blocking."""

    def said_go(self, name: str) -> bool:
        """Node K: did node 0 say ``name`` is complete? Blocking."""

    async def look(self, awaiting: set[str], parted: list[str]) -> bool:
        """Node K's look: node 0 said a checkpoint in ``awaiting`` is complete, or the leader
        took one of this node's parts (``parted``): a pass is due."""

    async def taken(self, parted: list[str]) -> list[str]:
        """Node K: those of its parts the leader has taken (published, or superseded)."""

    async def tidy(self, gone: list[str]) -> None:
        """Node K: after the parts ``gone`` were taken, what it keeps of them goes."""


class Logs(Protocol):
    """A log pair's pass: what grew since the last one, grown in place on the persistent side."""

    async def run(self, stats: CopyResult, trigger: str, *, batch: float) -> None: ...


class Storage(Protocol):
    """One kind of persistent storage for one pair: the sides its jobs are given, chosen
    once per pair (``_pair.storage_for``) and asked, never told apart."""

    def whole(self, ledger: Ledger) -> Side:
        """The side whole checkpoints are published to (a pair of one node)."""

    def per_node(self, ledger: Ledger, node: int) -> tuple[Side, PartSide, GatherSide]:
        """A per-node pair on node ``node``: where its pointers go, its parts, its gathering."""

    def restore(self) -> RestoreSide:
        """The side a restore lists and brings back from."""

    def logs(self, recheck: Callable[[float], None]) -> Logs:
        """The log pass of a log pair (``_logs.LogPass``, ``_storelogs.StoreLogs``)."""

    async def prepare(self) -> None:
        """Before each pass: the persistent side is ready to be written (a directory: made)."""

    def probe(self) -> str | None:
        """Before anything starts: may this run write the persistent side? Raises
        ``ConfigError`` (exit 2) when it may not; a warning line when it cannot tell (a store
        that does not answer). Blocking."""

    @property
    def backend(self) -> str:
        """What the ``sync`` event names as the pair's backend."""

    def leftovers(self) -> list[Path]:
        """A pair of one node's leftovers on the persistent side to remove at start. Blocking."""

    def content_manifest(self, name: str) -> Mapping[str, Any] | None:
        """The content manifest a directory keeps beside the published ``name`` (``_content``),
        whose hashes spare a node rehashing its copy of that version; None where there is none
        (an object store's manifests are read by the restore itself). Blocking."""


def same_files(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Do two manifests name the same files with the same sha256?"""
    fa, fb = a["files"], b["files"]
    return fa.keys() == fb.keys() and all(fa[r]["sha256"] == fb[r]["sha256"] for r in fa)
