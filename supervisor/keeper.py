"""The keeper: a small process that ends the training when supervise dies, even by SIGKILL.

Invariant 7 (nothing the child started is left running) held only while supervise lived: a
``kill -9`` of it (the OOM killer, a hung node's cleanup) gave the launcher its death signal
(TERM, ``PR_SET_PDEATHSIG``) and nothing else, so a grandchild the launcher did not take down,
a daemon (double fork + setsid) or a process in a session of its own was re-parented to pid 1
and kept running; under PBS without the cgroup hook it even outlived the job.

supervise starts the keeper before the training (``Keeper.start``) and holds the write end of
its stdin, a pipe no other process holds. The kernel closes that end when supervise exits, however
it exits, and the keeper reads EOF. It then ends every process of the training it can find:

* the training's token (``TREE_VARIABLE``) in ``/proc/PID/environ``: supervise puts it into the
  launcher's environment and every descendant inherits it, whatever session or parent it has
  now (a process that cleared its environment is not seen this way);
* the session and the process group of each launcher supervise started (told over the pipe,
  one line each): a process that cleared its environment but stayed in them, as most do;
  only processes that started after that launcher, so a reused id names nothing else.

Those found get TERM (the launchers already have it, from their death signal), ``GRACE_S``
seconds to go, then SIGKILL until none is found; what was done is appended to the journal as
``keeper-killed``. A clean end of supervise leaves nothing to find: the keeper exits at once.
Not found: a process that both cleared its environment and left the launcher's session and
group; another user's process (its environment cannot be read). Where a scheduler's cgroup
holds the job (Slurm's ``proctrack/cgroup``, PBS's cgroup hook) it ends those too, at the job's end.

It runs in a session of its own (a PBS MOM without the cgroup hook kills the job's session at
its end, and the keeper's work comes after that). Run as a script, ``python -I -S keeper.py TOKEN``: the standard library's smallest modules only
(no anyio, no package import), so it costs about a bare interpreter's memory: 10.0 MB resident,
4.0 MB of it anonymous (a bare ``python -I -S`` sleeping: 8.4 and 2.6; CPython 3.11). It ignores every
catchable signal: a terminal's ^C or a TERM meant for supervise must not end it first.
"""

from __future__ import annotations

import os
import signal
import sys
import time

TREE_VARIABLE = "SUPERVISE_TREE_ID"  # in the launcher's environment; its value names one supervise's training
GRACE_S = 3.0  # after supervise died: TERM, then this long for the training to go, then SIGKILL
KILL_BOUND_S = 5.0  # SIGKILL passes until none is found, at most this long (a process in D state may never go)
POLL_S = 0.1


class Launcher:
    """One launcher supervise started: its pid (its session and process group: it leads both)
    and its start time in clock ticks after boot, so a later process with a reused id is not taken."""

    def __init__(self, pid: int, start: int) -> None:
        self.pid, self.start = pid, start


def read_stat(pid: int) -> tuple[int, int, str, int, str] | None:
    """(pgid, sid, state, start, comm) of ``pid`` from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    lpar, rpar = raw.find("("), raw.rfind(")")
    rest = raw[rpar + 2:].split()
    try:
        return int(rest[2]), int(rest[3]), rest[0], int(rest[19]), raw[lpar + 1:rpar]
    except (IndexError, ValueError):
        return None


def has_token(pid: int, needle: bytes) -> bool:
    """Whether ``pid`` started with ``needle`` (``NAME=value``) in its environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False  # gone, or another user's


def training(needle: bytes, launchers: list[Launcher], me: int) -> dict[int, str]:
    """The live processes of the training now: pid → name."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid in (me, 1):
            continue
        stat = read_stat(pid)
        if stat is None or stat[2] in ("Z", "X"):
            continue
        pgid, sid, _state, start, comm = stat
        if any(start >= la.start and la.pid in (sid, pgid) for la in launchers) or has_token(pid, needle):
            found[pid] = comm
    return found


def send(pids: object, sig: int) -> None:
    for pid in pids:  # type: ignore[attr-defined]
        try:
            os.kill(pid, sig)
        except OSError:
            continue


def clean_up(token: str, launchers: list[Launcher]) -> tuple[dict[int, str], list[int], float]:
    """TERM, ``GRACE_S``, then SIGKILL until none is left: (every process found, pid → name;
    those still there after ``KILL_BOUND_S``; seconds it took)."""
    t0 = time.monotonic()
    needle, me = f"{TREE_VARIABLE}={token}".encode(), os.getpid()
    seen = training(needle, launchers, me)
    if not seen:
        return {}, [], 0.0
    send([pid for pid in seen if pid not in {la.pid for la in launchers}], signal.SIGTERM)
    while time.monotonic() - t0 < GRACE_S:
        time.sleep(POLL_S)
        now = training(needle, launchers, me)
        seen.update(now)
        if not now:
            return seen, [], time.monotonic() - t0
    until = time.monotonic() + KILL_BOUND_S
    left = training(needle, launchers, me)
    while left and time.monotonic() < until:
        seen.update(left)
        send(left, signal.SIGKILL)
        time.sleep(POLL_S / 2)
        left = training(needle, launchers, me)
    return seen, sorted(left), time.monotonic() - t0


def emit(kind: str, journal: str, attempt: int, **fields: object) -> None:
    """Append one event to supervise's journal, as its own writer would (never through a link).
    Best effort: the journal may be gone or full; the processes are ended either way. ``json``
    is imported only here, when there was something to end (it is a fifth of the keeper's memory)."""
    import json

    line = json.dumps({"v": 1, "t": round(time.time(), 6), "attempt": attempt, "kind": kind, **fields},
                      separators=(",", ":")) + "\n"
    try:
        fd = os.open(journal, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line  # supervise was killed mid-line: end it (a bad line), ours stays whole
        os.write(fd, line.encode())
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            try:
                signal.signal(sig, signal.SIG_IGN)
            except (OSError, ValueError):
                continue
    token = argv[1]
    launchers: list[Launcher] = []
    journal, attempt = "", 0
    for raw in sys.stdin.buffer:  # until EOF: supervise is gone
        try:  # "PID START ATTEMPT JOURNAL" (Keeper.tell)
            pid, start, number, path = raw.decode("utf-8", "surrogateescape").rstrip("\n").split(" ", 3)
            launchers.append(Launcher(int(pid), int(start)))
        except ValueError:
            continue
        journal, attempt = path or journal, int(number) or attempt
    seen, left, seconds = clean_up(token, launchers)
    if not seen:
        return 0
    try:
        sys.stderr.write(f"supervise keeper: supervise is gone; ended {len(seen)} process(es) of the training "
                         f"in {seconds:.1f} s{f', {len(left)} left' if left else ''}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr gone with supervise's reader
    if journal:
        emit("keeper-killed", journal, attempt, pids=sorted(seen), names=sorted(set(seen.values())),
             left=left, grace_s=GRACE_S, seconds=round(seconds, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
