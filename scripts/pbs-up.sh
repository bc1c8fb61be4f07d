#!/usr/bin/env bash
# pbs-up.sh ROOT [--nodes N] — a throwaway OpenPBS cluster on this one machine, for tests
# (docs/pbs.md, "The test cluster"; measured in ../shared/notes/pbs-feasibility.md).
#
# Layout (N moms, default 1; the head runs none):
#   netns PFX-sw  bridge br0 NET.1/24, hostname head: pbs_server, pbs_sched, pbs_comm and the
#                 datastore (PostgreSQL), its socket directory private to the cluster
#   netns PFX-nK  veth eth0 NET.(10+K) to br0, hostname nK: pbs_mom, private /tmp from
#                 ROOT/nodes/nK/tmp, ROOT/nodes/nK/local bind-mounted on ROOT/local
#   ROOT/shared   the one directory every node sees (persistent storage)
#   every ns      our /etc/hosts, /etc/passwd, /etc/group (they add the job user, `alice`,
#                 uid 2001, home ROOT/shared/alice), /etc/profile (PBS's commands on the PATH
#                 of a job's login shell, as a site's profile.d/pbs.sh does) and /root seen through an overlay whose top
#                 is 755, so the job user can run the project's Python when it lives under
#                 /root (the machine's /root keeps its mode)
# Why namespaces: pbs_server refuses a host whose name resolves only to loopback, as this
# machine's does. Why a non-root job user: pbs_mom ignores uid-0 processes (no signals, no kill).
# PBS_HOME is under /var/spool/supervise-pbs/PFX (PBS refuses one with a group- or
# world-writable ancestor, so not under /var/tmp); the first start keeps a copy of a fresh
# head's and mom's PBS_HOME there and later starts copy it (5 s instead of 12).
# No /etc/pbs.conf is written: daemons, clients and jobs get PBS_CONF_FILE=ROOT/conf/pbs.conf.*.
#
# Clients: ROOT/in-cluster CMD… (root, on the head) and ROOT/as-user CMD… (the job user, on
# the head, in the current directory). Settings (environment):
#   KILL_DELAY   the queue's kill_delay, seconds from SIGTERM to SIGKILL (default 10, PBS's own)
#   MOM_POLL     "MIN MAX" seconds between a mom's samples (default "1 2"; PBS's own is "10 120",
#                with which a walltime TERM comes up to 2 minutes late)
#   OPERATORS    1: the job user is an operator (it may qrerun its own job); default not
# On success prints one line on stdout, `export PBS_TEST_CLUSTER=ROOT`. Stop: pbs-down.sh ROOT.
set -euo pipefail
ROOT=${1:?usage: pbs-up.sh ROOT [--nodes N]}
N=1
[ "${2:-}" = "--nodes" ] && N=${3:?usage: pbs-up.sh ROOT --nodes N}
log() { echo "pbs-up: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "needs root (network namespaces, bind mounts, PBS daemons)"; exit 3; }
PBS_EXEC=${PBS_EXEC:-/opt/pbs}
[ -x "$PBS_EXEC/sbin/pbs_server" ] || { log "no OpenPBS in $PBS_EXEC (scripts/build-openpbs.sh builds it)"; exit 3; }
for t in ip unshare nsenter setpriv; do command -v "$t" >/dev/null || { log "missing $t"; exit 3; }; done
mkdir -p "$ROOT"; ROOT=$(cd "$ROOT" && pwd)
case "$ROOT" in /tmp|/tmp/*) log "ROOT $ROOT is under /tmp, which every node hides behind its own"; exit 2;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
"$HERE/pbs-down.sh" "$ROOT"   # a cluster left by a killed run under the same ROOT

PFX=svpb$(echo "$ROOT" | md5sum | cut -c1-6)
NET=${NET:-10.213.98}
SPOOL=/var/spool/supervise-pbs
PHOME=$SPOOL/$PFX
JOB_UID=2001
read -r MIN_POLL MAX_POLL <<<"${MOM_POLL:-1 2}"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PBS_EXEC/bin:$PBS_EXEC/sbin
t0=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

mkdir -p "$ROOT"/{conf,log,run,shared,local,nodes} "$PHOME"
chmod 755 "$ROOT" "$ROOT/shared" "$SPOOL" "$PHOME"
NODES="sw"; for i in $(seq "$N"); do NODES="$NODES n$i"; done
{ echo "PFX=$PFX"; echo "PHOME=$PHOME"; echo "NODES='$NODES'"; echo "N=$N"; } >"$ROOT/pbs.env"
fail() { log "$*"; "$HERE/pbs-down.sh" "$ROOT"; exit 1; }
host() { [ "$1" = sw ] && echo head || echo "$1"; }

# Who is who: our hosts, and the job user.
{ echo "127.0.0.1 localhost"; echo "$NET.1 head"; } >"$ROOT/conf/hosts"
for i in $(seq "$N"); do echo "$NET.$((10 + i)) n$i" >>"$ROOT/conf/hosts"; done
grep -v '^alice:' /etc/passwd >"$ROOT/conf/passwd"; grep -v '^alice:' /etc/group >"$ROOT/conf/group"
echo "alice:x:$JOB_UID:$JOB_UID:supervise test job user:$ROOT/shared/alice:/bin/bash" >>"$ROOT/conf/passwd"
echo "alice:x:$JOB_UID:" >>"$ROOT/conf/group"
# A login shell (PBS runs a job script under one) resets PATH in /etc/profile; a PBS site's
# /etc/profile.d/pbs.sh puts the PBS commands back on it, and so does ours.
{ cat /etc/profile; echo "PATH=\$PATH:$PBS_EXEC/bin; export PATH"; } >"$ROOT/conf/profile"
mkdir -p "$ROOT/shared/alice"; chown "$JOB_UID:$JOB_UID" "$ROOT/shared/alice"
mkdir -p "$ROOT/run/pgsock"; chown postgres:postgres "$ROOT/run/pgsock"; chmod 2775 "$ROOT/run/pgsock"
chmod 4755 "$PBS_EXEC/sbin/pbs_iff"   # non-root clients authenticate through it

conf() {  # conf HOST HEAD(0|1): the pbs.conf of one host
  printf '%s\n' "PBS_SERVER=head" "PBS_START_SERVER=$2" "PBS_START_SCHED=$2" "PBS_START_COMM=$2" \
    "PBS_START_MOM=$((1 - $2))" "PBS_EXEC=$PBS_EXEC" "PBS_HOME=$PHOME/$1" "PBS_CORE_LIMIT=unlimited" \
    "PBS_SCP=/usr/bin/scp"
}
conf head 1 >"$ROOT/conf/pbs.conf.sw"
for i in $(seq "$N"); do conf "n$i" 0 >"$ROOT/conf/pbs.conf.n$i"; done

# The network: a bridge in the switch namespace, one veth per node.
ip netns add "$PFX-sw" || fail "ip netns add failed"
ip -n "$PFX-sw" link set lo up
ip -n "$PFX-sw" link add br0 type bridge
ip -n "$PFX-sw" addr add "$NET.1/24" dev br0
ip -n "$PFX-sw" link set br0 up
for i in $(seq "$N"); do
  ip netns add "$PFX-n$i"
  ip -n "$PFX-n$i" link set lo up
  ip link add eth0 netns "$PFX-n$i" type veth peer name "n$i" netns "$PFX-sw"
  ip -n "$PFX-sw" link set "n$i" master br0 up
  ip -n "$PFX-n$i" addr add "$NET.$((10 + i))/24" dev eth0
  ip -n "$PFX-n$i" link set eth0 up
  mkdir -p "$ROOT/nodes/n$i"/{tmp,local}; chmod 1777 "$ROOT/nodes/n$i/tmp"; chmod 777 "$ROOT/nodes/n$i/local"
done

# One anchor process holds each namespace's UTS and mount namespaces; everything else enters
# them with nsenter. /root: an overlay (its top a 755 tmpfs directory) over the machine's /root.
binds() {  # binds NODE: the mounts every namespace makes
  echo "mount --bind '$ROOT/conf/hosts' /etc/hosts; mount --bind '$ROOT/conf/passwd' /etc/passwd;"
  echo "mount --bind '$ROOT/conf/group' /etc/group; mount --bind '$ROOT/conf/profile' /etc/profile;"
  echo "mkdir -p /run/supervise-pbs-root && mount -t tmpfs -o mode=755 tmpfs /run/supervise-pbs-root &&"
  echo "mkdir -p /run/supervise-pbs-root/top /run/supervise-pbs-root/work && chmod 755 /run/supervise-pbs-root/top &&"
  echo "mount -t overlay overlay -o lowerdir=/root,upperdir=/run/supervise-pbs-root/top,workdir=/run/supervise-pbs-root/work /root;"
}
nsenter --net="/run/netns/$PFX-sw" unshare --uts --mount --propagation private \
  sh -c "hostname head; $(binds sw) mount --bind '$ROOT/run/pgsock' /run/postgresql; cd /; exec sleep infinity" \
  >"$ROOT/log/anchor-sw.log" 2>&1 </dev/null &
echo $! >"$ROOT/run/sw.anchor"
for i in $(seq "$N"); do
  nsenter --net="/run/netns/$PFX-n$i" unshare --uts --mount --propagation private \
    sh -c "hostname n$i; $(binds "n$i") mount --bind '$ROOT/nodes/n$i/tmp' /tmp; \
           mount --bind '$ROOT/nodes/n$i/local' '$ROOT/local'; cd /; exec sleep infinity" \
    >"$ROOT/log/anchor-n$i.log" 2>&1 </dev/null &
  echo $! >"$ROOT/run/n$i.anchor"
done
inns() {  # inns NODE CMD…: CMD inside NODE's namespaces, with NODE's pbs.conf
  local n=$1; shift
  PBS_CONF_FILE="$ROOT/conf/pbs.conf.$n" nsenter -t "$(cat "$ROOT/run/$n.anchor")" -n -m -u --wd=/ -- "$@"
}
for n in $NODES; do  # the anchors' mounts are made before anything enters
  for _ in $(seq 100); do [ "$(inns "$n" hostname 2>/dev/null)" = "$(host "$n")" ] && break; sleep 0.05; done
  [ "$(inns "$n" hostname 2>/dev/null)" = "$(host "$n")" ] || fail "namespace $n did not come up ($(cat "$ROOT/log/anchor-$n.log"))"
done
log "namespaces up in $(since "$t0") s"

# PBS_HOMEs: a copy of the pristine ones kept from the first start (pbs_habitat: directories,
# initdb, the default queue), made fresh when there is none for this build.
version=$(cat "$PBS_EXEC/.supervise-build" 2>/dev/null || echo unknown)
TEMPLATE=$SPOOL/template-$version
for n in $NODES; do
  h=$(host "$n"); kind=mom; [ "$n" = sw ] && kind=head
  if [ -d "$TEMPLATE/$kind" ]; then
    cp -a "$TEMPLATE/$kind" "$PHOME/$h"
  else
    inns "$n" "$PBS_EXEC/libexec/pbs_habitat" >"$ROOT/log/habitat-$n.log" 2>&1 \
      || { tail "$ROOT/log/habitat-$n.log" >&2; fail "pbs_habitat on $n failed"; }
    if [ ! -d "$TEMPLATE/$kind" ]; then
      mkdir -p "$TEMPLATE.tmp" && cp -a "$PHOME/$h" "$TEMPLATE.tmp/$kind" && mkdir -p "$TEMPLATE" \
        && mv "$TEMPLATE.tmp/$kind" "$TEMPLATE/$kind"; rm -rf "$TEMPLATE.tmp"
    fi
  fi
  if [ -d "$PHOME/$h/mom_priv" ]; then
    # $usecp: output files are delivered with cp (no scp, no sshd); fast polls: limits within 1–2 s.
    printf '%s\n' '$clienthost head' '$restrict_user_maxsysid 999' '$usecp *:/ /' \
      "\$min_check_poll $MIN_POLL" "\$max_check_poll $MAX_POLL" >"$PHOME/$h/mom_priv/config"
  fi
  # Jobs' environment: /opt/pbs/bin after /usr/bin (its mpiexec would shadow OpenMPI's).
  printf '%s\n' "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PBS_EXEC/bin" \
    "PBS_CONF_FILE=$ROOT/conf/pbs.conf.$n" >"$PHOME/$h/pbs_environment"
done
log "PBS_HOMEs ready in $(since "$t0") s"

# PBS's own start script in each namespace; the nodes' in parallel.
inns sw "$PBS_EXEC/libexec/pbs_init.d" start >"$ROOT/log/start-sw.log" 2>&1 \
  || { cat "$ROOT/log/start-sw.log" >&2; fail "the head did not start"; }
starts=()
for i in $(seq "$N"); do
  inns "n$i" "$PBS_EXEC/libexec/pbs_init.d" start >"$ROOT/log/start-n$i.log" 2>&1 &
  starts+=($!)
done
wait "${starts[@]}" || true   # not a bare `wait`: the anchors are this shell's jobs too
{
  echo "set server acl_roots = root"
  echo "set server flatuid = True"
  echo "set server job_history_enable = True"
  echo "set server scheduler_iteration = 2"
  echo "set queue workq kill_delay = ${KILL_DELAY:-10}"
  [ "${OPERATORS:-0}" = 1 ] && echo "set server operators = alice@*"
  for i in $(seq "$N"); do echo "create node n$i"; done
} >"$ROOT/conf/qmgr.in"
inns sw qmgr <"$ROOT/conf/qmgr.in" >"$ROOT/log/qmgr.log" 2>&1 || { cat "$ROOT/log/qmgr.log" >&2; fail "qmgr refused the settings"; }

cat >"$ROOT/in-cluster" <<EOW
#!/bin/sh
# Run a PBS client (or anything) as root on the cluster's head, in the current directory.
export PATH=\$PATH:$PBS_EXEC/bin:$PBS_EXEC/sbin
PBS_CONF_FILE=$ROOT/conf/pbs.conf.sw exec nsenter -t \$(cat $ROOT/run/sw.anchor) -n -m -u --wd="\$PWD" -- "\$@"
EOW
cat >"$ROOT/as-user" <<EOW
#!/bin/sh
# Run a command as the job user (alice) on the cluster's head, in the current directory.
exec $ROOT/in-cluster setpriv --reuid=$JOB_UID --regid=$JOB_UID --clear-groups \\
  env HOME=$ROOT/shared/alice USER=alice LOGNAME=alice "\$@"
EOW
chmod +x "$ROOT/in-cluster" "$ROOT/as-user"
free=0
for _ in $(seq 300); do
  free=$("$ROOT/in-cluster" pbsnodes -a 2>/dev/null | grep -c "^ *state = free" || true)
  [ "$free" = "$N" ] && break; sleep 0.1
done
[ "$free" = "$N" ] || { tail -n 20 "$ROOT"/log/start-*.log >&2 || true; fail "$free of $N moms came up free"; }
log "up in $(since "$t0") s: head + $N moms ($PFX, PBS_HOME $PHOME)"
echo "export PBS_TEST_CLUSTER=$ROOT"
