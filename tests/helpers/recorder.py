"""A stand-in training process that records every signal it receives.

usage: recorder.py LOGFILE [--on-term exit|ignore|exit-code:N] [--spawn-detached PIDFILE]
                           [--exit-after SECONDS] [--exit-code N]
Writes "<NAME> <unix time>" lines to LOGFILE (fsynced) and a "ready" line once its
handlers are installed, so tests poll for readiness instead of sleeping.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("log")
p.add_argument("--on-term", default="exit")
p.add_argument("--spawn-detached")
p.add_argument("--exit-after", type=float)
p.add_argument("--exit-code", type=int, default=0)
args = p.parse_args()

fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def record(text: str) -> None:
    os.write(fd, f"{text} {time.time():.6f} {os.getpid()}\n".encode())
    os.fsync(fd)


def handler(sig: int, frame: object) -> None:
    name = signal.Signals(sig).name
    record(name)
    if sig in (signal.SIGTERM, signal.SIGINT):
        if args.on_term == "exit":
            sys.exit(0)
        if args.on_term.startswith("exit-code:"):
            sys.exit(int(args.on_term.split(":")[1]))


for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(s, handler)

if args.spawn_detached:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    with open(args.spawn_detached, "w") as f:
        f.write(str(child.pid))

record("ready")
deadline = time.monotonic() + (args.exit_after if args.exit_after is not None else 600)
while time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(args.exit_code)
