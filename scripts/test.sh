#!/usr/bin/env bash
# The test command (README quick start, and what .ci/run calls): set up, then pytest.
#   scripts/test.sh [PYTEST ARGS…]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# OpenMPI refuses to run as root unless told; the tests run as root in CI.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Three workers on two cores: most tests wait on real processes, signals and schedulers, not the
# CPU. Tests sharing one Slurm cluster or a module's fixture stay on one worker (tests/conftest.py).
# SUPERVISE_TEST_WORKERS=0 runs everything in this process, one test after another.
# --durations: the slowest tests are named in every log (CI must stay under 40 minutes).
exec .venv/bin/python -m pytest -ra --durations=15 -n "${SUPERVISE_TEST_WORKERS:-3}" --dist loadgroup "$@"
