"""One rank of an OpenMPI job, as ALCF's users (and ezpz) start torch under ``mpiexec``.

``mpirun ... python ompi_rank.py [--chdir DIR] [--log DIR] SCRIPT ARGS...``: the rank's
``OMPI_COMM_WORLD_RANK``/``_SIZE``/``_LOCAL_RANK`` become ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``
(``MASTER_ADDR``/``MASTER_PORT`` come from the job script through ``mpirun -x``), then SCRIPT
runs as ``__main__``. For the tests, with ``--log DIR`` (shared storage) the rank appends
its stdout to ``DIR/rank-R.out`` and its signals to ``DIR/signals.jsonl`` (host, rank, time;
after a TERM it dies of it, as a script without a handler does, ``--term-after S`` seconds
later: a training that finishes its step and saves on TERM, so one rank's death does not
end the others before their own TERM comes); ``--chdir DIR`` makes the
working directory (the node-local checkpoint directory of the DDP tutorial's ``snapshot.pt``).
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import socket
import sys
import threading
import time


def main() -> None:
    args = sys.argv[1:]
    chdir = log = None
    term_after = 0.0
    while args and args[0] in ("--chdir", "--log", "--term-after"):
        if args[0] == "--chdir":
            chdir = args[1]
        elif args[0] == "--term-after":
            term_after = float(args[1])
        else:
            log = args[1]
        args = args[2:]
    env = os.environ
    env["RANK"] = env["OMPI_COMM_WORLD_RANK"]
    env["WORLD_SIZE"] = env["OMPI_COMM_WORLD_SIZE"]
    env["LOCAL_RANK"] = env["OMPI_COMM_WORLD_LOCAL_RANK"]
    rank, host = env["RANK"], socket.gethostname()
    if chdir:
        os.makedirs(chdir, exist_ok=True)
        os.chdir(chdir)
    if log:
        sys.stdout = open(os.path.join(log, f"rank-{rank}.out"), "a", buffering=1)  # noqa: SIM115

        def note(what: str) -> None:
            with open(os.path.join(log, "signals.jsonl"), "a") as f:
                f.write(json.dumps({"what": what, "host": host, "rank": int(rank), "pid": os.getpid(),
                                    "t": time.time()}) + "\n")

        def on_signal(sig: int, _frame: object) -> None:
            note(signal.Signals(sig).name)
            signal.signal(sig, signal.SIG_DFL)
            if term_after > 0:
                threading.Timer(term_after, os.kill, (os.getpid(), sig)).start()
            else:
                os.kill(os.getpid(), sig)

        signal.signal(signal.SIGTERM, on_signal)
        note("start")
        print(f"=== rank {rank} on {host} pid {os.getpid()} at {time.time():.3f}")
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
