"""A rank for launcher tests: reports its pid, records every checkpoint request and stop.

argv: OUT_DIR [--stop-handler | --ignore-term] [--exit-delay S]. Writes OUT_DIR/ready.<pid> (holding
the rank number it was given), appends "checkpoint <monotonic>" to OUT_DIR/events.<pid> per request,
exits 0 when OUT_DIR/stop exists, a stop signal arrived (with --stop-handler; after S more seconds
and a "stopped" line with --exit-delay, as a large model's save on the way out), or after 120 s
(a leak guard).
"""

import os
import sys
import time

from supervisor import training

out = sys.argv[1]
if "--stop-handler" in sys.argv:
    training.install_stop_handler()
if "--ignore-term" in sys.argv:  # a rank stuck in a collective: only SIGKILL ends it
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
pid = os.getpid()
rank = next((os.environ[v] for v in ("OMPI_COMM_WORLD_RANK", "RANK", "HOROVOD_RANK", "PMI_RANK") if v in os.environ), "?")
events = os.path.join(out, f"events.{pid}")


def note(line: str) -> None:
    with open(events, "a") as f:
        f.write(f"{line} {time.monotonic():.3f}\n")


tmp = os.path.join(out, f".ready.{pid}")
with open(tmp, "w") as f:
    f.write(rank)
os.replace(tmp, os.path.join(out, f"ready.{pid}"))
end = time.monotonic() + 120
while time.monotonic() < end and not os.path.exists(os.path.join(out, "stop")):
    if training.checkpoint_requested():
        note("checkpoint")
        training.acknowledge()
    if training.stop_requested():
        note("stop")
        if "--exit-delay" in sys.argv:
            time.sleep(float(sys.argv[sys.argv.index("--exit-delay") + 1]))
            note("stopped")
        sys.exit(0)
    time.sleep(0.02)
note("exit")
