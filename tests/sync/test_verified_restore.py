"""Issue 43, through the real ``supervise``: every version published on a directory pair has
a content manifest (size, mtime, sha256 of each file), and every restore takes the nearest
copy that verifies against it. A requeue onto the same node reads nothing back from
persistent storage; a flipped byte in the local copy is fetched again, and only that file;
a flipped byte on persistent storage is never loaded: the next newest version is restored.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.journal import events
from tests.support.supervise import run_supervise

TRAINER = Path(__file__).resolve().parents[1] / "helpers" / "trainer.py"
SIZE = 64 * 1024


def _train(tmp: Path, name: str, steps: int, backend: str = "auto") -> tuple[list[str], Path]:
    local, persist, run = tmp / "local", tmp / "persist", tmp / "run"  # one run: each call an attempt
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--restore",
                      "--sync-backend", backend,
                      "--gpu-every", "0", "--", sys.executable, str(TRAINER), str(local), "--steps", str(steps),
                      "--every", "2", "--size", str(SIZE), "--step-time", "0.01", "--check", timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split("\n"), run


def _flip(path: Path, at: int = 100) -> None:
    """One byte changed in place, the mtime kept: bit rot, not a newer save."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _verify(run: Path) -> dict:
    (ev,) = events(run, "restore-verify")[-1:]
    return ev


@pytest.mark.parametrize("backend", ["rsync", "python"])  # rsync: hashed after the copy; python: while it copies
def test_every_published_version_has_a_content_manifest_and_a_restore_verifies_it(tmp_path: Path, backend: str) -> None:
    out, run = _train(tmp_path, "run1", 6, backend)
    assert "checkpoint 6" in out
    persist = tmp_path / "persist"
    for step in (2, 4, 6):
        name = f"step_{step:06d}"
        doc = json.loads((persist / ".supervise" / "manifests" / f"{name}.json").read_text())
        assert doc["checkpoint"] == name and doc["is_dir"] is True
        on_disk = {str(p.relative_to(persist / name)): p for p in (persist / name).rglob("*") if p.is_file()}
        assert set(doc["files"]) == set(on_disk) == {".metadata", "shard_0.bin", "shard_1.bin"}
        for rel, f in doc["files"].items():
            assert f["sha256"] == hashlib.sha256(on_disk[rel].read_bytes()).hexdigest(), rel
            assert f["size"] == on_disk[rel].stat().st_size and f["mtime_ns"] == on_disk[rel].stat().st_mtime_ns

    # a requeue onto the same node, its local disk kept: every byte verified where it is, none moved
    out, run = _train(tmp_path, "run2", 6)
    assert "loaded 6 good" in out
    ev = _verify(run)
    assert ev["checkpoint"] == "step_000006" and ev["result"] == "verified"
    assert ev["from"] == {"live": 2 * SIZE + 1} and ev["moved"] == 0 and ev["failed"] == [] and not ev["replaced"]

    # one byte flipped in the local copy: detected, that file alone comes from persistent storage
    _flip(tmp_path / "local" / "step_000006" / "shard_1.bin")
    out, run = _train(tmp_path, "run3", 6)
    assert "loaded 6 good" in out
    ev = _verify(run)
    assert ev["result"] == "verified" and ev["replaced"]
    assert ev["from"] == {"live": SIZE + 1, "persistent": SIZE} and ev["moved"] <= 1.05 * SIZE
    assert [(f["file"], f["from"]) for f in ev["failed"]] == [("shard_1.bin", "live")]
    assert "sha256" in ev["failed"][0]["why"]


def test_a_flipped_byte_on_persistent_storage_is_never_loaded(tmp_path: Path) -> None:
    _train(tmp_path, "run1", 6)
    local, persist = tmp_path / "local", tmp_path / "persist"
    # the node is new (nothing local) and the newest version's persistent copy rotted
    shutil.rmtree(local)
    _flip(persist / "step_000006" / "shard_0.bin")
    out, run = _train(tmp_path, "run2", 4)
    verifies = events(run, "restore-verify")
    assert [(e["checkpoint"], e["result"]) for e in verifies] == [("step_000006", "failed"), ("step_000004", "verified")]
    assert verifies[0]["failed"][0]["file"] == "shard_0.bin" and verifies[0]["failed"][0]["from"] == "persistent"
    assert verifies[1]["from"] == {"persistent": 2 * SIZE + 1}
    restore = events(run, "restore")[-1]
    assert restore["checkpoint"] == "step_000004" and restore["unverified"] == ["step_000006"]
    assert "resumed 4" in out and "loaded 4 good" in out
    assert not (local / "step_000006").exists()
