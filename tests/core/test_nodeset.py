"""The attempt's nodes and the launcher's node list (issue 41), as tables: pure functions."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor import nodeset

P = pytest.param
ALLOC = ("n1", "n2", "n3", "n4")

ATTEMPT_NODES = [
    P(1, (), "n1", ("n1", "n2", "n3"), id="one spare: the last node kept aside"),
    P(2, ("n2",), "n1", ("n1", "n3"), id="n2 dead: the first spare takes its place"),
    P(2, ("n2", "n3"), "n1", ("n1", "n4"), id="two dead: the second spare"),
    P(2, ("n2", "n3", "n4"), "n1", None, id="no spare left: too few nodes"),
    P(1, (), "n3", ("n3", "n1", "n2"), id="the leader's node first, wherever the allocation has it"),
    P(4, (), "n1", None, id="every node a spare: none to train on"),
]


@pytest.mark.parametrize(("spares", "lost", "leader", "expected"), ATTEMPT_NODES)
def test_attempt_nodes(spares: int, lost: tuple[str, ...], leader: str, expected: tuple[str, ...] | None) -> None:
    assert nodeset.attempt_nodes(ALLOC, spares=spares, lost=lost, leader=leader) == expected


ON_NODES = [
    P(["srun", "--ntasks-per-node=1", "torchrun", "t.py"], ("n1", "n3"),
      ("srun", "--nodes=2", "--nodelist=n1,n3", "--overlap", "--ntasks-per-node=1", "torchrun", "t.py"),
      id="srun told its nodes, before the user's own options"),
    P(["env", "A=1", "srun", "python", "t.py"], ("n1", "n3"),
      ("env", "A=1", "srun", "--nodes=2", "--nodelist=n1,n3", "--overlap", "python", "t.py"), id="past env and its assignments"),
    P(["srun", "python", "t.py"], ALLOC, ("srun", "python", "t.py"), id="the whole allocation: unchanged"),
    P(["mpirun", "--hostfile", "/aux/7.head", "-np", "2", "python", "t.py"], ("n1", "n3"),
      ("mpirun", "--hostfile", "/run/nf", "-np", "2", "python", "t.py"), id="PBS: the nodefile becomes the attempt's"),
    P(["mpirun", "--hostfile=/aux/7.head", "python", "t.py"], ("n1", "n3"),
      ("mpirun", "--hostfile=/run/nf", "python", "t.py"), id="--hostfile=PATH too"),
    P(["mpirun", "-H", "n1,n2", "python", "t.py"], ("n1", "n3"), ("mpirun", "-H", "n1,n2", "python", "t.py"),
      id="a host list spelled out: left as it is"),
    P(["python", "srun.py"], ("n1", "n3"), ("python", "srun.py"), id="no launcher named srun"),
]


@pytest.mark.parametrize(("argv", "nodes", "expected"), ON_NODES)
def test_on_nodes(argv: list[str], nodes: tuple[str, ...], expected: tuple[str, ...]) -> None:
    assert nodeset.on_nodes(argv, nodes, ALLOC, nodefile=("/aux/7.head", "/run/nf")) == expected


def test_the_attempts_nodefile_keeps_its_nodes_slots_leader_first(tmp_path: Path) -> None:
    job = tmp_path / "nodefile"
    job.write_text("n1.cluster\nn1.cluster\nn2.cluster\nn2.cluster\nn3.cluster\nn3.cluster\n")
    ours = tmp_path / "run" / "nodes" / "nodefile-n1-n3"
    nodeset.write_nodefile(str(job), str(ours), ("n1", "n3"))
    assert ours.read_text().split() == ["n1.cluster", "n1.cluster", "n3.cluster", "n3.cluster"]
    assert nodeset.nodefile_path(tmp_path / "run", ("n1", "n3")) == ours
