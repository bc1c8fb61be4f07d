"""The copy hashes what it copies (issue 43): with ``hash=True`` the Python copier returns the
sha256 of every regular file it copied, taken over the bytes it wrote in the same read; a file
already whole at the destination is not read, so not hashed; rsync returns none (the caller
hashes the local files itself). Real ``_pycopy.py`` children."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from supervisor.sync._backend import CopyResult, choose_backend

MB = 1 << 20


def _tree(root: Path) -> dict[str, bytes]:
    """An empty file, a 3 MiB one (more than one read chunk, not a multiple of it), one in a
    subdirectory, and a symlink (not a regular file: never hashed)."""
    content = {
        "empty.bin": b"",
        "big.bin": os.urandom(3 * MB + 12345),
        "sub/rank0.pt": b"model state " * 1000,
        "meta.json": b'{"step": 100}',
    }
    for rel, data in content.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "latest").symlink_to("meta.json")
    return content


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _snapshot(root: Path, content: dict[str, bytes]) -> dict[str, tuple[int, int]]:
    return {rel: (len(data), (root / rel).stat().st_mtime_ns) for rel, data in content.items()}


@pytest.mark.asyncio
@pytest.mark.parametrize("fresh", [False, True], ids=["temp-names", "in-place"])
async def test_the_python_copy_gives_each_copied_files_sha256(tmp_path: Path, fresh: bool) -> None:
    src, dst = tmp_path / "ckpt", tmp_path / "staging"
    src.mkdir()
    content = _tree(src)
    got = await choose_backend("python", nice=0, ionice="none").copy_tree(src, dst, fresh=fresh, hash=True)
    assert got.hashes == {rel: _sha(data) for rel, data in content.items()}
    assert all((dst / rel).read_bytes() == data for rel, data in content.items())
    assert os.readlink(dst / "latest") == "meta.json" and got.files == 5


@pytest.mark.asyncio
async def test_a_file_already_whole_at_the_destination_is_not_hashed(tmp_path: Path) -> None:
    src, dst = tmp_path / "ckpt", tmp_path / "persistent"
    src.mkdir()
    content = _tree(src)
    dst.mkdir()
    shutil.copy2(src / "big.bin", dst / "big.bin")  # same size and mtime: the quick check skips it
    backend = choose_backend("python", nice=0, ionice="none")
    got = await backend.copy_tree(src, dst, hash=True)
    assert got.hashes == {rel: _sha(data) for rel, data in content.items() if rel != "big.bin"}
    listed = await backend.copy_tree(src, tmp_path / "second", files=_snapshot(src, content), hash=True)
    assert listed.hashes == {rel: _sha(data) for rel, data in content.items()}
    again = await backend.copy_tree(src, tmp_path / "second", files=_snapshot(src, content), hash=True)
    assert again.hashes == {} and again.files == 0


@pytest.mark.asyncio
async def test_copy_file_keys_its_hash_by_the_empty_path(tmp_path: Path) -> None:
    data = os.urandom(MB + 7)
    (tmp_path / "model.pt").write_bytes(data)
    backend = choose_backend("python", nice=0, ionice="none")
    got = await backend.copy_file(tmp_path / "model.pt", tmp_path / "out.pt", hash=True)
    assert got.hashes == {"": _sha(data)} and (tmp_path / "out.pt").read_bytes() == data
    assert (await backend.copy_file(tmp_path / "model.pt", tmp_path / "out.pt", hash=True)).hashes == {}


@pytest.mark.asyncio
async def test_two_streams_hashes_are_merged(tmp_path: Path) -> None:
    src, dst = tmp_path / "ckpt", tmp_path / "staging"
    src.mkdir()
    content = _tree(src)
    content.update({f"shard_{i}.bin": os.urandom(MB + i) for i in range(4)})
    for rel in [r for r in content if r.startswith("shard_")]:
        (src / rel).write_bytes(content[rel])
    backend = choose_backend("python", nice=0, ionice="none", streams=2)
    got = await backend.copy_tree(src, dst, fresh=True, files=_snapshot(src, content), skip=["meta.json"], hash=True)
    assert got.hashes == {rel: _sha(data) for rel, data in content.items() if rel != "meta.json"}
    assert got.files == len(content) - 1 and not (dst / "meta.json").exists()


def test_results_add_up_their_hashes() -> None:
    total = CopyResult()
    total += CopyResult(1, 3, hashes={"a": "1"})
    total += CopyResult(2, 5, vanished=True, hashes={"b/c": "2"})
    assert total == CopyResult(3, 8, True, {"a": "1", "b/c": "2"})


@pytest.mark.asyncio
async def test_rsync_accepts_hash_and_returns_none(tmp_path: Path) -> None:
    if shutil.which("rsync") is None:
        pytest.skip("rsync is not on PATH")
    src = tmp_path / "ckpt"
    src.mkdir()
    content = _tree(src)
    backend = choose_backend("rsync", nice=0, ionice="none", streams=2)
    got = await backend.copy_tree(src, tmp_path / "a", hash=True)
    assert got.hashes == {} and (tmp_path / "a" / "big.bin").read_bytes() == content["big.bin"]
    listed = await backend.copy_tree(src, tmp_path / "b", files=_snapshot(src, content), hash=True)
    assert listed.hashes == {} and listed.files == 4
    assert (await backend.copy_file(src / "big.bin", tmp_path / "c.bin", hash=True)).hashes == {}


@pytest.mark.asyncio
async def test_without_hash_the_python_copy_returns_none(tmp_path: Path) -> None:
    src = tmp_path / "ckpt"
    src.mkdir()
    content = _tree(src)
    backend = choose_backend("python", nice=0, ionice="none", streams=2)
    got = await backend.copy_tree(src, tmp_path / "a")
    assert got.hashes == {} and got.files == 5
    assert (await backend.copy_tree(src, tmp_path / "b", files=_snapshot(src, content))).hashes == {}
    assert (await backend.copy_file(src / "big.bin", tmp_path / "c.bin")).hashes == {}
    assert (tmp_path / "c.bin").read_bytes() == content["big.bin"]
