#!/usr/bin/env bash
# Start a real single-node Slurm on this machine (tests and demos): installs Debian's slurm-wlm and
# munge when missing, writes /etc/slurm/slurm.conf (one node `localhost`, no cgroups, no accounting,
# requeue allowed), starts munged, slurmctld and slurmd, and waits until `srun hostname` works.
# Idempotent: re-applies a changed slurm.conf (scontrol reconfigure), starts only what is down.
# Needs root; without root it only checks that a running Slurm answers.
# Stop with slurm/local/stop.sh.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
LOG_DIR=/var/log/slurm
WAIT_S=${SLURM_START_TIMEOUT:-120}

die() { echo "slurm/local/start.sh: $*" >&2; exit 1; }

if [ "$(id -u)" != 0 ]; then
  if command -v srun >/dev/null && timeout 30 srun --immediate=15 -t 1 -N1 -n1 hostname >/dev/null 2>&1; then
    echo "slurm already running ($(sinfo -h -o '%P %D %T' | head -1))"; exit 0
  fi
  die "needs root to install and run slurmctld/slurmd (run it as root or use LAUNCHER=local)"
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || die "slurm-wlm/munge are not installed and there is no apt-get to install them"
  echo "installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null; } \
    || die "apt-get install slurm-wlm munge failed"
fi

# ---- munge: a key, its directories, the daemon ----
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  if command -v mungekey >/dev/null; then mungekey --create --force >/dev/null; else
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
fi
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
chmod 0700 /etc/munge /var/lib/munge /var/log/munge
chmod 0400 /etc/munge/munge.key
if ! munge -n >/dev/null 2>&1; then
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged || die "munged did not start (see /var/log/munge/munged.log)"
  for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.2; done
  munge -n >/dev/null 2>&1 || die "munged is not answering (see /var/log/munge/munged.log)"
fi

# ---- slurm.conf ----
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOG_DIR"
MEM_MB=$(awk '/MemTotal/ {print int($2 / 1024) - 512}' /proc/meminfo)
CPUS=${SLURM_LOCAL_CPUS:-$(nproc)}
cat > "$CONF.new" <<CONF_EOF
# Written by slurm/local/start.sh: a one-node Slurm for tests and demos.
ClusterName=rlpost
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s)
AuthInfo=cred_expire=20
CryptoType=crypto/munge
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
# No accounting daemon: sacct does not work here (orchestration.sweep reads squeue and status.json instead).
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Requeue (preemption, scontrol requeue): allowed; SIGTERM then SIGKILL 30 s later (Slurm's default KillWait:
# a preempted job finishes its step and checkpoints in between); finished jobs visible to squeue for 10 min.
JobRequeue=1
KillWait=30
MinJobAge=600
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF_EOF
changed=0
if cmp -s "$CONF.new" "$CONF"; then rm -f "$CONF.new"; else mv "$CONF.new" "$CONF"; changed=1; fi

# ---- daemons (each started only when its pid file names no live process) ----
# alive PIDFILE NAME: the pid file names a live process of that program (not a zombie: a container's pid 1
# may never reap a daemon killed under it; not another program that got the pid later)
alive() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
  ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null
}
if alive /run/slurmctld.pid slurmctld && alive /run/slurmd.pid slurmd && [ $changed = 1 ]; then
  echo "slurm.conf changed: scontrol reconfigure"
  scontrol reconfigure || die "scontrol reconfigure failed (see $LOG_DIR/slurmctld.log)"
fi
alive /run/slurmctld.pid slurmctld || slurmctld || die "slurmctld did not start (see $LOG_DIR/slurmctld.log)"
alive /run/slurmd.pid slurmd || slurmd -N localhost || die "slurmd did not start (see $LOG_DIR/slurmd.log)"

# Jobs the saved state says run, while no slurmstepd runs on this (only) node, died with an earlier run
# (a machine stopped mid-test, say): they hold the node ALLOCATED or COMPLETING, so srun waits or fails and
# RESUME is refused. Cancel them (no requeue), then DOWN + RESUME clears what is still completing. A job
# younger than 15 s may still be starting its slurmstepd: left alone.
live() {  # live NAME: some process of that program that is not a zombie
  local pid
  for pid in $(pgrep -x "$1"); do
    grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null || return 0
  done
  return 1
}
clear_stale_jobs() {
  live slurmstepd && return 0
  local stale
  stale=$(squeue -h -t R,CG,S -o '%A %M' 2>/dev/null | awk '{
      n = split($2, part, /[-:]/); s = 0
      for (i = 1; i <= n; i++) s = s * (i == 2 && n == 4 ? 24 : 60) + part[i]
      if (s >= 15) printf "%s ", $1 }') || return 0  # controller not answering yet
  [ -n "${stale// /}" ] || return 0
  echo "cancelling jobs left by an earlier run (no process of theirs is alive): $stale"
  # shellcheck disable=SC2086
  scancel $stale >/dev/null 2>&1 || true
  sleep 1
  scontrol update NodeName=localhost State=DOWN Reason="stale jobs of an earlier run" >/dev/null 2>&1 || true
  scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true
}

why_not() {  # the node's and the queue's state, and the logs' ends: enough to see why srun cannot start
  echo "node: $(sinfo -h -N -o '%N %T reason=%E' 2>&1 | head -1)"
  echo "queue: $(squeue -h -o '%A %T %M %R' 2>&1 | head -5 | tr '\n' ';')"
  echo "slurmctld.log:"; tail -n 8 "$LOG_DIR/slurmctld.log" 2>&1
  echo "slurmd.log:"; tail -n 4 "$LOG_DIR/slurmd.log" 2>&1
}

deadline=$((SECONDS + WAIT_S))
until squeue -h >/dev/null 2>&1; do
  [ $SECONDS -lt $deadline ] || die "slurmctld does not answer after ${WAIT_S}s; $(why_not)"
  sleep 1
done
clear_stale_jobs
until timeout 30 srun --immediate=15 -t 1 -N1 -n1 hostname >/dev/null 2>&1; do
  [ $SECONDS -lt $deadline ] || die "srun hostname still fails after ${WAIT_S}s; $(why_not)"
  clear_stale_jobs
  scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true
  sleep 1
done
echo "slurm up: $(sinfo -h -o '%P %D %c cpus %T' | head -1)"
