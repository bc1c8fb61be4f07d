"""``lightning_requeue.py`` as supervise asks a Lightning training under srun to be:
``Trainer(plugins=[SLURMEnvironment(auto_requeue=False)])``, supervise requeues.

    srun python lightning_requeue_off.py ROOT_DIR MAX_STEPS
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from lightning.pytorch.plugins.environments import SLURMEnvironment  # noqa: E402

import lightning_requeue  # noqa: E402

if __name__ == "__main__":
    lightning_requeue.main(plugins=[SLURMEnvironment(auto_requeue=False)])
