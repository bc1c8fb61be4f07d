"""Which of the job's nodes the scheduler calls gone, asked once for all of them (issue 44).

Asking ``scontrol`` once per node took 1,023 processes, one after another, and as many
requests on the controller at 1,024 nodes (bench/scale_sim.py: 3.6–4.8 s to see a node's death
with a stub answering in 2–3 ms; a real controller answers slower). ``scontrol -o show node
n1,n2,…`` answers for every node in one request: the text here is what Slurm 22.05.8 printed
on the test cluster for ``n1,n2,n3`` (two of them not responding), and an unknown name is one
line on stderr ("Node nosuch not found"), the others still answered.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from supervisor.sched._slurm_output import task_ended
from supervisor.sched.slurm import Slurm

GOLDEN = Path(__file__).with_name("scontrol_show_node_o.txt")


def stub(tmp_path: Path) -> Path:
    """A ``scontrol`` that prints the golden text and notes each call's arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncat {GOLDEN}\necho "Node nosuch not found" >&2\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_every_node_is_asked_in_one_call(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", f"{stub(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    states = Slurm().node_states(["n1", "n2", "n3", "nosuch"])
    assert (tmp_path / "calls").read_text().splitlines() == ["-o show node n1,n2,n3,nosuch"]
    assert states["n1"] == ("DOWN+NOT_RESPONDING", "Not responding")
    assert states["n2"][0] == "IDLE" and states["n2"][1] == ""
    assert states["n3"][0].startswith("DOWN") and "nosuch" not in states
    assert Slurm().node_state("n2") == states["n2"]


def test_no_nodes_asks_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", f"{stub(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    assert Slurm().node_states([]) == {}
    assert not (tmp_path / "calls").exists()


SRUN_ERRORS = Path(__file__).with_name("srun_task_ended.txt")


def test_srun_saying_a_task_ended_names_its_node() -> None:
    """What srun (Slurm 22.05.8, ``--kill-on-bad-exit=0``) printed on the test cluster's stderr
    when the task on n2 was killed and the one on n3 exited 3, the others going on: each line
    names the node whose agent can no longer answer (``SrunAgents.down``); srun's other lines
    name none."""
    nodes = ["n1", "n2", "n3"]
    said = [task_ended(line, nodes) for line in SRUN_ERRORS.read_text().splitlines()]
    assert said == [(1, "srun: n2: task 1: Killed"), (2, "srun: n3: task 2: Exited with exit code 3"), None], said
    assert task_ended("srun: error: n9: task 1: Killed", nodes) is None  # no node of this attempt
    assert task_ended("srun: error: n2: tasks 1-2: Killed", nodes) == (1, "srun: n2: task 1: Killed")
