"""The leader's choice across the nodes' copies (``sync/_peers.py``), as tables: what is whole
across the offers, and when it beats the newest published version (issue 43)."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.sync._complete import Entry, Snap
from supervisor.sync._peers import across, choose_across, newer_than


def doc(name: str, files: dict[str, tuple[int, int, str]], *, is_dir: bool = True, step: int | None = None) -> dict[str, Any]:
    """An offered version: rel → (size, mtime_ns, sha256)."""
    fs = {rel: {"size": s, "mtime_ns": m, "sha256": h} for rel, (s, m, h) in files.items()}
    return {"v": 1, "checkpoint": name, "is_dir": is_dir, "files": fs, "bytes": sum(s for s, _, _ in files.values()),
            "why": "test", "done_at": None, "step": step, "restorable": True, "markers": [],
            "newest_ns": max(m for _, m, _ in files.values()), "profile": None, "nodes": 1, "published_at": 0}


def snapshot_pt(mtime: int, sha: str) -> dict[str, Any]:
    return doc("snapshot.pt", {"": (10, mtime, sha)}, is_dir=False)


def published(name: str, files: dict[str, tuple[int, int]], step: int | None = None) -> Entry:
    snap = Snap(files, max(m for _, m in files.values()), sum(s for s, _ in files.values()))
    return Entry(name=name, is_dir="" not in files, snap=snap, complete=True, why="test", step=step)


def test_a_single_file_is_whole_on_any_node_and_the_newest_copy_wins() -> None:
    got = across({0: {"snapshot.pt": snapshot_pt(200, "b")}, 1: {"snapshot.pt": snapshot_pt(100, "a")}}, 2)
    assert got["snapshot.pt"]["files"][""]["sha256"] == "b" and got["snapshot.pt"]["holders"] == {"0": [""]}


@pytest.mark.parametrize(("offers", "whole"), [
    pytest.param({0: {"s": doc("s", {"a": (1, 1, "x")})}, 1: {"s": doc("s", {"b": (1, 1, "y")})}}, True,
                 id="every node's part: whole"),
    pytest.param({0: {"s": doc("s", {"a": (1, 1, "x")})}}, False, id="a node's part missing: not whole"),
    pytest.param({0: {"s": doc("s", {"a": (1, 1, "x")})}, 1: {"s": doc("s", {"a": (1, 1, "z")})}}, False,
                 id="one path, two contents: not whole"),
    pytest.param({0: {"s": doc("s", {"a": (1, 1, "x")})}, 1: {"s": doc("s", {"a": (1, 1, "x"), "b": (1, 1, "y")})}},
                 True, id="a path several nodes hold alike: whole"),
])
def test_a_directory_is_whole_only_with_every_nodes_part(offers: dict, whole: bool) -> None:
    got = across(offers, 2)
    assert ("s" in got) == whole, got
    if whole:
        assert set(got["s"]["files"]) == {rel for d in offers.values() for rel in d["s"]["files"]}


def test_newer_than_the_published() -> None:
    old = published("snapshot.pt", {"": (10, 100)})
    assert newer_than(snapshot_pt(200, "b"), old)          # the same name saved again after it
    assert not newer_than(snapshot_pt(100, "a"), old)      # that very version
    assert newer_than(doc("step_5", {"a": (1, 1, "x")}, step=5), published("step_4", {"a": (1, 9)}, step=4))
    assert not newer_than(doc("step_3", {"a": (1, 99, "x")}, step=3), published("step_4", {"a": (1, 9)}, step=4))
    assert newer_than(snapshot_pt(1, "a"), None)            # nothing published
    # Lightning: last.ckpt has no step and is written after the newest step=N file
    last = published("last.ckpt", {"": (10, 300)})
    assert not newer_than(doc("epoch=1-step=18.ckpt", {"": (10, 200, "x")}, is_dir=False, step=18), last)
    assert newer_than(doc("epoch=2-step=22.ckpt", {"": (10, 400, "y")}, is_dir=False, step=22), last)


def test_the_choice_names_its_source_and_holders() -> None:
    pub = published("snapshot.pt", {"": (10, 100)})
    # node 0 saved again while the persistent side was down: the nodes' copy
    value, said = choose_across({0: {"snapshot.pt": snapshot_pt(200, "b")}, 1: {}}, 2, "snapshot.pt", pub)
    assert value is not None and value["source"] == "nodes" and said["holders"] == ["0"]
    # every node holds the published version: persistent, with the holders named by size and mtime
    value, said = choose_across({0: {"snapshot.pt": snapshot_pt(100, "a")}, 1: {"snapshot.pt": snapshot_pt(100, "a")}},
                                2, "snapshot.pt", pub)
    assert value == {"checkpoint": "snapshot.pt", "source": "persistent", "holders": {"0": [""], "1": [""]}}
    # an older version of the name is held by nobody as published
    value, _ = choose_across({0: {"snapshot.pt": snapshot_pt(50, "old")}}, 2, "snapshot.pt", pub)
    assert value is not None and value["source"] == "persistent" and value["holders"] == {}
    # nothing anywhere; and a silent persistent side is said so
    value, said = choose_across({0: {}, 1: {}}, 2, None, None, silent=True)
    assert value is None and said["silent"]
