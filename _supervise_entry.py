"""The ``supervise`` console script: check that ``import supervisor`` is this project's, then run.

The import package ``supervisor`` shares its name with the Supervisor daemon manager's
(``pip install supervisor``). When that one comes first on ``sys.path``, or was installed over
this one into the same environment, the entry point ``supervisor.cli:entry`` would die with a
ModuleNotFoundError traceback; this module has a name of its own, so it can say what is wrong
in one line instead (exit status 2).
"""

from __future__ import annotations

import sys
from pathlib import Path


def clash() -> str | None:
    """One line naming the wrong ``supervisor`` package, or None when it is ours."""
    try:
        import supervisor
    except ImportError as e:
        return f"cannot import the supervisor package ({e}); reinstall: pip install supervise-hpc"
    where = Path(getattr(supervisor, "__file__", None) or next(iter(getattr(supervisor, "__path__", [])), "?"))
    here = where.parent if where.suffix else where
    if getattr(supervisor, "__version__", None) is None or not (here / "cli.py").is_file():
        foreign = " (the Supervisor daemon manager's)" if (here / "supervisord.py").is_file() else ""
        return (f"`import supervisor` finds {here}{foreign}, not supervise-hpc's: the two share the name "
                f"supervisor; use a virtual environment without it (pip uninstall supervisor), then "
                f"pip install --force-reinstall supervise-hpc")
    return None


def entry() -> None:
    problem = clash()
    if problem:
        print(f"supervise: {problem}", file=sys.stderr)
        sys.exit(2)
    from supervisor.cli import entry as run

    run()
