"""A failed upload or download is one ``StoreError`` (an ``OSError`` the pair engine journals
and retries), never an exception group that would end the pass loop: the first failure of the
concurrent transfers cancels the rest and is raised as itself. No server needed: nothing
listens on the endpoint."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from supervisor.config import StoreSpec
from supervisor.sync._complete import Entry, snapshot

pytest.importorskip("obstore", reason="no obstore (pip install 'supervise-hpc[s3]')")


def test_an_upload_to_a_dead_endpoint_raises_one_store_error(tmp_path: Path) -> None:
    from supervisor.sync._store import Store, StoreError
    from supervisor.sync._storepub import upload

    ckpt = tmp_path / "step_1"
    ckpt.mkdir()
    for i in range(5):
        (ckpt / f"small_{i}").write_bytes(b"x" * 1000)
    (ckpt / "mid").write_bytes(b"m" * (2 << 20))
    (ckpt / "big").write_bytes(b"b" * (9 << 20))
    snap = snapshot(ckpt)
    assert snap is not None
    e = Entry(name="step_1", is_dir=True, snap=snap, complete=True, why="test")
    store = Store(StoreSpec.parse("s3://some-bucket/p"), {"AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                                                          "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}, retries=0)

    async def main() -> None:
        with pytest.raises(StoreError) as err:
            await upload(store, ckpt, e, "step_1", None)
        assert err.value.code == "ECONNREFUSED" and "cannot reach the endpoint" in str(err.value)
        with pytest.raises(StoreError):
            await store.download("p/step_1/big", tmp_path / "got", None, None)

    anyio.run(main)
    assert not (tmp_path / "got").exists() or (tmp_path / "got").stat().st_size == 0
