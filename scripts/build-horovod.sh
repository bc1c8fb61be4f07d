#!/usr/bin/env bash
# Install Horovod with PyTorch, Gloo (and MPI when OpenMPI's compilers are there) into .venv.
#
# Why a script: Horovod 0.28.1 is an sdist only. A plain `pip install horovod` builds in an isolated
# environment without torch and "succeeds" with no extension at all; and the sdist asks for C++14,
# which torch 2.13's headers refuse. So: fetch the sdist, raise CMAKE_CXX_STANDARD to 17, build a
# wheel against the venv's own torch, keep that wheel outside the checkout and reuse it next time
# (minutes to build, seconds to reinstall).
#
# Never fails setup: on any error it prints one line saying why and exits 0; the horovodrun tests
# then skip locally (under .ci/run, REQUIRE_ALL_COMPONENTS=1 turns that skip into a failure).
#   SUPERVISE_WHEEL_CACHE   where built wheels live (default ~/.cache/supervise/wheels)
#   HOROVOD_BUILD_JOBS      parallel compile jobs (default: the number of cores)
set -uo pipefail
cd "$(dirname "$0")/.."

VERSION=0.28.1
PY=.venv/bin/python
STAMP=.venv/.horovod-build   # "VERSION TORCH_VERSION" of the Horovod that works in this venv

say() { echo "setup: horovod: $*" >&2; }

works() {
  # The extension is what a plain install lacks; horovodrun must see Gloo. (Seconds: imports torch.)
  # grep reads it all: `grep -q` quits at the match, horovodrun dies of SIGPIPE on its next line,
  # and pipefail called a working wheel broken (a 6-minute rebuild in CI, now and then).
  "$PY" -c 'import horovod.torch as h; h.init' >/dev/null 2>&1 \
    && .venv/bin/horovodrun --check-build 2>/dev/null | grep '\[X\] Gloo' >/dev/null \
    && echo "$VERSION $torch_version" >"$STAMP"
}

installed() {
  # Fast, no torch import: this version, with its torch extension, checked against this torch.
  [ "$(cat "$STAMP" 2>/dev/null)" = "$VERSION $torch_version" ] && "$PY" -c '
import importlib.metadata as m, sys
d = m.distribution("horovod")
sys.exit(0 if d.version == sys.argv[1] and any("torch/mpi_lib_v2" in str(f) for f in d.files or ()) else 1)
' "$VERSION" 2>/dev/null
}

torch_version=$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null) \
  || { say "skipped: torch is not installed in .venv (horovodrun tests will skip)"; exit 0; }
py_tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
cache=${SUPERVISE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/supervise/wheels}/horovod-$VERSION-$py_tag-torch-$torch_version

if installed; then exit 0; fi

wheel=$(ls "$cache"/horovod-"$VERSION"-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  .venv/bin/pip install -q --force-reinstall --no-deps "$wheel" >/dev/null 2>&1 \
    && .venv/bin/pip install -q "$wheel" >/dev/null 2>&1 \
    && works && { say "installed the cached wheel $wheel"; exit 0; }
  say "the cached wheel $wheel does not work; building again"
fi

for tool in cmake g++ make; do
  command -v "$tool" >/dev/null || { say "not built: $tool is missing (horovodrun tests will skip)"; exit 0; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")
log="$work/build.log"
trap 'rm -rf "$work"' EXIT   # fail() keeps the log in the cache

fail() {
  mkdir -p "$cache" && cp "$log" "$cache/last-failed-build.log" 2>/dev/null
  say "not built: $1 (log: $cache/last-failed-build.log; horovodrun tests will skip)"
  exit 0
}

started=$SECONDS
.venv/bin/pip download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$work/sdist" >>"$log" 2>&1 \
  || fail "pip could not fetch the horovod==$VERSION sdist"
mkdir -p "$work/src"
tar -xzf "$work"/sdist/horovod-"$VERSION".tar.gz -C "$work/src" || fail "could not unpack the sdist"
src="$work/src/horovod-$VERSION"
# The standard fix: torch >= 2.1 headers need C++17 (the sdist sets 14 in these two files).
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
  "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
grep -q 'CMAKE_CXX_STANDARD 14' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt" \
  && fail "the C++17 patch did not apply"

# Its build needs these in the venv because build isolation is off (the isolated build has no torch).
.venv/bin/pip install -q setuptools wheel packaging cloudpickle psutil pyyaml >>"$log" 2>&1 \
  || fail "could not install the build requirements"

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
export MAKEFLAGS="-j${HOROVOD_BUILD_JOBS:-$(nproc)}"

build_wheel() {
  rm -rf "$src/build" "$work/wheel"
  .venv/bin/pip wheel -q --no-build-isolation --no-deps -w "$work/wheel" "$src" >>"$log" 2>&1 && return 0
  # The first compiler or CMake error says why; pip's own lines only say that it failed.
  reason=$(grep -E '#error|fatal error:| error: |CMake Error' "$log" | grep -v 'subprocess-exited-with-error' \
           | head -1 | sed 's/^ *//' | cut -c1-200)
  return 1
}

reason=""
if command -v mpicxx >/dev/null; then
  say "building $VERSION against torch $torch_version with Gloo and MPI; a few minutes, once"
  HOROVOD_WITH_MPI=1 build_wheel || { say "with MPI it failed (${reason:-see the log}); trying Gloo only"; : >"$log"; }
fi
if [ ! -d "$work/wheel" ] || [ -z "$(ls "$work"/wheel/*.whl 2>/dev/null)" ]; then
  command -v mpicxx >/dev/null || say "building $VERSION against torch $torch_version with Gloo (no mpicxx); a few minutes, once"
  HOROVOD_WITHOUT_MPI=1 build_wheel || fail "pip wheel failed: ${reason:-see the log}"
fi
built=$(ls "$work"/wheel/horovod-"$VERSION"-*.whl 2>/dev/null | head -1)
[ -n "$built" ] || fail "pip wheel made no wheel"
.venv/bin/pip install -q "$built" >>"$log" 2>&1 || fail "could not install the built wheel"
works || fail "the built wheel installed but horovod.torch or horovodrun --check-build (Gloo) does not work"
mkdir -p "$cache" && cp "$built" "$cache/" && rm -f "$cache/last-failed-build.log"
say "built and cached in $((SECONDS - started)) s: $cache/$(basename "$built")"
