#!/usr/bin/env bash
# Install ALCF's ezpz (github.com/saforem2/ezpz, v0.26.1 at 1229a17) for tests/pbs/test_ezpz.py:
# its own venv that sees this checkout's .venv (torch 2.13.0 CPU, mpi4py on OpenMPI,
# transformers, click, rich, numpy), so nothing in .venv changes.
#
# ezpz is on GitHub only: PyPI's `ezpz-ai` 0.9.0 is an empty wheel whose one dependency, PyPI's
# `ezpz` 0.1.2, is an unrelated 2016 image tool. So the source comes from, in this order:
#   EZPZ_SRC                                  a source tree, a tarball of one, or a bare git dir
#   tests/vendor/ezpz-0.26.1-1229a17.tar.gz   (pyproject.toml, README.md, LICENSE, src/; 0.5 MB,
#                                             MIT: tests/vendor/README.md)
# Without either it says so and exits 0 (tests/pbs/test_ezpz.py then skips, saying why).
# Its `ambivalent @ git+https://github.com/saforem2/ambivalent` requirement is left out: it is
# matplotlib styles (ezpz's plot.py catches its ImportError; only `ezpz test`'s finalize imports
# it), and pip cannot resolve a git URL without GitHub. The other requirements are pinned
# below (checked with `pip install --dry-run`: no torch among them).
# Never fails setup: on any error it prints one line saying why and exits 0.
#   EZPZ_VENV   where the venv goes (default .venv-ezpz in this checkout, beside .venv: it points
#               at this .venv; tests read the same variable)
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

VENDORED=tests/vendor/ezpz-0.26.1-1229a17.tar.gz
VENV=${EZPZ_VENV:-$REPO/.venv-ezpz}
VERSION=0.26.1
# ezpz 0.26.1's requirements less ambivalent; click, numpy, rich and transformers (>=4.50) come
# from .venv through the .pth below.
DEPS=(evaluate==0.4.6 hydra-core==1.3.8 omegaconf==2.3.1 plotext==6.1.0 seaborn==0.13.2
  torchinfo==1.8.0 wandb==0.31.0 xarray==2026.9.0)

say() { echo "setup: ezpz: $*" >&2; }

SRC=${EZPZ_SRC:-}
if [ -z "$SRC" ] && [ -f "$VENDORED" ]; then SRC=$VENDORED; fi
if [ -z "$SRC" ] || [ ! -e "$SRC" ]; then
  say "skipped: no source (set EZPZ_SRC to a checkout of github.com/saforem2/ezpz, or put $VENDORED); tests/pbs/test_ezpz.py will skip"
  exit 0
fi
[ -x .venv/bin/python ] || { say "skipped: no .venv (run scripts/setup.sh first)"; exit 0; }

works() {
  "$VENV/bin/python" - "$REPO" "$VERSION" <<'EOF' 2>/dev/null
import sys, torch, ezpz, mpi4py
repo, version = sys.argv[1], sys.argv[2]
import os
main = os.path.realpath(os.path.join(repo, ".venv"))
assert ezpz.__version__ == version, ezpz.__version__
assert os.path.realpath(torch.__file__).startswith(main), torch.__file__  # .venv's torch, not another
EOF
}
if works; then exit 0; fi

work=$(mktemp -d)
log=$work/pip.log
trap 'rm -rf "$work"' EXIT
fail() { tail -n 20 "$log" >&2 2>/dev/null; say "not installed: $1; tests/pbs/test_ezpz.py will skip"; exit 0; }

# A bare git dir (a mirror): its HEAD's files that are present (a mirror may lack large blobs).
src=$SRC
if [ -d "$SRC" ] && [ ! -f "$SRC/pyproject.toml" ] && git --git-dir="$SRC" rev-parse HEAD >/dev/null 2>&1; then
  src=$work/src
  mkdir -p "$src"
  git --git-dir="$SRC" ls-tree -r HEAD | while read -r mode type sha path; do
    [ "$type" = blob ] && git --git-dir="$SRC" cat-file -e "$sha" 2>/dev/null || continue
    mkdir -p "$src/$(dirname "$path")" && git --git-dir="$SRC" cat-file blob "$sha" >"$src/$path"
  done
fi

# The same interpreter as .venv's, and .venv's site-packages after the new venv's own.
base=$(.venv/bin/python -c 'import sys; print(sys._base_executable)') || fail "cannot read .venv's interpreter"
purelib=$(.venv/bin/python -c 'import os, sysconfig; print(os.path.realpath(sysconfig.get_paths()["purelib"]))') || fail "no purelib"
rm -rf "$VENV"
"$base" -m venv "$VENV" >"$log" 2>&1 || fail "python -m venv $VENV failed"
"$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$work/own" || fail "no purelib in $VENV"
echo "$purelib" >"$(cat "$work/own")/zz-supervise-venv.pth"

pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# Refuse anything that would bring another torch.
"$VENV/bin/python" -m pip install --dry-run --disable-pip-version-check "${DEPS[@]}" >"$work/dry" 2>>"$log" \
  || { cat "$work/dry" >>"$log"; fail "pip --dry-run of the requirements failed"; }
if grep -i '^Would install' "$work/dry" | grep -qiE '(^| )((torch|triton)-[0-9]|nvidia-)'; then
  cat "$work/dry" >>"$log"; fail "the requirements would pull another torch"
fi
"${pip[@]}" "${DEPS[@]}" >>"$log" 2>&1 || fail "the requirements did not install"
"${pip[@]}" --no-deps "$src" >>"$log" 2>&1 || fail "ezpz did not build from $SRC"
works || fail "ezpz does not import with .venv's torch"
say "installed ezpz $VERSION from $SRC into $VENV"
