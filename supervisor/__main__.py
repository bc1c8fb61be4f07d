"""``python -m supervisor`` is the same as the ``supervise`` command."""

from supervisor.cli import entry

entry()
