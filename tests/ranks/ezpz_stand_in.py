"""A stand-in for ALCF's ``ezpz launch`` where ezpz is not installed (CI): what supervise sees of it.

Like ezpz 0.26.1's local fallback (``EZPZ_SCHEDULER`` other than PBS/SLURM), it is a Python
process that composes ``mpirun -np N [options] -- CMD`` and waits for it, and it handles no
signal: TERM or USR1 kill it at once and orphan mpirun and the ranks. Copied to a file named
``ezpz`` and run as ``ezpz launch -np N [mpirun options] -- CMD…``. With EZPZ_STAND_IN_GO=PATH it
starts mpirun only once PATH exists (to look at it before its launcher runs).
"""

import os
import subprocess
import sys
import time

args = sys.argv[1:]
assert args[:1] == ["launch"], args
args = args[1:]
sep = args.index("--")
opts, cmd = args[:sep], args[sep + 1:]
go = os.environ.get("EZPZ_STAND_IN_GO")
while go and not os.path.exists(go):
    time.sleep(0.02)
sys.exit(subprocess.run(["mpirun", *opts, *cmd]).returncode)
