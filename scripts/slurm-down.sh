#!/usr/bin/env bash
# slurm-down.sh ROOT — stop what slurm-up.sh ROOT started, newest first.
#
# Jobs are cancelled first (slurmstepd outlives slurmd, so its jobs would be orphaned),
# then each daemon gets SIGTERM by pid file and up to 10 s to exit, then SIGKILL.
#
# A multi-node cluster (slurm-up.sh ROOT --nodes N) is recognised by ROOT/multinode.env
# (`--nodes` may be given too, and changes nothing): its daemons, whatever is left in its
# namespaces, the namespaces themselves and munged go (scripts/slurm-multinode.sh down).
ROOT=${1:?usage: slurm-down.sh ROOT [--nodes]}
if [ -f "$ROOT/multinode.env" ] || [ "${2:-}" = "--nodes" ]; then
  exec "$(dirname "$0")/slurm-multinode.sh" down "$ROOT"
fi
export SLURM_CONF="$ROOT/slurm.conf"
if [ -f "$ROOT/slurmctld.pid" ] && kill -0 "$(cat "$ROOT/slurmctld.pid")" 2>/dev/null; then
  scancel --user="$(id -un)" 2>/dev/null || true
  for _ in $(seq 50); do
    [ -z "$(squeue -h -t running,completing -o %i 2>/dev/null)" ] && break; sleep 0.2
  done
fi
stop() {
  local p=$1
  kill -TERM "$p" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.2; done
  kill -KILL "$p" 2>/dev/null || true
}
for f in slurmd.pid slurmctld.pid munge/munged.pid; do
  [ -f "$ROOT/$f" ] && stop "$(cat "$ROOT/$f")"
done
[ -f "$ROOT/munge/munged.pid.bg" ] && stop "$(cat "$ROOT/munge/munged.pid.bg")"
exit 0
