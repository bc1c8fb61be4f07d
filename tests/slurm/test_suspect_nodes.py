"""docs/slurm.md, "Suspect nodes": a GPU fault during an attempt (an XID 79 injected through the
fake NVML, tests/chaos/_fakenvml) and the requeued job leaves the node behind (ExcNodeList)."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import pytest

from supervisor.journal import read_journal
from tests.support.slurm import SLURM_POLL, Slurm
from tests.support.wait import wait_for

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
FAKE_NVML = REPO / "tests" / "chaos" / "_fakenvml"


def test_an_xid_on_a_requeue_excludes_the_node(slurm: Slurm, tmp_path: Path) -> None:
    spec = json.dumps({"gpus": [{"xids": [[0.5, 79]]}]})
    script = f"""#!/bin/bash
#SBATCH --requeue
#SBATCH --output={tmp_path}/out.txt
for v in ${{!SUPERVISE_@}}; do unset "$v"; done
cd {REPO}
export PYTHONPATH={FAKE_NVML}:{REPO} CHAOS_FAKE_NVML='{spec}'
exec {sys.executable} -m supervisor --run-dir {tmp_path}/run --gpu-backend nvml --gpu-every 0.5 \\
    --checkpoints {tmp_path}/local {tmp_path}/persist --time-limit 6s --warn-before 3s --grace 3s --requeue -- \\
    {sys.executable} {REPO}/tests/helpers/trainer.py {tmp_path}/local
"""
    jobid = slurm.submit(script)
    node = _node_of(slurm, jobid)
    requeue_step = partial(_requeue_step, tmp_path / "run")

    step = wait_for(requeue_step, 90, lambda: (tmp_path / "out.txt").read_text(), interval=SLURM_POLL)
    try:
        assert step["requeued"] is True, step
        assert step["excluded"] == [node] and step["suspect"] == ["XID 79 on GPU 0"], step
        view = slurm.show(jobid)
        assert view.get("ExcNodeList") == node, view
        events = read_journal(tmp_path / "run").events
        assert any(e["kind"] == "gpu-xid" and e["xid"] == 79 for e in events)
    finally:
        slurm.cancel(jobid)


def test_a_hanging_rank_is_dumped_stopped_and_requeued_without_its_node(slurm: Slurm, tmp_path: Path) -> None:
    """Two gloo ranks under torchrun; one stops calling allreduce (tests/helpers/hang_ddp.py)."""
    from supervisor import stacks

    if stacks.py_spy() is None:
        pytest.skip("py-spy is not installed (scripts/setup.sh installs it)")
    torchrun = Path(sys.executable).with_name("torchrun")
    script = f"""#!/bin/bash
#SBATCH --requeue
#SBATCH --output={tmp_path}/out.txt
for v in ${{!SUPERVISE_@}}; do unset "$v"; done
cd {REPO}
export PYTHONPATH={REPO}
exec {sys.executable} -m supervisor --run-dir {tmp_path}/run --gpu-every 0 --logs {tmp_path}/log {tmp_path}/persist \\
    --hang-after 5m --hang-floor 10s --hang-action stop --grace 5s --requeue -- \\
    {torchrun} --nproc-per-node 2 --master-port 29533 {REPO}/tests/helpers/hang_ddp.py {tmp_path}/log --hang-at 40
"""
    jobid = slurm.submit(script)
    node = _node_of(slurm, jobid)
    requeue_step = partial(_requeue_step, tmp_path / "run")

    try:
        step = wait_for(requeue_step, 240, lambda: (tmp_path / "out.txt").read_text()[-3000:], interval=SLURM_POLL)
        assert step["requeued"] is True and step["excluded"] == [node] and step["suspect"] == ["hang"], step
        assert slurm.show(jobid).get("ExcNodeList") == node
        events = read_journal(tmp_path / "run").events
        hang = next(e for e in events if e["kind"] == "hang")
        assert hang["bound_s"] < 300, hang
        assert any(f.startswith("sync_gradients ") for g in stacks.group(tmp_path / "run") for f in g["frames"])
    finally:
        slurm.cancel(jobid)


def _node_of(slurm, jobid: str) -> str:
    """The node the job runs on, once it has one."""
    return wait_for(lambda: slurm.show(jobid).get("NodeList") not in (None, "", "(null)")
                    and slurm.show(jobid)["NodeList"], 60, "the job to get a node", interval=SLURM_POLL)


def _requeue_step(run: Path) -> dict | None:
    """The run's `requeue` stop step, once journaled (read_journal reads a missing run as empty)."""
    return next((e for e in read_journal(run).events if e.get("kind") == "stop-step" and e.get("step") == "requeue"),
                None)
