#!/usr/bin/env bash
# pbs-down.sh ROOT — stop what pbs-up.sh ROOT started and leave nothing behind: no PBS daemon,
# no PostgreSQL, no process in the cluster's namespaces, no namespace, no PBS_HOME.
#
# PBS's own stop first, in every namespace at once (pbs_init.d: qterm, the datastore's stop,
# then mom, scheduler and comm), bounded to 60 s; then whatever is left in the namespaces (job
# processes, a stuck daemon) by pid, the anchors, the namespaces, the PBS_HOMEs.
set -uo pipefail
ROOT=${1:?usage: pbs-down.sh ROOT}
[ -f "$ROOT/pbs.env" ] || exit 0
ROOT=$(cd "$ROOT" && pwd)
# shellcheck disable=SC1091
. "$ROOT/pbs.env"
PBS_EXEC=${PBS_EXEC:-/opt/pbs}
log() { echo "pbs-down: $*" >&2; }
anchor() { cat "$ROOT/run/$1.anchor" 2>/dev/null; }
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

for n in $NODES; do
  a=$(anchor "$n")
  alive "$a" || continue
  ( PBS_CONF_FILE="$ROOT/conf/pbs.conf.$n" timeout 60 nsenter -t "$a" -n -m -u --wd=/ -- \
      "$PBS_EXEC/libexec/pbs_init.d" stop >"$ROOT/log/stop-$n.log" 2>&1 || log "stop on $n: rc $?" ) &
done
wait
for n in $NODES; do
  for p in $(ip netns pids "$PFX-$n" 2>/dev/null); do
    [ "$p" = "$(anchor "$n")" ] && continue
    kill -KILL "$p" 2>/dev/null || true
  done
  a=$(anchor "$n"); alive "$a" && kill -KILL "$a" 2>/dev/null
done
for _ in $(seq 50); do
  left=""
  for n in $NODES; do left="$left$(ip netns pids "$PFX-$n" 2>/dev/null)"; done
  [ -z "$left" ] && break; sleep 0.1
done
[ -z "$left" ] || log "processes still in the namespaces: $left"
for n in $NODES; do ip netns del "$PFX-$n" 2>/dev/null || true; done
# The first `ip netns add` left /run/netns as a bind mount: drop it once no namespace is left.
if [ -z "$(ip netns list 2>/dev/null)" ] && mountpoint -q /run/netns 2>/dev/null; then
  umount /run/netns 2>/dev/null || true
fi
case "$PHOME" in /var/spool/supervise-pbs/svpb*) rm -rf "$PHOME" ;; esac
rm -f "$ROOT/pbs.env" "$ROOT"/run/*.anchor
exit 0
