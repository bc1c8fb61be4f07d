"""Parts of a multi-node checkpoint on persistent storage; blocking steps, run in threads.

When every node writes its shards of a checkpoint to its own local disk, each node's mirror
stages *its part* next to the destination and the leader (node 0) assembles the parts once
every one of them is durable::

    <persistent>/.supervise-parts/<checkpoint>/node-<K>/       node K's files (copy target)
    <persistent>/.supervise-parts/<checkpoint>/node-<K>.json   node K's manifest, written last
    <persistent>/.supervise-parts/<checkpoint>/complete-on-node-0   the leader saw node 0's part complete

The manifest (files with sizes and mtimes, the markers, fsynced, temp + rename) is the part's
commit point: a part without one is work in progress, and a node that sees its local files
change after writing one removes it before it copies again. ``assemble`` hard-links every
part's files into the ordinary staging directory (``rename`` where the filesystem refuses
links), markers last, verifies the result against the union of the manifests, and renames it
into place: a checkpoint appears complete or not at all (docs/design.md, invariant 1).
Rules and events: docs/sync.md, "Multi-node checkpoints".
"""

from __future__ import annotations

import errno
import filecmp
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from supervisor.rawfile import read_once
from supervisor.sync import _content
from supervisor.sync._complete import STAGING_PREFIX, Entry, Snap, matches, snapshot
from supervisor.sync._fsops import create_exclusive, fsync_dir, prune_staging, swap_in

PARTS_DIR = ".supervise-parts"
MANIFEST_VERSION = 1
GO_FILE = "complete-on-node-0"  # in .supervise-parts/<checkpoint>/: the leader saw it complete


class PartConflict(Exception):
    """Two parts hold the same path with different contents (or a file and a directory)."""

    def __init__(self, checkpoint: str, path: str, nodes: list[int]) -> None:
        super().__init__(f"{checkpoint}: {path or checkpoint} differs between nodes "
                         f"{', '.join(str(n) for n in nodes)}")
        self.path = path
        self.nodes = nodes


class PartsChanged(Exception):
    """A part's files no longer match its manifest (its node is copying it again)."""


def parts_root(dst: Path) -> Path:
    return dst / PARTS_DIR


def part_dir(dst: Path, name: str, node: int) -> Path:
    return parts_root(dst) / name / f"node-{node}"


def manifest_path(dst: Path, name: str, node: int) -> Path:
    return parts_root(dst) / name / f"node-{node}.json"


def go_path(dst: Path, name: str) -> Path:
    """The leader's word that node 0's part of ``name`` is complete (``write_go``)."""
    return parts_root(dst) / name / GO_FILE


def write_go(dst: Path, name: str) -> None:
    """Leader: node 0's part of ``name`` is complete by rank 0's own marker (written after a
    barrier behind every rank's writes): the other nodes' shards are final, they need not
    wait for ``settle``."""
    path = go_path(dst, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def part_source(dst: Path, name: str, node: int, rel: str) -> Path:
    """Where file ``rel`` of node ``node``'s part lies (``""``: a single-file checkpoint)."""
    d = part_dir(dst, name, node)
    return d / (rel or name)


def write_manifest(dst: Path, name: str, node: int, nodes: int, snap: Snap, *, is_dir: bool,
                   markers: tuple[str, ...], why: str, done_at: float | None,
                   hashes: Mapping[str, str] | None = None) -> Path:
    """The part's commit point: written last, temp + rename, always fsynced (file and dir).
    Each file is ``[size, mtime_ns, sha256]`` (the sha256 left out when ``hashes`` lacks it)."""
    path = manifest_path(dst, name, node)
    hashes = hashes or {}
    body = {"v": MANIFEST_VERSION, "checkpoint": name, "node": node, "nodes": nodes,
            "host": socket.gethostname(), "pid": os.getpid(), "is_dir": is_dir,
            "files": {rel: [size, mt, *([hashes[rel]] if rel in hashes else [])]
                      for rel, (size, mt) in sorted(snap.files.items())},
            "markers": list(markers), "bytes": snap.bytes, "why": why, "done_at": done_at,
            "written_at": round(time.time(), 6)}
    tmp = path.with_name(f".{path.name}.tmp")
    with open(create_exclusive(tmp), "w", encoding="utf-8") as f:  # O_EXCL|O_NOFOLLOW (issue 14)
        json.dump(body, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path


def read_manifest(path: Path) -> dict[str, Any] | None:
    """A manifest, or None when missing or unreadable (a torn one is not a part). One open
    and its reads (``rawfile``), once per node per checkpoint (issue 44)."""
    try:
        body = json.loads(read_once(path, nofollow=True))
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("files"), dict):
        return None
    return body


def manifest_snap(body: Mapping[str, Any]) -> Snap:
    files = {rel: (int(v[0]), int(v[1])) for rel, v in body["files"].items()}
    return Snap(files, max((m for _s, m in files.values()), default=0), sum(s for s, _m in files.values()))


def withdraw(dst: Path, name: str, node: int) -> bool:
    """Remove node ``node``'s manifest of ``name`` (its part is being copied again)."""
    try:
        os.unlink(manifest_path(dst, name, node))
    except FileNotFoundError:
        return False
    return True


Ident = tuple[int, int, int]  # a manifest file as it is now: (inode, size, mtime_ns)


def ident_of(st: os.stat_result) -> Ident:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def waiting(dst: Path) -> dict[str, dict[int, Ident]]:
    """Checkpoints with parts on persistent storage: name → {node: its manifest's ``Ident``}."""
    out: dict[str, dict[int, Ident]] = {}
    root = parts_root(dst)
    try:
        names = [n for n in os.listdir(root) if not n.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):
        return out
    for name in names:
        have: dict[int, Ident] = {}
        try:
            with os.scandir(root / name) as it:
                for e in it:
                    n = e.name
                    if n.startswith("node-") and n.endswith(".json") and n[5:-5].isdigit():
                        try:
                            have[int(n[5:-5])] = ident_of(e.stat(follow_symlinks=False))
                        except FileNotFoundError:
                            continue
        except (FileNotFoundError, NotADirectoryError):
            continue
        out[name] = have
    return out


def taken(dst: Path, names: list[str], node: int) -> list[str]:
    """Node K: those of its parts ``names`` whose manifest the leader has removed
    (published, or superseded by a newer version). One stat per part."""
    return [n for n in names if not os.path.lexists(manifest_path(dst, n, node))]


def tidy(dst: Path, taken: list[str], node: int) -> None:
    """Node K: the part directories of parts the leader has taken go; what they held is
    published (hard links) or superseded."""
    for name in taken:
        shutil.rmtree(part_dir(dst, name, node), ignore_errors=True)
        try:
            os.rmdir(part_dir(dst, name, node).parent)
        except OSError:
            pass  # another node's part, or the leader's word, is still there


def missing_from(dst: Path, node: int) -> list[str]:
    """Checkpoints that have parts on ``dst``, are not published, and lack node ``node``'s
    manifest: what could not be published without that node (``node-lost``)."""
    root = parts_root(dst)
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [name for name in names if not (dst / name).exists() and (root / name).is_dir()
            and not manifest_path(dst, name, node).exists()]


def release_parts(dst: Path, name: str, manifests: Mapping[int, Mapping[str, Any]],
                  idents: Mapping[int, Ident] | None = None) -> None:
    """The leader, once ``manifests`` are published (or superseded): each manifest is removed
    if it is still the one read (its node may have withdrawn it to stage a newer version of
    the same name), node 0's part directory with it, and the leader's word (``GO_FILE``).
    Node K's part directory stays: node K may be copying into it right now; its files are
    hard links to the published ones (no space) and node K reuses it for the next version.
    ``idents``: each manifest's file as it was read (``waiting``); one stat tells it is still
    that one, where reading it again took an open and its reads."""
    idents = idents or {}
    for node, m in manifests.items():
        path = manifest_path(dst, name, node)
        if node in idents:
            try:
                if ident_of(os.lstat(path)) != idents[node]:
                    continue
            except FileNotFoundError:
                continue
        elif read_manifest(path) != m:
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        if node == 0:
            shutil.rmtree(part_dir(dst, name, 0), ignore_errors=True)
    try:
        os.unlink(go_path(dst, name))
    except FileNotFoundError:
        pass
    try:
        os.rmdir(parts_root(dst) / name)
    except OSError:
        pass  # node K's part directory is still there


def assembled_snap(manifests: Mapping[int, Mapping[str, Any]]) -> Snap:
    """The version the parts make together: the union of their files, a path several nodes
    hold as the lowest of them holds it (``assemble`` places that one)."""
    files: dict[str, tuple[int, int]] = {}
    for node in sorted(manifests, reverse=True):
        files.update(manifest_snap(manifests[node]).files)
    return Snap(files, max((mt for _s, mt in files.values()), default=0), sum(s for s, _m in files.values()))


@dataclass
class Assembled:
    files: int
    bytes: int
    parts: dict[int, int]       # node → files it contributed
    shared: list[str]           # paths several nodes held, identical
    done_at: float | None       # the latest of the parts' completion times
    linked: bool                # hard links (False: the parts' files were renamed)
    differing: list[str] = field(default_factory=list)  # replicas' paths that differed: the lowest node's kept


_LINK_REFUSED = (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES)


def _place(src: Path, dst: Path, size: int) -> bool:
    """Hard-link ``src`` at ``dst`` (rename where links are refused). True if linked. Its
    directory exists (``assemble`` makes each once).

    One call on shared storage for each file of each node's part (issue 44): the link is tried
    first, and what is there already is looked at only when it fails. Idempotent, so a
    leader killed mid-assembly resumes: a ``dst`` that is ``src`` already, or (after a rename)
    is there with the right size while ``src`` is gone, is kept.
    """
    try:
        os.link(src, dst, follow_symlinks=False)
        return True
    except FileExistsError:
        try:
            if os.path.samefile(src, dst):
                return True
        except FileNotFoundError:  # src renamed into place before: dst is it, if whole
            if os.lstat(dst).st_size == size:
                return False
            raise
        os.unlink(dst)
        return _place(src, dst, size)
    except FileNotFoundError:
        try:
            if os.lstat(dst).st_size == size:  # src renamed into place before
                return False
        except FileNotFoundError:
            pass
        raise
    except OSError as e:
        if e.errno not in _LINK_REFUSED:
            raise
    os.rename(src, dst)
    return False


def _fsync_dirs(staging: Path, rels: Iterable[str]) -> None:
    """The assembly's directories, deepest first: the links are entries in them. Each part's
    files were made durable by their node before its manifest (its copy fsyncs, by the same
    pair's ``fsync``), so their data is not written again here: one fsync per directory, not
    one open and fsync per file of every node (issue 44)."""
    dirs = {staging} | {(staging / rel).parent for rel in rels}
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(d)


def _same(a: Path, b: Path) -> bool:
    try:
        return filecmp.cmp(a, b, shallow=False)
    except FileNotFoundError:
        return False


def _same_bytes(a: Mapping[str, Any], b: Mapping[str, Any], rel: str, pa: Path, pb: Path) -> bool:
    """Do two parts hold ``rel`` with the same bytes? Their manifests' sha256 say so without
    reading the persistent copies back; parts without one are compared byte for byte."""
    fa, fb = a["files"].get(rel), b["files"].get(rel)
    if isinstance(fa, list) and isinstance(fb, list) and len(fa) > 2 and len(fb) > 2:
        return fa[2] == fb[2]
    return _same(pa, pb)


def replicas(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Did both nodes write a whole checkpoint of their own (each part carries the framework's
    marker: HF's ``save_on_each_node``, DeepSpeed's node-local storage)? Then a path they hold
    differently is each node's own view (HF's ``trainer_state.json`` says
    ``is_world_process_zero``), not two halves that disagree."""
    return bool(a.get("markers")) and bool(b.get("markers"))


def _write_content(dst: Path, name: str, manifests: Mapping[int, Mapping[str, Any]], owner: Mapping[str, int],
                   want: Snap, *, is_dir: bool, markers: set[str], done_at: float | None, fsync: bool) -> None:
    """The assembled version's content manifest (``_content``), before its rename, from the
    sha256 each node's part manifest carries for the files it placed; none when a part lacks
    them (written by an older agent): the restore then trusts sizes, as before."""
    hashes: dict[str, str] = {}
    for rel, node in owner.items():
        f = manifests[node]["files"].get(rel)
        if not isinstance(f, list) or len(f) < 3:
            _content.drop(dst, name)
            return
        hashes[rel] = str(f[2])  # a link's: link:<target> (``_content.hash_files``)
    e = Entry(name=name, is_dir=is_dir, snap=want, complete=True, why=f"all {len(manifests)} parts", done_at=done_at,
              markers=tuple(sorted(markers)))
    _content.write(dst, _content.doc_for(e, want, hashes, profile=None, nodes=len(manifests)), fsync=fsync)


def assemble(dst: Path, name: str, manifests: Mapping[int, Mapping[str, Any]], *, fsync: bool) -> Assembled:
    """Every part of ``name`` into ``.supervise-staging-<name>``, markers last, verified, renamed
    to ``<name>``. A path in two parts must be identical, unless both parts are whole
    checkpoints by their own marker (``replicas``): then the lowest node's is kept and named in
    ``differing``. Raises PartConflict (never published) or PartsChanged (try again later)."""
    kinds = {bool(m.get("is_dir", True)) for m in manifests.values()}
    if len(kinds) > 1:
        raise PartConflict(name, "", sorted(manifests))
    is_dir = kinds.pop()
    union: dict[str, tuple[int, int]] = {}
    owner: dict[str, int] = {}
    markers: set[str] = set()
    shared: list[str] = []
    differing: list[str] = []
    parts: dict[int, int] = {}
    for node in sorted(manifests):
        m = manifests[node]
        markers.update(m.get("markers") or ())
        snap = manifest_snap(m)
        parts[node] = len(snap.files)
        for rel, (size, mt) in snap.files.items():
            if rel in union:
                first = owner[rel]
                if union[rel][0] == size and _same_bytes(manifests[first], m, rel, part_source(dst, name, first, rel),
                                                         part_source(dst, name, node, rel)):
                    shared.append(rel)
                elif replicas(manifests[first], m):
                    differing.append(rel)
                else:
                    raise PartConflict(name, rel, [first, node])
                continue
            union[rel] = (size, mt)
            owner[rel] = node
    want = Snap(union, max((m for _s, m in union.values()), default=0), sum(s for s, _m in union.values()))
    staging = dst / f"{STAGING_PREFIX}{name}"
    final = dst / name
    linked = True
    order = sorted(union, key=lambda r: (r in markers, r))  # markers last
    if is_dir:
        if os.path.lexists(staging) and not os.path.isdir(staging):
            os.unlink(staging)
        staging.mkdir(exist_ok=True)
        for d in sorted({(staging / rel).parent for rel in order} - {staging}):
            d.mkdir(parents=True, exist_ok=True)  # each directory once, not once per file
        for rel in order:
            linked &= _place(part_source(dst, name, owner[rel], rel), staging / rel, union[rel][0])
    else:
        linked &= _place(part_source(dst, name, owner[""], ""), staging, union[""][0])
    got = snapshot(staging)
    if got is not None and is_dir and got.files.keys() != union.keys():
        prune_staging(staging, want)
        got = snapshot(staging)
    if not matches(got, want):
        raise PartsChanged(f"{name}: the staged parts do not match their manifests")
    if fsync and is_dir:
        _fsync_dirs(staging, union)
    done = [float(m["done_at"]) for m in manifests.values() if isinstance(m.get("done_at"), (int, float))]
    _write_content(dst, name, manifests, owner, want, is_dir=is_dir, markers=markers,
                   done_at=max(done) if done else None, fsync=fsync)
    swap_in(staging, final, is_dir=is_dir, fsync=fsync)
    return Assembled(len(union), want.bytes, parts, sorted(set(shared)), max(done) if done else None, linked,
                     sorted(set(differing)))
