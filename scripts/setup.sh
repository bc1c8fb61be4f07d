#!/usr/bin/env bash
# Set up this checkout on a fresh Debian/Ubuntu machine: system tools (as root) and .venv.
#   scripts/setup.sh            the agent and its test dependencies
#   SUPERVISE_SETUP_MINIMAL=1   only the agent (no Slurm, OpenMPI, torch)
# Idempotent: what is already there is not installed again.
set -euo pipefail
cd "$(dirname "$0")/.."

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

if [ -z "${SUPERVISE_SETUP_MINIMAL:-}" ]; then
  apt_install rsync openmpi-bin libopenmpi-dev slurmctld slurmd slurm-client munge chromium
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if [ -z "${SUPERVISE_SETUP_MINIMAL:-}" ]; then
  # Exactly this pin: it takes the CPU wheel on disk; anything else pulls gigabytes of CUDA.
  .venv/bin/pip install -q -e '.[test]' 'torch==2.13.0' numpy mpi4py py-spy 2>&1 | grep -v '^WARNING: Location' || true
else
  .venv/bin/pip install -q -e . 2>&1 | grep -v '^WARNING: Location' || true
fi
.venv/bin/python -c 'import supervisor, anyio, watchfiles, httpx' || { echo "setup: install failed" >&2; exit 1; }
