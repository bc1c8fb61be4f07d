"""Running a scheduler's own tools (squeue, scontrol, qstat, qrerun…) without ever raising.

A scheduler that is slow, missing or answers nonsense must not take the supervision down
(docs/design.md, invariant 4): every call is an argv list with a deadline, and a failure
comes back as a status and a message, said once through ``report``.
"""

from __future__ import annotations

import subprocess
from typing import Callable

import anyio

Report = Callable[[str], None]
QUERY_TIMEOUT = 15.0     # squeue/scontrol/qstat answer in milliseconds when the controller is well
REQUEUE_TIMEOUT = 60.0   # submitit's bound for scontrol requeue (#1713)


async def run_tool(argv: list[str], timeout: float, report: Report) -> tuple[int | None, str]:
    """Run argv with a deadline, stdin closed: (exit status, stdout), or (status, stderr +
    stdout) when it failed, or (None, why) when it did not run or answer in time."""
    try:
        with anyio.fail_after(timeout):
            # Its own session: PBS's TERM goes to every process of the job's session (a qstat in
            # flight at a qdel died of it, measured), and the answer is wanted after that TERM.
            result = await anyio.run_process(argv, check=False, stdin=subprocess.DEVNULL, start_new_session=True)
    except TimeoutError:
        report(f"{argv[0]} did not answer within {timeout:g}s")
        return None, f"timed out after {timeout:g}s"
    except OSError as exc:
        report(f"cannot run {argv[0]}: {exc.strerror or exc}")
        return None, str(exc.strerror or exc)
    out = result.stdout.decode(errors="replace")
    if result.returncode != 0:
        out = result.stderr.decode(errors="replace") + out
        report(f"{' '.join(argv)} exited {result.returncode}: {' '.join(out.split())[:200]}")
    return result.returncode, out


def outcome(argv: list[str], rc: int | None, out: str) -> tuple[bool, str]:
    """(done, message) of a command that acts (a requeue): done only on exit status 0."""
    text = " ".join(out.split())[:500]
    if rc == 0:
        return True, f"{' '.join(argv)}: ok" + (f" ({text})" if text else "")
    return False, f"{' '.join(argv)}: " + (f"exit {rc}" if rc is not None else "did not run") + (f": {text}" if text else "")
