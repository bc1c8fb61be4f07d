"""Lightning's ``last.ckpt`` under a per-node pair, through three attempts on new nodes (issue 29, D4/D5).

``ModelCheckpoint(save_last=True)`` rewrites ``last.ckpt`` in place every epoch and
``ckpt_path="last"`` resumes from it. Each attempt is the leader alone (``--nodes 2``: outside
Slurm it starts no agents; a single file is whole on the node that wrote it) on an empty
local disk, ``TMPDIR`` on another filesystem than the checkpoints (as node-local scratch
and /tmp usually are: fsspec then copies into the final name). Before: ``last.ckpt`` was
published once (D1); the restore made it a link that the next ``save_last`` wrote through
into the restored epoch file (D4); a persistent link was not restored and training restarted
at epoch 0 (D5). Now every attempt starts where the one before stopped, every version of
``last.ckpt`` is published, and no epoch file holds another epoch.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.journal import events
from tests.support.supervise import run_supervise

TRAIN = Path(__file__).parent / "lightning_last.py"


def test_lightning_resumes_where_it_stopped_on_a_new_node_each_attempt(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    torch = pytest.importorskip("torch")
    local, persist, run = tmp_path / "local", tmp_path / "persist", tmp_path / "run"
    other_fs = Path(tempfile.mkdtemp(dir="/dev/shm")) if os.path.isdir("/dev/shm") else tmp_path / "tmp"
    try:
        starts = []
        for attempt, epochs in ((1, 3), (2, 5), (3, 7)):
            shutil.rmtree(local, ignore_errors=True)  # a new node: its local disk is empty
            r = run_supervise("-q", "--run-dir", str(run), "--checkpoints", str(local), str(persist), "--nodes", "2",
                              "--restore", "--settle", "1s", "--gpu-every", "0", "--",
                              sys.executable, str(TRAIN), str(local), str(epochs),
                              env={**os.environ, "TMPDIR": str(other_fs), "OMP_NUM_THREADS": "1"}, timeout=240)
            assert r.returncode == 0, r.stderr[-3000:]
            m = re.search(r"starts at epoch (\d+) from (\S+)", r.stdout)
            assert m, r.stdout
            starts.append((int(m.group(1)), m.group(2)))
            assert not os.path.islink(local / "last.ckpt")
            # no epoch file holds another epoch (a save through a link would)
            for f in local.glob("epoch=*.ckpt"):
                saved = torch.load(f, map_location="cpu", weights_only=False)["epoch"]
                assert f.name.startswith(f"epoch={saved}-"), (attempt, f.name, saved)
            assert torch.load(persist / "last.ckpt", map_location="cpu", weights_only=False)["epoch"] == epochs - 1
        assert starts == [(0, "None"), (3, "last.ckpt"), (5, "last.ckpt")], starts
        ev = events(run / "events.jsonl")
        lasts = [e["attempt"] for e in ev if e.get("kind") == "publish" and e.get("checkpoint") == "last.ckpt"]
        assert [lasts.count(a) for a in (1, 2, 3)] == [3, 2, 2], lasts  # every version, every attempt
        assert not [e for e in ev if e.get("kind") == "sync-deferred"]
    finally:
        shutil.rmtree(other_fs, ignore_errors=True)
