"""The leader's assembly of a per-node checkpoint, by what it asks of shared storage (issue 44).

At 1,024 nodes every call per node is a thousand metadata operations on the parallel
filesystem, one after another, per checkpoint. Counted with ``strace`` on the real calls
(``DirGather`` as the leader runs it), not timed: a manifest is read once however many passes
see it arrive, each file of each part is one link, and only directories are fsynced (the
parts' files were made durable by their nodes before their manifests).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from supervisor.config import SyncPair
from supervisor.sync._complete import Snap
from supervisor.sync._dirside import DirGather
from supervisor.sync._parts import PartsChanged, assemble, part_dir, waiting, write_manifest
from supervisor.sync._state import PairState

NAME = "step_000010"


def stage_parts(dst: Path, nodes: range, total: int) -> None:
    """Each node's part of a DCP-shaped checkpoint as its agent leaves it: its shard (node 0:
    the marker too), then its manifest."""
    for k in nodes:
        d = part_dir(dst, NAME, k)
        d.mkdir(parents=True)
        files = {}
        rels = [f"__{k}_0.distcp"] + ([".metadata"] if k == 0 else [])
        for rel in rels:
            (d / rel).write_bytes(bytes([k % 256]) * 4096)
            st = (d / rel).stat()
            files[rel] = (st.st_size, st.st_mtime_ns)
        write_manifest(dst, NAME, k, total, Snap(files, max(m for _s, m in files.values()), 4096 * len(files)),
                       is_dir=True, markers=(".metadata",) if k == 0 else (), why="marker", done_at=time.time())


def gather(dst: Path, nodes: int) -> DirGather:
    pair = SyncPair("ckpt", "checkpoint", dst.parent / "local", dst, nodes=nodes, fsync=True)
    return DirGather(PairState(pair, backend=None, emit=lambda *a, **k: None), node=0)  # type: ignore[arg-type]


def every_part_read(tmp_path: Path, n: int) -> tuple[Path, DirGather, dict[int, dict]]:
    """Every node's part staged, and the leader's pass that read them all."""
    dst = tmp_path / "persist"
    dst.mkdir()
    stage_parts(dst, range(n), n)
    g = gather(dst, n)
    return dst, g, g.current_parts(NAME, waiting(dst)[NAME])


LEADER = """
import sys, anyio
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_assembly_cost import NAME, gather, stage_parts
from supervisor.sync._parts import waiting
dst, n = Path(sys.argv[1]), int(sys.argv[2])
g = gather(dst, n)                            # half the parts are there: a pass finds the rest missing
assert len(g.current_parts(NAME, waiting(dst)[NAME])) == n - n // 2
print("STAGED", flush=True)
sys.stdin.readline()                          # the other half land
ms = g.current_parts(NAME, waiting(dst)[NAME])
assert len(ms) == n, len(ms)
anyio.run(g.assemble, NAME, ms, False)
anyio.run(g.release, NAME, ms)
"""


def test_a_manifest_is_read_once_and_each_file_is_one_link(tmp_path: Path) -> None:
    if shutil.which("strace") is None:
        pytest.skip("needs strace (scripts/setup.sh installs it)")
    n = 64
    dst = tmp_path / "persist"
    dst.mkdir()
    trace = tmp_path / "leader.strace"
    script = tmp_path / "leader.py"
    script.write_text(LEADER.format(tests=str(Path(__file__).parent)))
    stage_parts(dst, range(n // 2, n), n)  # by the test, not traced: the nodes' work
    proc = subprocess.Popen(["strace", "-f", "-qq", "-y", "-e", "trace=%file,getdents64,fsync", "-o", str(trace),
                             sys.executable, str(script), str(dst), str(n)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "STAGED"
    stage_parts(dst, range(0, n // 2), n)
    proc.stdin.write("\n")
    proc.stdin.close()
    assert proc.wait(timeout=120) == 0
    calls = [line for line in trace.read_text().splitlines() if str(dst) in line and "STAGED" not in line]
    by = {}
    for line in calls:
        call = line.split(None, 1)[1].split("(", 1)[0]
        by[call] = by.get(call, 0) + 1
    manifest_opens = [c for c in calls if "openat(" in c and ".json" in c and ".tmp" not in c and "O_RDONLY" in c]
    assert len(manifest_opens) == n, (len(manifest_opens), by)  # the half seen twice was read once
    assert by.get("linkat", 0) == n + 1, by                       # one link per file: n shards and the marker
    assert by.get("fsync", 0) <= 4, by                             # directories only, never each file again
    assert by.get("mkdir", 0) <= 4, by                             # each directory once, not once per file
    # what is left per node: a stat per pass while parts arrive, the manifest's read, the
    # link, the verify's stat, and at release a stat and the unlink (15 per node before)
    assert len(calls) <= 8 * n, (len(calls), by)
    assert sorted(os.listdir(dst / NAME)) == sorted([".metadata", *(f"__{k}_0.distcp" for k in range(n))])
    assert not list((dst / ".supervise-parts").glob(f"{NAME}/node-*.json")), "every manifest released"


def test_an_assembly_cut_short_resumes_whether_the_parts_were_linked_or_renamed(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader killed mid-assembly leaves some files in the staging directory (linked, or
    renamed where links are refused); the next leader's assembly keeps them and completes."""
    n = 4
    dst, g, ms = every_part_read(tmp_path, n)
    staging = dst / f".supervise-staging-{NAME}"
    staging.mkdir()
    os.link(part_dir(dst, NAME, 1) / "__1_0.distcp", staging / "__1_0.distcp")   # linked before the kill
    os.rename(part_dir(dst, NAME, 2) / "__2_0.distcp", staging / "__2_0.distcp")  # renamed before the kill
    (staging / "__3_0.distcp").write_bytes(b"torn")                              # a stray: replaced
    real_link = os.link

    def refused_for_node_3(src, dst_, *a, **k):  # noqa: ANN001, ANN202 - os.link's own signature
        if "node-3" in str(src):
            raise OSError(errno.EPERM, "links refused here")
        return real_link(src, dst_, *a, **k)

    monkeypatch.setattr(os, "link", refused_for_node_3)
    got = assemble(dst, NAME, ms, fsync=True)
    assert got.files == n + 1 and got.linked is False
    for k in range(n):
        assert (dst / NAME / f"__{k}_0.distcp").read_bytes() == bytes([k]) * 4096


def test_a_part_changed_under_the_assembly_is_never_published(tmp_path: Path) -> None:
    """Node 1 stages its part again after the leader read its manifest: the files no longer
    match what the manifest says, and nothing is published."""
    n = 2
    dst, g, ms = every_part_read(tmp_path, n)
    (part_dir(dst, NAME, 1) / "__1_0.distcp").write_bytes(b"a newer, longer shard" * 400)
    with pytest.raises(PartsChanged):
        assemble(dst, NAME, ms, fsync=False)
    assert not (dst / NAME).exists()


def test_a_rewritten_manifest_is_read_again(tmp_path: Path) -> None:
    """The cache of manifests goes by the file itself: node 1's newer manifest (temp + rename:
    another inode) is read, never the one cached."""
    n = 2
    dst, g, first = every_part_read(tmp_path, n)
    shutil.rmtree(part_dir(dst, NAME, 1))
    (dst / ".supervise-parts" / NAME / "node-1.json").unlink()
    stage_parts(dst, range(1, 2), n)
    again = g.current_parts(NAME, waiting(dst)[NAME])
    assert again[1] is not first[1] and again[1]["written_at"] >= first[1]["written_at"]
    assert again[0] is first[0]  # node 0's, unchanged, from the cache
    anyio.run(g.assemble, NAME, again, False)
    assert (dst / NAME / "__1_0.distcp").read_bytes() == bytes([1]) * 4096
