"""A stand-in for the supervisor in a batch job: log every signal that arrives, with a time.

Usage: ``siglog.py LOG [--child] [--requeue-self] [--exit-on-term]``. Lines in LOG (appended,
flushed and fsynced, since SIGKILL may come next):

    <unix time> <role> start pid=<pid> pgid=<pgid> sid=<sid> restart=<SLURM_RESTART_COUNT or ->
    <unix time> <role> signal <NAME>
    <unix time> <role> requeue <ran> <message>

``--child`` starts a second siglog in its own session (as supervise starts the training),
role ``child``, to see whether Slurm reaches processes beyond the batch process. Each role
also rewrites ``LOG.<role>.alive`` every 0.1 s, so its last contents date a SIGKILL.
``--requeue-self`` runs the scheduler's requeue (supervisor.sched) on the detected job (first run only);
``--exit-after-start`` makes a requeued run (SLURM_RESTART_COUNT set) log and exit 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

CAUGHT = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGCONT", "SIGINT", "SIGHUP", "SIGQUIT", "SIGALRM")


def main() -> int:
    log_path, flags = sys.argv[1], set(sys.argv[2:])
    role = "child" if "--role-child" in flags else "batch"
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(text: str) -> None:
        os.write(fd, f"{time.time():.3f} {role} {text}\n".encode())
        os.fsync(fd)

    got_term = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal got_term
        write(f"signal {signal.Signals(signum).name}")
        got_term = got_term or signum == signal.SIGTERM

    for name in CAUGHT:
        signal.signal(getattr(signal, name), on_signal)
    restart = os.environ.get("SLURM_RESTART_COUNT", "-")
    write(f"start pid={os.getpid()} pgid={os.getpgid(0)} sid={os.getsid(0)} restart={restart}")

    if "--exit-after-start" in flags and restart != "-":
        write("exit 0")
        return 0
    if "--child" in flags and role == "batch":
        subprocess.Popen([sys.executable, __file__, log_path, "--role-child"],
                         start_new_session=True, stdin=subprocess.DEVNULL)
    if "--requeue-self" in flags and restart == "-":
        import anyio

        from supervisor.sched import detect_job

        job = detect_job(os.environ)
        ran, message = anyio.run(job.sched.requeue, job)
        write(f"requeue {ran} {' '.join(message.split())}")
    alive = os.open(f"{log_path}.{role}.alive", os.O_WRONLY | os.O_CREAT, 0o644)
    while True:
        os.pwrite(alive, f"{time.time():.3f}\n".encode(), 0)
        if got_term and "--exit-on-term" in flags:
            write("exit on TERM")
            return 0
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
