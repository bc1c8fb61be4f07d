#!/usr/bin/env bash
# slurm-multinode.sh up ROOT N | down ROOT — the multi-node test cluster behind
# `slurm-up.sh ROOT --nodes N` and `slurm-down.sh ROOT` (docs/multinode.md).
#
# Layout (measured in ../shared/notes/multinode-feasibility.md, "Q1"):
#   munged on the host, socket ROOT/munge/munge.socket.2 (a path: every namespace reaches it)
#   netns PFX-sw  bridge br0 NET.1/24; slurmctld (hostname head, our /etc/hosts)
#   netns PFX-nK  veth eth0 NET.(10+K) to br0; slurmd (hostname nK, our /etc/hosts, private /tmp
#                 from ROOT/nodes/nK/tmp, ROOT/nodes/nK/local bind-mounted on ROOT/local)
#   ROOT/shared   the one directory every node sees (persistent storage)
#   SSHD=1        also an sshd on port 22 of every node (in slurmd's namespaces: its /tmp, its
#                 ROOT/local), root's key in ROOT/ssh, the nodes' /etc/ssh/ssh_config naming it
#                 and the nodes' host key, as a cluster's compute nodes have (horovodrun's
#                 ssh check; ../docs/multinode.md)
# Nothing is added to the machine's own network namespace; slurm.conf names hosts only, and
# the names resolve only inside our mount namespaces, so a client run outside fails closed.
# PFX is derived from ROOT, so two clusters (and the single-node one) never collide.
set -euo pipefail
CMD=${1:?usage: slurm-multinode.sh up ROOT N | down ROOT}
ROOT=${2:?ROOT}
log() { echo "slurm-multinode: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "needs root (network namespaces, bind mounts)"; exit 3; }
for t in ip unshare nsenter munged slurmctld slurmd; do
  command -v "$t" >/dev/null || { log "missing $t"; exit 3; }
done

down() {
  local root=$1
  [ -f "$root/multinode.env" ] || return 0
  # shellcheck disable=SC1091
  . "$root/multinode.env"
  # Jobs first: slurmstepd outlives slurmd and would orphan them (bounded: the cluster may be half dead).
  if [ -x "$root/in-cluster" ] && [ -n "$(ip netns list 2>/dev/null | grep -w "$PFX-sw" || true)" ]; then
    timeout 10 "$root/in-cluster" scancel --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 25); do
      [ -z "$(timeout 5 "$root/in-cluster" squeue -h -t running,completing -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  local pids=""
  for f in "$root"/run/*.bg; do [ -f "$f" ] && pids="$pids $(cat "$f")"; done
  for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
  for _ in $(seq 50); do
    local alive=0
    for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break; sleep 0.2
  done
  for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
  # Whatever is left inside the namespaces (slurmstepd, job tasks, node agents): by pid, ours only.
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PFX-(sw|n[0-9]+)$" || true); do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
  done
  for _ in $(seq 50); do
    local left=""
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PFX-(sw|n[0-9]+)$" || true); do
      left="$left$(ip netns pids "$ns" 2>/dev/null)"
    done
    [ -z "$left" ] && break; sleep 0.1
  done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PFX-(sw|n[0-9]+)$" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  if [ -f "$root/run/munged.pid" ]; then
    p=$(cat "$root/run/munged.pid"); kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  fi
  # The first `ip netns add` left /run/netns as a bind mount: drop it once no namespace is left.
  if [ -z "$(ip netns list 2>/dev/null)" ] && mountpoint -q /run/netns 2>/dev/null; then
    umount /run/netns 2>/dev/null || true
  fi
  rm -f "$root"/run/*.bg "$root/multinode.env"
}

if [ "$CMD" = down ]; then
  mkdir -p "$ROOT"; ROOT=$(cd "$ROOT" && pwd)
  down "$ROOT"
  exit 0
fi
[ "$CMD" = up ] || { log "unknown command $CMD"; exit 2; }
N=${3:?N}
mkdir -p "$ROOT"; ROOT=$(cd "$ROOT" && pwd)
case "$ROOT" in /tmp|/tmp/*) log "ROOT $ROOT is under /tmp, which every node hides behind its own"; exit 2;; esac
PFX=${PFX:-svmn$(echo "$ROOT" | md5sum | cut -c1-6)}
NET=${NET:-10.213.47}
SLURMD_TIMEOUT=${SLURMD_TIMEOUT:-6}
down "$ROOT"  # a cluster left by a killed run under the same ROOT
mkdir -p "$ROOT"/{munge,state,spool,log,run,shared,local,nodes}
chmod 755 "$ROOT" "$ROOT/munge"
echo "PFX=$PFX" >"$ROOT/multinode.env"; echo "N=$N" >>"$ROOT/multinode.env"
[ -f "$ROOT/munge/munge.key" ] || {
  dd if=/dev/urandom of="$ROOT/munge/munge.key" bs=1 count=128 status=none; chmod 600 "$ROOT/munge/munge.key"; }
SOCK="$ROOT/munge/munge.socket.2"
# 10 threads, as srun itself asks when munged refuses it ("restart with --num-threads=10"): at 128
# nodes every slurmd, srun and step signs at once on two loaded cores (bench/scale.py, issue 44)
munged -F --num-threads=10 --socket="$SOCK" --key-file="$ROOT/munge/munge.key" --pid-file="$ROOT/munge/munged.pid" \
  --seed-file="$ROOT/munge/munged.seed" >"$ROOT/log/munged.log" 2>&1 </dev/null &
echo $! >"$ROOT/run/munged.pid"
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { log "munged did not start"; cat "$ROOT/log/munged.log" >&2; down "$ROOT"; exit 1; }

fail() { log "$*"; down "$ROOT"; exit 1; }
ip netns add "$PFX-sw" || fail "ip netns add failed"
ip -n "$PFX-sw" link set lo up
ip -n "$PFX-sw" link add br0 type bridge
ip -n "$PFX-sw" addr add "$NET.1/24" dev br0
ip -n "$PFX-sw" link set br0 up
{ echo "127.0.0.1 localhost"; echo "$NET.1 head"; } >"$ROOT/hosts"
for i in $(seq "$N"); do
  ip netns add "$PFX-n$i"
  ip -n "$PFX-n$i" link set lo up
  ip link add eth0 netns "$PFX-n$i" type veth peer name "n$i" netns "$PFX-sw"
  ip -n "$PFX-sw" link set "n$i" master br0 up
  ip -n "$PFX-n$i" addr add "$NET.$((10 + i))/24" dev eth0
  ip -n "$PFX-n$i" link set eth0 up
  echo "$NET.$((10 + i)) n$i" >>"$ROOT/hosts"
  mkdir -p "$ROOT/nodes/n$i"/{tmp,local} "$ROOT/spool/n$i"; chmod 1777 "$ROOT/nodes/n$i/tmp"
done

SSHD_START=""
if [ "${SSHD:-0}" = 1 ]; then
  [ -x /usr/sbin/sshd ] || fail "SSHD=1 needs openssh-server (/usr/sbin/sshd)"
  rm -rf "$ROOT/ssh"; mkdir -p "$ROOT/ssh"
  ssh-keygen -q -t ed25519 -N '' -C "cluster-host" -f "$ROOT/ssh/host_ed25519"
  ssh-keygen -q -t ed25519 -N '' -C "root@cluster" -f "$ROOT/ssh/id_ed25519"
  cp "$ROOT/ssh/id_ed25519.pub" "$ROOT/ssh/authorized_keys"
  : >"$ROOT/ssh/known_hosts"
  for i in $(seq "$N"); do echo "n$i,$NET.$((10 + i)) $(cut -d' ' -f1-2 "$ROOT/ssh/host_ed25519.pub")" >>"$ROOT/ssh/known_hosts"; done
  cat >"$ROOT/ssh/sshd_config" <<EOT
Port 22
HostKey $ROOT/ssh/host_ed25519
AuthorizedKeysFile $ROOT/ssh/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
X11Forwarding no
PrintMotd no
PrintLastLog no
EOT
  cat >"$ROOT/ssh/ssh_config" <<EOT
Host *
  IdentityFile $ROOT/ssh/id_ed25519
  GlobalKnownHostsFile $ROOT/ssh/known_hosts
  UserKnownHostsFile /dev/null
  LogLevel ERROR
EOT
  mkdir -p /run/sshd && chmod 755 /run/sshd   # sshd's privilege separation directory
  SSHD_START="mount --bind '$ROOT/ssh/ssh_config' /etc/ssh/ssh_config; /usr/sbin/sshd -f '$ROOT/ssh/sshd_config' -E '$ROOT/log/sshd-NODE.log' -o PidFile='$ROOT/run/sshd-NODE.pid';"
fi

cat >"$ROOT/slurm.conf" <<EOT
ClusterName=supervise-mn
SlurmctldHost=head
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
StateSaveLocation=$ROOT/state
SlurmdSpoolDir=$ROOT/spool/%n
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd-%n.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd-%n.log
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
SlurmdTimeout=$SLURMD_TIMEOUT
MessageTimeout=$(( SLURMD_TIMEOUT / 2 > 1 ? SLURMD_TIMEOUT / 2 : 2 ))
NodeName=n[1-$N] CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
${EXTRA_CONF:-}
EOT

nsenter --net="/run/netns/$PFX-sw" unshare --uts --mount --propagation private \
  sh -c "hostname head; mount --bind '$ROOT/hosts' /etc/hosts; cd /; exec slurmctld -D -f '$ROOT/slurm.conf'" \
  >"$ROOT/log/slurmctld.stdout" 2>&1 </dev/null &
echo $! >"$ROOT/run/slurmctld.bg"
for i in $(seq "$N"); do
  nsenter --net="/run/netns/$PFX-n$i" unshare --uts --mount --propagation private \
    sh -c "hostname n$i; mount --bind '$ROOT/hosts' /etc/hosts; mount --bind '$ROOT/nodes/n$i/tmp' /tmp; \
           mount --bind '$ROOT/nodes/n$i/local' '$ROOT/local'; ${SSHD_START//NODE/n$i} cd /; SLURM_CONF='$ROOT/slurm.conf' exec slurmd -D" \
    >"$ROOT/log/slurmd-n$i.stdout" 2>&1 </dev/null &
  echo $! >"$ROOT/run/slurmd-n$i.bg"
done
cat >"$ROOT/in-cluster" <<EOW
#!/bin/sh
# Run a Slurm client (or anything) as a machine on the cluster's network would: the switch
# namespace, with the cluster's hosts file.
export SLURM_CONF=$ROOT/slurm.conf
exec nsenter --net=/run/netns/$PFX-sw unshare --mount --propagation private \\
  sh -c 'mount --bind $ROOT/hosts /etc/hosts && exec "\$@"' in-cluster "\$@"
EOW
chmod +x "$ROOT/in-cluster"
up=""
for _ in $(seq 300); do
  up=$("$ROOT/in-cluster" sinfo -h -o '%T %D' 2>/dev/null || true)
  [ "$up" = "idle $N" ] && break; sleep 0.1
done
[ "$up" = "idle $N" ] || { tail -n 20 "$ROOT"/log/*.log >&2 || true; fail "the $N nodes did not come up idle (sinfo: $up)"; }
echo "export SLURM_CONF=$ROOT/slurm.conf"
