#!/usr/bin/env bash
# Install OpenPBS into /opt/pbs for the PBS test cluster (scripts/pbs-up.sh), built once and then
# unpacked from a cache (about 4 minutes to build on 2 cores, 3 s to unpack 21 MB).
#
#   scripts/build-openpbs.sh [TARBALL]
#
# The source: TARBALL (or OPENPBS_SOURCE), a vendored OpenPBS source tarball; else the one CI keeps
# beside the clone, ../shared/vendor/openpbs-cd7ab5e.tar.gz (openpbs/openpbs at cd7ab5eda:
# pbs_version 23.06.06, what every PBS figure in docs/pbs.md was measured with); else OpenPBS's
# v23.06.06 release source, fetched once with curl from GitHub into the cache directory.
# The fetch is untested: the machines this project is built on reach no GitHub; the release tag's
# version is the vendored copy's (configure.ac: 23.06.06), but not necessarily its commit.
#
# Why /opt/pbs and not a directory of ours: the binaries have their prefix built in, and PBS
# checks that no directory above its files is group- or world-writable (so not /var/tmp).
# Never fails setup: on any error it prints one line saying why and exits 0; the PBS tests then
# skip locally (under .ci/run, REQUIRE_ALL_COMPONENTS=1 turns that skip into a failure).
#   SUPERVISE_BUILD_CACHE   where the built tree (and a fetched source) is kept (default ~/.cache/supervise)
#   PBS_EXEC                the prefix (default /opt/pbs)
set -uo pipefail
SOURCE=${1:-${OPENPBS_SOURCE:-}}
case $SOURCE in ''|/*) ;; *) SOURCE=$PWD/$SOURCE ;; esac   # given relative to where it was run
cd "$(dirname "$0")/.."

VENDORED=../shared/vendor/openpbs-cd7ab5e.tar.gz
RELEASE_TAG=v23.06.06
RELEASE_URL=https://github.com/openpbs/openpbs/archive/refs/tags/$RELEASE_TAG.tar.gz
PREFIX=${PBS_EXEC:-/opt/pbs}
CACHE_DIR=${SUPERVISE_BUILD_CACHE:-$HOME/.cache/supervise}
RELEASE=$(. /etc/os-release 2>/dev/null && echo "${ID:-linux}${VERSION_ID:-}")
STAMP=$PREFIX/.supervise-build   # the source this prefix was built from

say() { echo "setup: openpbs: $*" >&2; }

# Build: INSTALL's Debian list with libpq-dev for postgresql-server-dev-all (configure only needs
# libpq-fe.h; the other pulls clang). Runtime: libical3 libcjson1 and PostgreSQL for the datastore.
BUILD_DEPS=(gcc g++ make autoconf automake libtool pkg-config libhwloc-dev libx11-dev libxt-dev libxext-dev
  libxft-dev libedit-dev libical-dev libncurses-dev perl python3-dev tcl-dev tk-dev swig libexpat1-dev
  libssl-dev libcjson-dev libpq-dev)
RUN_DEPS=(libical3 libcjson1 libhwloc15 libpq5 libtcl8.6 libtk8.6 postgresql postgresql-contrib
  iproute2 util-linux procps)

apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update -qq \
    && apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

[ "$(id -u)" = 0 ] || { say "not root: not installed (the PBS tests skip)"; exit 0; }
command -v apt-get >/dev/null || { say "no apt-get: not installed (the PBS tests skip)"; exit 0; }
if [ -n "$SOURCE" ]; then
  [ -f "$SOURCE" ] || { say "no $SOURCE: not installed (the PBS tests skip)"; exit 0; }
elif [ -f "$VENDORED" ]; then
  SOURCE=$VENDORED
else
  SOURCE=$CACHE_DIR/openpbs-$RELEASE_TAG.tar.gz
  if [ ! -f "$SOURCE" ]; then
    command -v curl >/dev/null || apt_install curl || { say "no curl to fetch $RELEASE_URL (the PBS tests skip)"; exit 0; }
    mkdir -p "$CACHE_DIR" && curl -fsSL --connect-timeout 20 --retry 2 -o "$SOURCE.tmp" "$RELEASE_URL" && mv "$SOURCE.tmp" "$SOURCE" \
      || { rm -f "$SOURCE.tmp"; say "no vendored source and $RELEASE_URL could not be fetched: not installed (the PBS tests skip)"; exit 0; }
    say "fetched $RELEASE_URL"
  fi
fi
# the built tree's cache is named after the source (openpbs-cd7ab5e-… for the vendored one, as before)
CACHE=$CACHE_DIR/$(basename "$SOURCE" .tar.gz)-$RELEASE.tar.gz
want=$(sha256sum "$SOURCE" | cut -c1-16)
if [ -x "$PREFIX/sbin/pbs_server" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  apt_install "${RUN_DEPS[@]}" || say "runtime packages did not install"
  exit 0
fi
apt_install "${RUN_DEPS[@]}" || { say "runtime packages did not install"; exit 0; }

if [ -f "$CACHE" ] && [ "$(tar -xOzf "$CACHE" ./.supervise-build 2>/dev/null)" = "$want" ]; then
  rm -rf "$PREFIX" && mkdir -p "$PREFIX" && tar -xzf "$CACHE" -C "$PREFIX" \
    && { say "unpacked from $CACHE"; exit 0; }
  say "the cache $CACHE did not unpack; building"
fi

apt_install "${BUILD_DEPS[@]}" || { say "build packages did not install"; exit 0; }
work=$(mktemp -d /var/tmp/openpbs-build.XXXXXX)
log=$work/build.log
trap 'rm -rf "$work"' EXIT
t0=$(date +%s)
# /usr/bin first: configure links the first python3 it finds (a pyenv one would not be on the nodes).
if ! ( export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
       mkdir "$work/openpbs" && tar -xzf "$SOURCE" -C "$work/openpbs" --strip-components=1 && cd "$work/openpbs" \
       && ./autogen.sh && ./configure --prefix="$PREFIX" --with-python=/usr \
       && make -j"$(nproc)" && rm -rf "$PREFIX" && make install ) >"$log" 2>&1; then
  tail -n 20 "$log" >&2; say "build failed (the PBS tests skip)"; exit 0
fi
# make install also writes /etc/profile.d/pbs.{sh,csh} and a systemd unit: inert without
# /etc/pbs.conf, but they are not ours to leave on the machine.
rm -f /etc/profile.d/pbs.sh /etc/profile.d/pbs.csh /lib/systemd/system/pbs.service
echo "$want" >"$STAMP"
mkdir -p "$CACHE_DIR" && tar -czf "$CACHE.tmp" -C "$PREFIX" . && mv "$CACHE.tmp" "$CACHE"
say "built in $(( $(date +%s) - t0 )) s, cached in $CACHE"
