"""Lightning's own requeue named before the run (``autorequeue.lightning_clash``) and a Slurm
script's ``--signal=USR1@N`` without ``B:`` named by ``supervise check`` (docs/slurm.md,
"Lightning's own requeue"; tests/slurm/test_lightning_requeue.py runs both under Slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.autorequeue import lightning_clash
from supervisor.check import _slurm_signal

TRAIN = "import lightning as L\ntrainer = L.Trainer()\n"
OFF = ("import lightning as L\nfrom lightning.pytorch.plugins.environments import SLURMEnvironment\n"
       "trainer = L.Trainer(plugins=[SLURMEnvironment(auto_requeue=False)])\n")


@pytest.mark.parametrize("text, argv, named", [
    (TRAIN, ["srun", "python", "{t}"], True),
    ("import pytorch_lightning as pl\n", ["env", "A=1", "srun", "-n", "2", "python", "-u", "{t}"], True),
    (TRAIN, ["srun", "--chdir={d}", "python", "train.py"], True),  # relative to srun's --chdir
    (OFF, ["srun", "python", "{t}"], False),
    (TRAIN, ["python", "{t}"], False),  # no srun: Lightning 2.6 does not take it for a Slurm job
    (TRAIN, ["torchrun", "{t}"], False),  # TorchElasticEnvironment wins: no requeue handler
    ("import torch\n", ["srun", "python", "{t}"], False),
    (TRAIN, ["srun", "python", "{d}/missing.py"], False),
])
def test_a_lightning_training_under_srun_is_named(tmp_path: Path, text: str, argv: list[str], named: bool) -> None:
    t = tmp_path / "train.py"
    t.write_text(text)
    said = lightning_clash([a.format(t=t, d=tmp_path) for a in argv], {}, True)
    assert (said is not None) == named, said
    if named:
        assert "SLURMEnvironment(auto_requeue=False)" in said and "B:USR2@N" in said, said


@pytest.mark.parametrize("value, named", [
    ("USR1@60", True), ("SIGUSR1@90", True), ("R:USR1@60", True),
    ("B:USR1@60", False), ("RB:USR1@60", False), ("BR:SIGUSR1@60", False), ("B:USR2@600", False), ("TERM@60", False),
])
def test_a_slurm_scripts_usr1_to_the_tasks_is_named(value: str, named: bool) -> None:
    said = _slurm_signal(Path("job.sh"), f"#!/bin/bash\n#SBATCH --signal={value}\n")
    assert bool(said) == named, said
