"""supervise: one process that supervises one training run inside an HPC batch job.

The public surface is small: the ``supervise`` command (``supervisor.cli``), the run
directory it writes (docs/design.md, "Run directory"), and ``supervisor.training`` for
training scripts. Everything else is private to the package.
"""

__version__ = "0.1.0"
