"""A training that requeues its own job: Lightning's ``SLURMEnvironment(auto_requeue=True)``.

Lightning's default under ``srun`` (lightning 2.6: ``SLURMEnvironment.detect()`` is "srun
started this process") installs a SIGUSR1 handler in every task that saves
``hpc_ckpt_N.ckpt`` into ``Trainer.default_root_dir`` and runs ``scontrol requeue`` from
global rank 0. Measured under supervise on the test Slurm (docs/slurm.md, "Lightning's own
requeue"): supervise's own stop never sends srun a USR1 (srun shows no handler for it), but
the USR1 of Lightning's documented ``#SBATCH --signal=SIGUSR1@90`` (or a person's
``scancel --signal=USR1 JOBID``) reaches the tasks directly: Lightning then requeued the job
up to N+60 s before its end, from inside the training, its ``hpc_ckpt_1.ckpt`` landed outside
the checkpoint pair and was never published, supervise stopped it as a preemption, and the
next attempt resumed from the older ``last.ckpt``. supervise should be the one that requeues:
``lightning_clash`` says so before the run, in the plan's warnings (the run's log and
``supervise check``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping, Sequence

from supervisor import launchers

_IMPORTS = re.compile(r"^\s*(?:from|import)\s+(?:lightning|pytorch_lightning)\b", re.M)
_OFF = re.compile(r"auto_requeue\s*=\s*False")
READ_MAX = 1 << 20  # a training script's first MiB


def _script(argv: Sequence[str], env: Mapping[str, str]) -> Path | None:
    """The Python script srun starts: the first ``*.py`` word, read from srun's ``--chdir`` when relative."""
    chdir = None
    for i, word in enumerate(argv):
        if word.startswith("--chdir="):
            chdir = word.split("=", 1)[1]
        elif word in ("--chdir", "-D") and i + 1 < len(argv):
            chdir = argv[i + 1]
        elif word.endswith(".py"):
            path = Path(word)
            if not path.is_absolute():
                path = Path(chdir or env.get("PWD") or os.getcwd()) / path
            return path
    return None


def lightning_clash(command: Sequence[str], env: Mapping[str, str], requeue: bool) -> str | None:
    """One line when ``command`` is ``srun … python SCRIPT`` and SCRIPT imports Lightning without
    turning its auto-requeue off; None otherwise (and whenever the script cannot be read)."""
    argv = launchers.unwrap(command)
    if not argv or os.path.basename(argv[0]) != "srun":
        return None
    path = _script(argv[1:], env)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(READ_MAX)
    except OSError:
        return None
    if not _IMPORTS.search(text) or _OFF.search(text):
        return None
    ours = "supervise requeues it (requeue = true)" if requeue else "supervise was told not to requeue"
    return (f"{path.name}: Lightning under srun requeues the job itself on SIGUSR1 (SLURMEnvironment(auto_requeue=True), "
            f"its default: hpc_ckpt_N.ckpt into default_root_dir, outside the mirrored checkpoints, then scontrol "
            f"requeue) while {ours}: give Trainer(plugins=[SLURMEnvironment(auto_requeue=False)]) and no "
            f"#SBATCH --signal=USR1@N (B:USR2@N instead), docs/slurm.md")
