"""Node K's agent in-process: the same ``make_plan`` as the leader's, from the same Config,
with ``node_rank=K``; ``Agent(plan, NodeRole(plan)).run()`` against a leader whose journal a test writes
(no leader process, no scheduler). The plan's errors come before anything is made; the agent
answers the leader's last flush, ends with the leader's ``end`` and says so in its journal."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import anyio
import pytest

from supervisor import cli, sync
from supervisor.conduct.fleet import agent_argv
from supervisor.conduct.agent import Agent
from supervisor.conduct.node import NodeRole
from supervisor.sched import node_rank
from supervisor.config import agent_view, build_config, pair_view
from supervisor.errors import ConfigError
from supervisor.journal import Journal, node_dir, read_journal
from supervisor.plan import describe, make_plan, per_node_pairs
from tests.support.wait import wait_for_async


def _cfg(tmp_path: Path, nodes: str | None = "2", logs: bool = True):
    pairs = [("checkpoint", str(tmp_path / "l"), str(tmp_path / "p"))]
    if logs:
        pairs.append(("log", str(tmp_path / "tb"), str(tmp_path / "p-tb")))
    return build_config(flags={"gpu_every": "0", "sync_backend": "python", "run_dir": str(tmp_path / "run")},
                        flag_pairs=pairs, flag_nodes=nodes, env={}, cwd=tmp_path, require_command=False,
                        create_run_dir=False)


def _counting_mirrors(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    built: list[int] = []
    real = sync.Mirror.__init__

    def init(self, *a, **k) -> None:  # noqa: ANN001, ANN002, ANN003
        built.append(k.get("node_rank", 0))
        real(self, *a, **k)

    monkeypatch.setattr(sync.Mirror, "__init__", init)
    return built


def test_node_k_plan_is_the_leaders_plan_of_its_per_node_pairs(tmp_path: Path, monkeypatch) -> None:
    cfg = _cfg(tmp_path)
    built = _counting_mirrors(monkeypatch)
    (tmp_path / "run").mkdir()
    with Journal(tmp_path / "run", 1) as leader:  # two attempts of the leader: node 1 was hostB before this one
        leader.emit("start", nodes=["hostA", "hostB"])
    with Journal(tmp_path / "run", 2) as leader:
        leader.emit("start", nodes=["hostC", "hostA"])
    plan = make_plan(cfg, {"SLURM_RESTART_COUNT": "1"}, node_rank=1)
    assert built == [1], "the node's mirror is built once, for node 1"
    assert plan.node_rank == 1 and plan.mirror is not None
    assert [p.kind for p in plan.cfg.sync] == ["checkpoint"] and plan.mirror.pairs == plan.cfg.sync
    assert plan.nodes == 2
    assert plan.journal_dir == node_dir(tmp_path / "run", 1) and plan.run_dir == tmp_path / "run"
    assert plan.attempt == 2  # SLURM_RESTART_COUNT, as the leader's; node 1's own journal has none yet
    assert plan.previous_start is not None and plan.previous_start["nodes"] == ["hostA", "hostB"]
    lines = describe(plan)
    assert lines[0][:2] == ("ok", "node 1") and f"journal {plan.journal_dir}, attempt 2" in lines[0][2]
    assert all(topic == "node 1" for _, topic, _ in lines)
    # the leader's plan of the same Config: every pair, and its previous start is its own last one
    leader_plan = make_plan(cfg, {}, node_rank=0)
    assert built == [1, 0] and leader_plan.node_rank == 0 and len(leader_plan.cfg.sync) == 2
    assert leader_plan.previous_start is not None and leader_plan.previous_start["nodes"] == ["hostC", "hostA"]


def test_a_node_plan_refuses_before_anything_is_made(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no per-node checkpoint pair"):
        make_plan(_cfg(tmp_path, nodes=None), {}, node_rank=1)
    with pytest.raises(ConfigError, match=r"node_rank = 2: expected 1 to 1"):
        make_plan(_cfg(tmp_path), {}, node_rank=2)
    assert not (tmp_path / "run").exists()


def test_a_request_said_on_the_line_is_answered_on_it_and_once(tmp_path: Path, monkeypatch) -> None:
    """Issue 46, item 4: the journals are the record, not a mailbox. A request the leader says on
    the line is answered though the leader's journal does not hold it (nobody looked for it
    there), the answer comes back on the line, journaled too; the same request found in the
    journal afterwards is not answered again."""
    from supervisor.conduct import wire
    from supervisor.conduct.link import LeaderLine

    _counting_mirrors(monkeypatch)
    monkeypatch.delenv("SUPERVISE_NODE_SAY", raising=False)
    plan = make_plan(_cfg(tmp_path, logs=False), {}, node_rank=1, parts_poll=0.05)
    (tmp_path / "run").mkdir()
    leader = Journal(tmp_path / "run", 1)
    leader.emit("start", nodes=["hostA", "hostB"])
    node = node_dir(tmp_path / "run", 1)
    heard: list[str] = []

    def answers() -> list[dict]:
        return [e for e in read_journal(node).events if e["kind"] == wire.NODE_FLUSH and e.get("request")]

    async def main() -> int:
        line = LeaderLine(tmp_path / "run", 2, heard=lambda k, word: heard.append(word), linked=lambda on: None)
        async with anyio.create_task_group() as tg:
            await tg.start(line.run)
            status: list[int] = []

            async def agent() -> None:
                status.append(await Agent(plan, NodeRole(plan)).run())

            tg.start_soon(agent)
            await wait_for_async(lambda: line.whole, what="node 1 on the line")
            asked = wire.message(wire.NODES_FLUSH, "9.1", {"reason": "final", "exited": True})
            assert asked is not None and line.tell([1], asked) == [1]
            await wait_for_async(lambda: any(w.startswith(wire.NODE_FLUSH) for w in heard), what="the answer on the line")
            said = wire.read_message(next(w for w in heard if w.startswith(wire.NODE_FLUSH)), wire.REPLIES)
            assert said is not None and said["request"] == "9.1" and said["not_durable"] == [], said
            assert [a["request"] for a in answers()] == ["9.1"], "journaled too: the record"
            leader.emit(wire.NODES_FLUSH, request="9.1", reason="final", exited=True, nodes=[1], durable=True)
            leader.emit("end", reason="finished")
            line.ring(wire.JOURNAL)
            await wait_for_async(lambda: status, what="the agent's end")
            tg.cancel_scope.cancel()
        return status[0]

    assert anyio.run(main) == 0
    leader.close()
    assert [a["request"] for a in answers()] == ["9.1"], "found again in the journal: answered once"


def test_the_node_agent_answers_the_leader_and_ends_with_its_end(tmp_path: Path, monkeypatch, capsys) -> None:
    built = _counting_mirrors(monkeypatch)
    monkeypatch.delenv("SUPERVISE_NODE_SAY", raising=False)
    plan = make_plan(_cfg(tmp_path, logs=False), {}, node_rank=1, parts_poll=0.05)
    (tmp_path / "run").mkdir()  # the run directory is the leader's: made by it, not by the plan
    leader = Journal(tmp_path / "run", 1)
    leader.emit("start", nodes=["hostA", "hostB"])
    node = node_dir(tmp_path / "run", 1)

    def kinds() -> list[str]:
        return [e["kind"] for e in read_journal(node).events]

    async def main() -> int:
        async with anyio.create_task_group() as tg:
            status: list[int] = []

            async def agent() -> None:
                status.append(await Agent(plan, NodeRole(plan)).run())

            tg.start_soon(agent)
            await wait_for_async(lambda: "node-start" in kinds(), what="node-start")
            leader.emit("nodes-flush", request="1.1", reason="final", exited=True, nodes=[1], durable=True)
            await wait_for_async(lambda: "node-flush" in kinds(), what="the answer to nodes-flush")
            leader.emit("end", reason="finished")
            await wait_for_async(lambda: status, what="the agent's end")
        return status[0]

    assert anyio.run(main) == 0
    leader.close()
    every = read_journal(node).events
    assert {e["attempt"] for e in every} == {1} and "error" not in {e["kind"] for e in every}
    events = [e for e in every if e["kind"].startswith("node-") or e["kind"] == "end"]  # the mirror's own between them
    assert [e["kind"] for e in events] == ["node-start", "node-flush", "node-flush", "end"], events
    start, answer, last, end = events
    assert (start["node"], start["nodes"], start["backend"], start["writers"]) == (1, 2, "python", None)
    assert [p["nodes"] for p in start["pairs"]] == [2] and start["settings"]["sync_backend"] == "python"
    assert answer["request"] == "1.1" and answer["ok"] is True and answer["not_durable"] == []
    assert "request" not in last and last["ok"] is True
    assert (end["node"], end["reason"], end["detail"], end["not_durable"]) == (1, "leader-ended", "leader attempt 1: finished", [])
    states = [(e["from"], e["to"]) for e in every if e["kind"] == "state"]
    assert states == [("starting", "restoring"), ("restoring", "running"), ("running", "stopping"),
                      ("stopping", "stopped")], "the leader's named states, in the node's journal"
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("supervise-node-agent")]
    assert len(said) == 1 and said[0].startswith("supervise-node-agent ready 1 "), said
    assert json.loads(said[0].split(maxsplit=4)[4]) == {}  # no restore asked: this node holds nothing
    assert built == [1], "one Mirror on node 1, from the plan to the end"


def test_one_configuration_makes_both_roles_plans_through_the_real_command_lines(tmp_path: Path) -> None:
    """The leader's Config → the agents' argv (``fleet.agent_argv``, srun's; PBS's adds
    ``--node-rank``) → the real ``supervise node-agent`` parser → node K's plan: the same pairs
    (node K's share of them) and the same settings as the leader's plan (issue 29's D3)."""
    _, ns, command = cli.parse(["--run-dir", str(tmp_path / "run"), "--checkpoints", str(tmp_path / "l"),
                                str(tmp_path / "p"), "--nodes", "3", "--settle", "17s", "--profile", "torch-save",
                                "--restore", "--marker", "done", "--logs", str(tmp_path / "tb"), str(tmp_path / "ptb"),
                                "--sync-backend", "python", "--sync-every", "7m", "--gpu-every", "0", "-v",
                                "--", "srun", "python", "train.py"])
    leader = make_plan(cli.config_from(ns, command, for_check=True), {})
    argv = agent_argv(leader.cfg)
    assert argv[1:4] == ["-m", "supervisor", "node-agent"]
    for words, env in ((argv[3:], {"SLURM_NODEID": "2"}), (["node-agent", "--node-rank", "2", *argv[4:]], {})):
        sub, ns, command = cli.parse(words)
        assert (sub, command) == ("node-agent", [])
        rank = node_rank(getattr(ns, "node_rank", None), env)
        plan = make_plan(cli.node_agent_config(ns), env, node_rank=rank)
        assert rank == 2 and plan.node_rank == 2 and plan.run_dir == leader.run_dir
        assert plan.cfg.sync == per_node_pairs(leader.cfg.sync) and len(leader.cfg.sync) == 2
        assert agent_view(plan.cfg) == {**agent_view(leader.cfg), "sync": [pair_view(p) for p in plan.cfg.sync]}
        assert plan.cfg.verbosity == leader.cfg.verbosity == 1


class _Writes(io.RawIOBase):
    """A raw stream that keeps each ``write`` call: what one system call would carry."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.calls.append(bytes(b))
        return len(b)


def test_an_agents_line_is_one_write_under_pythonunbuffered(monkeypatch) -> None:
    """Every node's agent shares srun's stdout. Under ``PYTHONUNBUFFERED`` (``-u``, which CI and
    many job scripts set) ``print`` writes the text and the newline in two calls, so node 1's
    line landed between node 2's text and its newline: ``… restored 2 …}supervise-node-agent
    restored 1 …``; the leader read neither, and waited 60 s for a ``ready`` that had come."""
    from supervisor.conduct import choice, wire
    raw = _Writes()
    out = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)  # what -u makes of stdout: no buffer
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.delenv(choice.SAY_VAR, raising=False)
    choice.say("restored", 2, '{"round":1,"holds":{"ckpt":null}}')
    choice.say("ready", 2, '{"ckpt":null}')
    out.flush()
    assert [c.decode().split()[:3] for c in raw.calls] == [[wire.READY_LINE, "restored", "2"],
                                                           [wire.READY_LINE, "ready", "2"]], raw.calls
    assert all(c.endswith(b"\n") and c.count(b"\n") == 1 for c in raw.calls), raw.calls
