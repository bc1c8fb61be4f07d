#!/usr/bin/env bash
# The distribution as a new user gets it (CI runs this, .ci/run): build the wheel and the sdist,
# check what they carry (LICENSE, the metadata, the example config; the sdist: every file README.md
# links to), then install the wheel alone into a clean virtual environment (no torch, nothing of
# this checkout on the path) and run `supervise --help`, `supervise init --example-config`,
# `supervise init` and `supervise check` from it, outside the checkout. About 20 s with pip's cache warm.
#   PYTHON   the interpreter that builds (default .venv/bin/python: its setuptools, no build isolation)
#   KEEP=DIR keep the wheel and sdist in DIR (default: a temporary directory, removed)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-.venv/bin/python}
work=$(mktemp -d /tmp/check-dist.XXXXXX)
trap 'rm -rf "$work"' EXIT
dist=${KEEP:-$work/dist}
mkdir -p "$dist"
say() { echo "check-dist: $*" >&2; }
die() { echo "check-dist: FAILED: $*" >&2; exit 1; }

t0=$(date +%s)
# setuptools stages into ./build/ and would ship a stale file left there by an earlier build
rm -rf build
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$dist" . >"$work/wheel.log" 2>&1 \
  || { tail -n 30 "$work/wheel.log" >&2; die "the wheel did not build"; }
"$PY" -c 'import sys; from setuptools import build_meta as b; b.build_sdist(sys.argv[1])' "$dist" >"$work/sdist.log" 2>&1 \
  || { tail -n 30 "$work/sdist.log" >&2; die "the sdist did not build"; }
rm -rf build
wheel=$(ls "$dist"/supervise_hpc-*.whl)
sdist=$(ls "$dist"/supervise_hpc-*.tar.gz)
say "built $(basename "$wheel") and $(basename "$sdist")"

"$PY" - "$wheel" "$sdist" <<'EOF' || die "the wheel or the sdist lacks something (above)"
import re, sys, tarfile, zipfile
from pathlib import Path

wheel, sdist = sys.argv[1:3]
problems = []
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    meta = z.read(f"{info}/METADATA").decode()
    if f"{info}/licenses/LICENSE" not in names:
        problems.append("the wheel has no LICENSE")
    elif b"Apache License" not in z.read(f"{info}/licenses/LICENSE"):
        problems.append("the wheel's LICENSE is not the Apache License")
    if "supervisor/presets/example.toml" not in names:
        problems.append("the wheel has no example config (supervisor/presets/example.toml)")
head = meta.split("\n\n", 1)[0]
for field in ("License-Expression: Apache-2.0", "License-File: LICENSE", "Classifier: ", "Requires-Python: >=3.10",
              "Description-Content-Type: text/markdown"):
    if field not in head:
        problems.append(f"the wheel's METADATA has no {field!r}")
with tarfile.open(sdist) as t:
    root = t.getnames()[0].split("/")[0]
    have = {n.removeprefix(root + "/") for n in t.getnames()}
readme = Path("README.md").read_text()
wanted = {"LICENSE", "README.md"} | {m.split("#")[0] for m in re.findall(r"\]\(([^)\s:]+)\)", readme)}
problems += [f"the sdist lacks {w} (README.md links to it)" for w in sorted(wanted - have)]
if problems:
    sys.exit("\n".join(problems))
EOF

"$PY" -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check "$wheel" >"$work/install.log" 2>&1 \
  || { tail -n 30 "$work/install.log" >&2; die "the wheel did not install into a clean venv"; }
"$work/venv/bin/python" -c 'import torch' 2>/dev/null && die "the clean venv has torch: it is not clean"
mkdir "$work/try"
cd "$work/try"
# as a user's shell: no checkout on the path, no job around it
for v in $(compgen -e); do case $v in PYTHON*|SUPERVISE_*|SLURM_*|PBS_*) unset "$v" ;; esac; done
export PATH="$work/venv/bin:$PATH"
S=$work/venv/bin/supervise
"$S" --help >help.txt || die "supervise --help failed"
grep -q -- "--example-config" help.txt || die "supervise --help does not point to supervise init --example-config"
"$S" init --example-config >job.toml || die "supervise init --example-config failed"
cmp -s job.toml "$REPO/configs/example.toml" || die "supervise init --example-config is not configs/example.toml"
"$S" init --scheduler slurm --gpus 0 -- torchrun --nproc-per-node 2 train.py >init.txt || die "supervise init failed"
[ -x train.sbatch ] && [ -f train.toml ] || die "supervise init wrote no train.sbatch and train.toml"
LOCAL_DIR=$work/local PERSISTENT_DIR=$work/persistent "$S" check --config train.toml -- true >check.txt 2>&1 \
  || { cat check.txt >&2; die "supervise check of init's config failed"; }
grep -q "check: ready" check.txt || { cat check.txt >&2; die "supervise check did not say ready"; }
"$S" check --config job.toml -- true >check-example.txt 2>&1 \
  || { cat check-example.txt >&2; die "supervise check of the example config failed"; }
say "ok in $(( $(date +%s) - t0 )) s: wheel and sdist built; the wheel alone (no torch) ran --help, init --example-config, init, check"
