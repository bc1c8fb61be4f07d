#!/usr/bin/env bash
# Build DeepSpeed's one JIT op (deepspeed_shm_comm, which init_distributed loads on the CPU) once,
# into the cache tests/frameworks/_harness.py gives every DeepSpeed run as TORCH_EXTENSIONS_DIR.
#
# Why: without it every test's first init_distributed compiles it again (about 35 s; minutes on a
# loaded 2-core machine), longer than the tests' own bounds. The cache is keyed by the venv's path
# (the build's flags name it). A lock left by a build that was killed makes torch wait forever
# for it: one older than 15 minutes is removed first.
# Fails setup when the op does not build: the DeepSpeed tests cannot run without it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
dir=$("$PY" -c 'import sys; sys.path.insert(0, "tests/frameworks"); from _harness import ds_extensions; print(ds_extensions())')
mkdir -p "$dir"
find "$dir" -name lock -mmin +15 -delete 2>/dev/null || true
t0=$(date +%s)
TORCH_EXTENSIONS_DIR="$dir" "$PY" - <<'PY' >/dev/null 2>&1 || { echo "setup: deepspeed: the shm comm op did not build in $dir" >&2; exit 1; }
from deepspeed.accelerator import get_accelerator
builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
builder.load()
PY
echo "setup: deepspeed: comm op ready in $dir ($(( $(date +%s) - t0 )) s)" >&2
