"""Flags and config are one configuration: whatever the leader accepts reaches its node agents
whole (issue 29, defect D3). No cluster: the argv the leader would hand srun, run here.

Before, a leader configured by flags started its agents with ``--settle/--profile/--restore/
--marker``, which the node agent's parser lacked (every agent exited 2, so under Slurm no node
K restored or mirrored anything); a config file's per-pair values and the file-or-environment
settings (``sync_nice``, ``sync_streams``…) never reached them at all.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import pytest

from supervisor import cli
from supervisor.config import AGENT_GROUPS, KEYS, Config, SyncPair, agent_view, from_leader
from supervisor.conduct.fleet import agent_argv
from supervisor.errors import UsageError
from supervisor.journal import read_journal
from tests.support.supervise import start_supervise

# Every option of the leader's mirroring and sampling groups, with a value that is not its
from tests.support.wait import wait_for
# default. A new option there fails test_every_sync_option_of_the_leader_reaches_the_agent
# until it is added here, and then it must reach the agent.
OPTIONS: dict[str, list[str]] = {
    "--checkpoints": ["--checkpoints", "{d}/local", "{d}/persist", "--checkpoints", "{d}/local2", "{d}/persist2"],
    "--logs": ["--logs", "{d}/tb", "{d}/persist-tb"],
    "--restore": ["--restore"],
    "--profile": ["--profile", "dcp"],
    "--marker": ["--marker", "done.node*", "--marker", "COMMIT"],
    "--settle": ["--settle", "42s"],
    "--nodes": ["--nodes", "3"],
    "--sync-every": ["--sync-every", "7m"],
    "--sync-backend": ["--sync-backend", "python"],
    "--sync-streams": ["--sync-streams", "5"],
    "--gpu-every": ["--gpu-every", "3s"],
    "--gpu-backend": ["--gpu-backend", "none"],
}


def _group_flags(p: argparse.ArgumentParser, titles: tuple[str, ...]) -> set[str]:
    return {s for g in p._action_groups if g.title in titles for a in g._group_actions  # noqa: SLF001
            for s in a.option_strings if s.startswith("--")}


def _agent_config(argv: list[str]) -> Config:
    """What a node agent started with ``argv`` (``python -m supervisor node-agent …``) runs by."""
    sub, ns, command = cli.parse(argv[3:])
    assert sub == "node-agent" and not command
    return cli.node_agent_config(ns)


def _same_for_the_agent(leader: Config, agent: Config) -> None:
    assert agent.sync == leader.sync  # every field of every pair (SyncPair's equality)
    assert [p.name for p in agent.sync] == [p.name for p in leader.sync]
    for key in KEYS:
        if key.group in AGENT_GROUPS:
            assert getattr(agent, key.name) == getattr(leader, key.name), key.name
    assert agent.run_dir == leader.run_dir


def test_every_sync_option_of_the_leader_reaches_the_agent(tmp_path: Path) -> None:
    leader_flags = _group_flags(cli._parser("run"), AGENT_GROUPS)
    assert leader_flags == set(OPTIONS), "an option was added to or removed from the leader's mirroring or " \
                                         "sampling options: give it a value in OPTIONS (it must reach the agents)"
    given = [w.format(d=tmp_path) for words in OPTIONS.values() for w in words]
    _, ns, command = cli.parse(["--run-dir", str(tmp_path / "run"), *given, "--", "python", "train.py"])
    leader = cli.config_from(ns, command, for_check=True)
    for key in KEYS:  # the values given are not the defaults: equality below is the transport's
        if key.group in AGENT_GROUPS and key.name not in cli.SPECIAL:
            assert getattr(leader, key.name) != key.default, key.name
    first = leader.sync[0]
    assert (first.restore, first.profile, first.markers, first.settle, first.nodes) == (
        True, "dcp", ("done.node*", "COMMIT"), 42.0, 3)

    _same_for_the_agent(leader, _agent_config(agent_argv(leader)))

    # A job script that starts the agent itself gives it the leader's very options: one definition.
    assert _group_flags(cli._node_agent_parser(), AGENT_GROUPS) == leader_flags
    _, ns, _ = cli.parse(["node-agent", "--run-dir", str(tmp_path / "run"), *given])
    _same_for_the_agent(leader, cli.node_agent_config(ns))


def test_pairs_that_differ_and_settings_from_file_or_environment_reach_the_agent(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A config file named by ``SUPERVISE_CONFIG`` (no --config), pairs whose every field
    differs, keys only a file or the environment sets, and flags over both."""
    values = {  # a value other than the default for every field of a pair: a new field must travel too
        "name": "a", "kind": "checkpoint", "src": tmp_path / "l", "dst": tmp_path / "p", "markers": ("done",),
        "every": 30.0, "restore": True, "exclude": ("*.tmp",), "keep_local": 2, "settle": 12.0, "fsync": True,
        "nodes": 0, "profile": "deepspeed", "peer_copies": 0}
    # ``store`` (an s3:// persistent side, not a directory): pair "c" below carries every key of one
    assert set(values) == {f.name for f in dataclasses.fields(SyncPair)} - {"origin", "store"}, "give the new field a value"
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'sync_streams = 3\nsync_ionice = "best-effort"\ngpu_every = "4s"\n'
                   f'[[sync]]\nname = "a"\nfrom = "{tmp_path}/l"\nto = "{tmp_path}/p"\nmarkers = ["done"]\n'
                   f'every = "30s"\nrestore = true\nexclude = ["*.tmp"]\nkeep_local = 2\nsettle = "12s"\n'
                   f'fsync = true\nnodes = "auto"\nprofile = "deepspeed"\npeer_copies = 0\n'
                   f'[[sync]]\nname = "b"\nfrom = "{tmp_path}/l2"\nto = "{tmp_path}/p2"\nnodes = 4\n'
                   f'[[sync]]\nkind = "log"\nfrom = "{tmp_path}/tb"\nto = "{tmp_path}/ptb"\n'
                   f'[[sync]]\nname = "c"\nfrom = "{tmp_path}/l3"\nto = "s3://bkt/run/c"\nnodes = 2\n'
                   f'endpoint = "http://s3.site:9000"\nregion = "eu-1"\naws_profile = "proj"\naccess_key_id = "AKID"\n'
                   f'secret_access_key = "never-on-a-command-line"\n')
    for k in [k for k in os.environ if k.startswith(("SUPERVISE_", "SLURM_", "PBS_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("SUPERVISE_CONFIG", str(cfg))
    monkeypatch.setenv("SUPERVISE_SYNC_NICE", "7")      # environment only (no flag)
    monkeypatch.setenv("SUPERVISE_DMON_LOG", "true")
    monkeypatch.setenv("SUPERVISE_SYNC_STREAMS", "9")   # over the file's 3; the flag below over both
    _, ns, command = cli.parse(["--run-dir", str(tmp_path / "run"), "--sync-streams", "6", "-v", "--", "x"])
    leader = cli.config_from(ns, command, for_check=True)
    assert leader.sync[0] == SyncPair(**values)
    assert (leader.sync_nice, leader.dmon_log, leader.sync_streams, leader.sync_ionice) == (7, True, 6, "best-effort")

    argv = agent_argv(leader)
    from supervisor.sync._store import share_access

    share_access(tmp_path / "run", leader.sync)  # the leader, before its agents: how it reaches each store
    # srun hands the agent the leader's environment: its SUPERVISE_* must not undo the leader's flags
    agent = _agent_config(argv)
    _same_for_the_agent(leader, agent)
    assert agent.verbosity == 1 and agent.sync[1].nodes == 4 and agent.sync[0].nodes == 0
    assert agent_view(agent) == agent_view(leader)
    assert "notify" not in json.loads(argv[-1])  # secrets stay with the leader
    assert agent.sync[3].store == leader.sync[3].store and leader.sync[3].store is not None
    assert "never-on-a-command-line" not in " ".join(argv)  # the leader's store-keys.json carries it


def test_the_leaders_configuration_is_the_whole_of_it(tmp_path: Path) -> None:
    view = json.dumps(agent_view(Config(sync=(SyncPair("c", "checkpoint", tmp_path / "l", tmp_path / "p", nodes=2),))))
    with pytest.raises(UsageError, match="give no --settle with it"):
        cli.node_agent_config(cli.parse(["node-agent", "--run-dir", str(tmp_path), "--leader-config", view,
                                         "--settle", "3s"])[1])
    with pytest.raises(Exception, match="not JSON"):
        from_leader("{", tmp_path)


def test_a_flags_only_leader_starts_its_agents_with_every_setting(tmp_path: Path, reaper: list[int]) -> None:
    """The D3 reproduction: the leader's agent argv from a command line without --config, run
    as a real node agent; it must start and carry every setting of every pair."""
    _, ns, command = cli.parse(["--run-dir", str(tmp_path / "run"), "--checkpoints", f"{tmp_path}/local",
                                f"{tmp_path}/persist", "--nodes", "2", "--settle", "17s", "--profile", "torch-save",
                                "--restore", "--marker", "done.node*", "--sync-backend", "python",
                                "--gpu-every", "0", "--", "srun", "python", "train.py"])
    leader = cli.config_from(ns, command)
    argv = agent_argv(leader)
    agent = start_supervise(*argv[3:], env={"SUPERVISE_NODE_RANK": "1"})
    reaper.append(agent.pid)
    assert agent.stdout is not None
    line = agent.stdout.readline()  # blocks until the agent says something, or exits
    assert line.startswith("supervise-node-agent ready 1 "), (line, agent.poll(), agent.stderr and agent.stderr.read())
    journal = tmp_path / "run" / "nodes" / "node-1" / "events.jsonl"
    (start,) = [e for e in read_journal(journal).events if e["kind"] == "node-start"]
    (pair,) = start["pairs"]
    assert {k: pair[k] for k in ("from", "to", "nodes", "settle", "profile", "restore", "markers")} == {
        "from": f"{tmp_path}/local", "to": f"{tmp_path}/persist", "nodes": 2, "settle": 17.0,
        "profile": "torch-save", "restore": True, "markers": ["done.node*"]}
    assert start["settings"]["sync_backend"] == "python" and start["settings"]["gpu_every"] == 0
    # the leader ends: the agent flushes once and ends by itself
    with open(tmp_path / "run" / "events.jsonl", "a") as f:
        f.write(json.dumps({"kind": "end", "attempt": 1, "reason": "finished"}) + "\n")
    out, err = agent.communicate(timeout=90)
    assert agent.returncode == 0, err
    ends = [e for e in read_journal(journal).events if e["kind"] == "end"]
    assert wait_for(lambda: ends) and ends[0]["reason"] == "leader-ended"
