#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, from Debian's slurm-wlm and munge, for tests and
# trying scripts/slurm/sweep.sbatch without a real cluster. Everything (munge key and socket,
# state, spool, logs, PIDs) lives under DIR; nothing needs systemd, cgroups or accounting.
#
#   scripts/slurm/local-cluster.sh start DIR   # up in about a second; then: source DIR/env
#   scripts/slurm/local-cluster.sh stop DIR    # stops what `start` started, by PID
#
# Environment: SLURMCTLD_PORT (default 6817), SLURMD_PORT (default 6818).
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
mkdir -p "$2"
dir=$(cd "$2" && pwd)

pids=(slurmd slurmctld munged) # stopped in this order

stop() {
  if [ -f "$dir/env" ]; then
    # shellcheck disable=SC1091
    . "$dir/env"
    # Jobs first, so that no slurmstepd outlives its slurmd.
    scancel --quiet --user "$(id -un)" 2>/dev/null || true
    for _ in $(seq 50); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  for name in "${pids[@]}"; do
    f="$dir/$name.pid"
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
  done
}

start() {
  for tool in munged mungekey slurmctld slurmd sbatch squeue sinfo; do
    command -v "$tool" >/dev/null || { echo "$0: $tool not found: apt-get install slurm-wlm munge" >&2; exit 2; }
  done
  stop
  mkdir -p "$dir/state" "$dir/spool" "$dir/log" "$dir/munge"
  chmod 700 "$dir/munge"
  # /run/munge does not exist without systemd: munged runs with its own key, socket and PID here.
  [ -f "$dir/munge/munge.key" ] || mungekey --create --keyfile="$dir/munge/munge.key" >/dev/null
  chmod 600 "$dir/munge/munge.key"
  munged --foreground --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/munged.seed" --log-file="$dir/log/munged.log" \
    >>"$dir/log/munged.out" 2>&1 &
  echo $! >"$dir/munged.pid"

  local host cpus user
  host=$(hostname -s)
  cpus=$(nproc)
  user=$(id -un)
  # SlurmctldHost must be this host's short name; its address and the node's are given as
  # 127.0.0.1 so that no name service is needed. Without DefMemPerCPU each task would get the
  # node's whole memory and the array would run one task at a time; batch_sched_delay=0 removes
  # a 3 s pause before each batch job starts.
  cat >"$dir/slurm.conf" <<EOF
ClusterName=allocbench-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=$user
SlurmdUser=$user
SlurmctldPort=${SLURMCTLD_PORT:-6817}
SlurmdPort=${SLURMD_PORT:-6818}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.daemon.pid
SlurmdPidFile=$dir/slurmd.daemon.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=100
ReturnToService=2
SlurmdTimeout=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$((cpus * 100)) State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  cat >"$dir/env" <<EOF
export SLURM_CONF=$dir/slurm.conf
EOF
  export SLURM_CONF=$dir/slurm.conf

  for _ in $(seq 50); do
    [ -S "$dir/munge/munge.socket" ] && break
    sleep 0.1
  done
  slurmctld -D -i -f "$dir/slurm.conf" >>"$dir/log/slurmctld.out" 2>&1 &
  echo $! >"$dir/slurmctld.pid"
  slurmd -D -f "$dir/slurm.conf" >>"$dir/log/slurmd.out" 2>&1 &
  echo $! >"$dir/slurmd.pid"

  for _ in $(seq 300); do
    state=$(sinfo -h -o %T 2>/dev/null | head -1 || true)
    case "$state" in
      idle*|mixed*|allocated*) echo "slurm up: $host ($cpus CPUs); source $dir/env"; return 0 ;;
    esac
    sleep 0.1
  done
  echo "$0: the cluster did not come up in 30 s (node state '${state:-none}'); logs in $dir/log" >&2
  tail -n 5 "$dir"/log/*.log >&2 || true
  stop
  exit 1
}

case "$action" in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
