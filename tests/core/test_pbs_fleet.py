"""The PBS side of the leader's node agents, without a cluster (tests/pbs/test_nodes.py runs
them in real jobs): the ``pbsdsh`` line that starts node K's agent, what ``pbsnodes HOST``
says about a node (recorded from the real OpenPBS 23.06 of tests/pbs), the agents' say files
as the leader reads them, and which of the job's processes on a node get the leader's stop
signal (``jobprocs.ranks_here``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import anyio
import pytest

from supervisor import cli
from supervisor.conduct.fleet import CHOICE_VAR, SAY_VAR, Fleet, lost_nodes
from supervisor.conduct.wire import said_file
from supervisor.jobprocs import JobProcesses, ranks_here, signal_ranks
from supervisor.sched import GONE_STATES, SCHEDULERS, JobKey
from supervisor.sched._pbs_output import parse_pbsnodes
from supervisor.sched.pbs import PbsdshAgents, SaidLines
from tests.support.wait import wait_for

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "pbs" / "real"


def fleet(tmp_path: Path, env: dict[str, str]) -> Fleet:
    argv = [sys.executable, "-m", "supervisor", "node-agent", "--run-dir", str(tmp_path / "run"), "-v",
            "--leader-config", '{"sync":[]}']

    async def make() -> Fleet:  # an anyio Event inside: made in an event loop
        return Fleet(argv, ("n1", "n2", "n3"), lambda *a, **k: {}, env, tmp_path / "run", SCHEDULERS["pbs"])

    return anyio.run(make)


def test_pbsdsh_starts_node_k_on_its_host_with_what_the_leader_must_hand_it(tmp_path: Path) -> None:
    env = {"PATH": "/venv/bin:/usr/bin", "PYTHONPATH": "/repo", "VIRTUAL_ENV": "", "HOME": "/home/alice",
           "PBS_JOBID": "7.head", "SECRET_TOKEN": "x"}
    f = fleet(tmp_path, env)
    assert isinstance(f.agents, PbsdshAgents) and f.agents.launcher == "pbsdsh"
    argv = f.agents.argv_for(2)
    # spawn and return (-o), on node 2's host, through env: pbsdsh hands a TM task no environment
    assert argv[:6] == ["pbsdsh", "-o", "-h", "n3", "--", "/usr/bin/env"], argv
    at = argv.index(sys.executable)
    assignments = argv[6:at]
    assert assignments == ["PATH=/venv/bin:/usr/bin", "PYTHONPATH=/repo", f"{CHOICE_VAR}={f.choice_path}",
                           f"{SAY_VAR}={f.say_dir}", "SUPERVISE_NODE_RANK=2"], assignments  # empty, HOME, others: not
    agent = argv[at:]
    assert agent[:6] == [sys.executable, "-m", "supervisor", "node-agent", "--node-rank", "2"], agent
    ns = cli._node_agent_parser().parse_args(agent[4:])  # noqa: SLF001 - the agent's own parser reads it
    assert (ns.node_rank, ns.run_dir, ns.verbose, ns.leader_config) == ("2", str(tmp_path / "run"), 1, '{"sync":[]}')
    assert f.agents.argv_for(1)[3] == "n2" and "SUPERVISE_NODE_RANK=1" in f.agents.argv_for(1)
    assert f.agents.argv() == f.agents.argv_for(1)  # what the node-agents event shows


def test_pbsnodes_text_of_the_real_pbs_gives_state_and_comment() -> None:
    free = parse_pbsnodes((REAL / "pbsnodes-free.txt").read_text())
    down = parse_pbsnodes((REAL / "pbsnodes-down-offline.txt").read_text())
    assert free == ("free", ""), free
    assert down is not None and "down" in down[0].split(",") and "offline" in down[0].split(","), down
    assert down[1] == "test: n2 died", down  # the operator's pbsnodes -C
    assert parse_pbsnodes("") is None  # pbsnodes: Unknown node (stderr only)
    # what the leader makes of them: a node gone from the allocation counts as lost only when
    # PBS calls it down or offline, not when it is merely elsewhere
    previous = [{"kind": "start", "attempt": 2, "nodes": ["n1", "n2"]}]
    states = {"n2": down}
    lost = lost_nodes(previous, ("n1", "n3"), [], lambda hosts: {h: states[h] for h in hosts if h in states})
    assert [(x["node"], x["index"], x["in_attempt"], x["state"], x["reason"]) for x in lost] == \
        [("n2", 1, 2, down[0], "test: n2 died")], lost
    assert lost_nodes(previous, ("n1", "n3"), [], lambda hosts: {h: free for h in hosts}) == []
    assert not any(s in "FREE" for s in GONE_STATES)


def test_the_say_files_give_whole_lines_once_in_node_order(tmp_path: Path) -> None:
    said = SaidLines(partial(said_file, tmp_path))
    assert said.read([1, 2]) == []  # no file yet: nothing said
    (tmp_path / "node-2").write_text("supervise-node-agent offered 2 n3\nsupervise-node-agent rea")
    (tmp_path / "node-1").write_text("supervise-node-agent offered 1 n2\n")
    assert said.read([1, 2]) == ["supervise-node-agent offered 1 n2", "supervise-node-agent offered 2 n3"]
    assert said.read([1, 2]) == []  # each line once; the half line waits
    with open(tmp_path / "node-2", "a") as f:
        f.write('dy 2 n3 {"ckpt":null}\n')
    assert said.read([1, 2]) == ['supervise-node-agent ready 2 n3 {"ckpt":null}']
    assert said.read([1]) == [] and said.read([3]) == []


def test_the_stop_signal_goes_to_the_ranks_of_this_job_on_this_node(tmp_path: Path) -> None:
    """A node of an OpenMPI job: a shell (the TM task), a launcher daemon, a rank with its data
    loader worker; beside them a process of another job and one of this job without a rank
    variable below the rank's daemon. Only the rank gets the signal: not its worker (the rank
    passes it on, or not, as it chooses), not the daemon or shell, not another job's."""
    log = tmp_path / "got"
    rank = ("import os, signal, subprocess, sys, time\n"
            f"signal.signal(signal.SIGTERM, lambda *a: (open({str(log)!r} + '.' + os.environ['WHO'], 'w').close(), "
            "sys.exit(0)))\n"
            "if os.environ['WHO'] == 'rank':\n"
            "    subprocess.Popen([sys.executable, '-c', sys.argv[1]], env={**os.environ, 'WHO': 'worker'})\n"
            "time.sleep(60)\n")
    job = {**os.environ, "PBS_JOBID": "42.head", "OMPI_COMM_WORLD_RANK": "1", "WHO": "rank"}
    procs = [  # the first stands for the agent (another TM task of the job): its own are never the training
        subprocess.Popen(["sleep", "60"], env=job),
        subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "$0" "$0" & wait', rank], env=job),
        subprocess.Popen([sys.executable, "-c", rank, rank], env={**job, "PBS_JOBID": "43.head", "WHO": "other"}),
    ]
    try:
        training = JobProcesses(JobKey("PBS_JOBID", "42.head"), me=procs[0].pid)
        wait_for(lambda: len(training()) == 3, 20, "the shell, the rank and its worker")
        ranks, found = ranks_here(training)
        assert len(ranks) == 1 and len(found) == 3, (ranks, found)
        done = signal_ranks(training, "SIGTERM")
        assert done["pids"] == sorted(ranks) and done["failed"] == {}, done
        assert "-c" in done["commands"][str(done["pids"][0])]
        wait_for(lambda: (tmp_path / "got.rank").exists(), 20, "the rank's TERM handler ran")
        time.sleep(0.5)
        assert not (tmp_path / "got.worker").exists() and not (tmp_path / "got.other").exists()
        assert signal_ranks(None, "SIGTERM")["pids"] == []
    finally:
        for p in procs:
            for pid in [p.pid, *JobProcesses(JobKey("PBS_JOBID", "42.head"), me=procs[0].pid)()]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()


@pytest.mark.parametrize("name", ["SIGNOPE", ""])
def test_an_unknown_signal_name_is_refused_not_guessed(name: str) -> None:
    done = signal_ranks(JobProcesses(JobKey("PBS_JOBID", "none")), name)
    assert done["pids"] == [] and "unknown signal" in done["error"], done
