#!/usr/bin/env bash
# slurm-up.sh ROOT — a throwaway single-node Slurm 22.05 (Debian 12) under ROOT, for tests.
#
# Installs slurmctld/slurmd/slurm-client/munge with apt-get when missing, writes ROOT/slurm.conf,
# starts munged, slurmctld and slurmd in the background (pid files under ROOT) and waits until
# the node is idle. On success it prints exactly one line on stdout:
#     export SLURM_CONF=ROOT/slurm.conf
# so callers can `eval "$(scripts/slurm-up.sh "$ROOT")"`. Everything else goes to stderr.
# Stop it with scripts/slurm-down.sh ROOT. Follows docs/slurm.md and the feasibility notes:
# no slurmdbd (sacct -c from jobcomp/filetxt is enough), KillWait=5 so a cancelled job does
# not hold the node for 30 s, and ports picked free so two clusters can share a machine.
#
# slurm-up.sh ROOT --nodes N (N >= 2) — a multi-node cluster on this one machine instead
# (docs/multinode.md): one slurmctld (hostname "head") and N slurmd (n1…nN), each in its own
# network + UTS + mount namespace, on a bridge in a "switch" namespace, each with its own
# hostname, address, private /tmp and node-local ROOT/local (ROOT/nodes/nK/local underneath);
# ROOT/shared is the one directory every node sees (persistent storage). Clients run through
# ROOT/in-cluster (names resolve only there, so a client run outside fails closed). Needs root,
# iproute2 and util-linux; ROOT must not be under /tmp (the nodes' private /tmp hides it).
# --nodes 1 (the default) is the single-node cluster above, unchanged. Extra slurm.conf lines:
# EXTRA_CONF; node failure detection: SLURMD_TIMEOUT (default 6 s).
set -euo pipefail
ROOT=${1:?usage: slurm-up.sh ROOT [--nodes N]}
NODES=1
[ "${2:-}" = "--nodes" ] && NODES=${3:?usage: slurm-up.sh ROOT --nodes N}
mkdir -p "$ROOT"; ROOT=$(cd "$ROOT" && pwd)
log() { echo "slurm-up: $*" >&2; }
export DEBIAN_FRONTEND=noninteractive

need=(slurmctld slurmd slurm-client munge)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || { log "no apt-get and missing: ${missing[*]}"; exit 3; }
  [ "$(id -u)" = 0 ] || { log "not root and missing: ${missing[*]}"; exit 3; }
  apt_opts=(-y -qq --no-install-recommends -o DPkg::Lock::Timeout=300)
  log "installing ${missing[*]}"
  if ! apt-get install "${apt_opts[@]}" "${missing[@]}" >"$ROOT/apt.log" 2>&1; then
    apt-get update -qq -o DPkg::Lock::Timeout=300 >>"$ROOT/apt.log" 2>&1 || true
    apt-get install "${apt_opts[@]}" "${missing[@]}" >>"$ROOT/apt.log" 2>&1 \
      || { log "apt-get install failed:"; tail -20 "$ROOT/apt.log" >&2; exit 3; }
  fi
fi

if [ "$NODES" -gt 1 ]; then
  exec "$(dirname "$0")/slurm-multinode.sh" up "$ROOT" "$NODES"
fi

# A port nobody listens on (bash's /dev/tcp connect fails) — ours, unless raced.
free_port() {
  local p
  for _ in $(seq 200); do
    p=$(( 20000 + RANDOM % 30000 ))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
  echo 0
}
CTLD_PORT=$(free_port); SLURMD_PORT=$(free_port)

mkdir -p "$ROOT"/{munge,state,spool,log}
chmod 755 "$ROOT" "$ROOT/munge"          # munged refuses a socket dir that is not 755
NODE=$(hostname -s); CPUS=$(nproc)
MEM=$(( $(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) * 8 / 10 ))
if [ ! -f "$ROOT/munge/munge.key" ]; then
  dd if=/dev/urandom of="$ROOT/munge/munge.key" bs=1 count=128 status=none
  chmod 600 "$ROOT/munge/munge.key"
fi
SOCK="$ROOT/munge/munge.socket.2"
munged -F --socket="$SOCK" --key-file="$ROOT/munge/munge.key" \
  --pid-file="$ROOT/munge/munged.pid" --seed-file="$ROOT/munge/munged.seed" \
  >"$ROOT/log/munged.log" 2>&1 </dev/null &
echo $! >"$ROOT/munge/munged.pid.bg"
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { log "munged did not start"; cat "$ROOT/log/munged.log" >&2; exit 1; }

cat >"$ROOT/slurm.conf" <<EOT
ClusterName=supervise
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
StateSaveLocation=$ROOT/state
SlurmdSpoolDir=$ROOT/spool
SlurmctldPidFile=$ROOT/slurmctld.pid
SlurmdPidFile=$ROOT/slurmd.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$ROOT/log/jobcomp.txt
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
KillWait=5
MinJobAge=300
InactiveLimit=0
JobRequeue=1
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOT
export SLURM_CONF="$ROOT/slurm.conf"
slurmctld -D >"$ROOT/log/slurmctld.stdout" 2>&1 </dev/null &
slurmd -D >"$ROOT/log/slurmd.stdout" 2>&1 </dev/null &
for _ in $(seq 150); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 0.2; done
if ! sinfo -h -o %T 2>/dev/null | grep -q idle; then
  log "slurm did not come up"; tail -n 20 "$ROOT"/log/*.log "$ROOT"/log/*.stdout >&2 || true
  exit 1
fi
echo "export SLURM_CONF=$SLURM_CONF"
