#!/usr/bin/env bash
# A one-node Slurm on this machine, for trying and testing examples/slurm/train.sbatch:
# munged, slurmctld and slurmd, with every file (config, key, state, logs) under one directory.
#
#   examples/slurm/local-cluster.sh start    # prints the `export SLURM_CONF=...` line to use
#   examples/slurm/local-cluster.sh stop
#
# Needs Debian/Ubuntu's `slurm-wlm` and `munge` (apt-get install -y slurm-wlm munge) and root,
# since slurmd starts tasks as the submitting user. JAXTRAIN_SLURM_DIR picks the directory
# (default /tmp/jaxtrain-slurm), JAXTRAIN_SLURM_CPUS the CPUs the node offers (default 2).
set -euo pipefail

DIR=${JAXTRAIN_SLURM_DIR:-/tmp/jaxtrain-slurm}
CPUS=${JAXTRAIN_SLURM_CPUS:-2}
HOST=$(hostname -s)
CONF=$DIR/slurm.conf

die() { echo "local-cluster: $*" >&2; exit 1; }

stop() {
  for name in slurmd slurmctld munged; do
    if [[ -f $DIR/$name.pid ]]; then
      pid=$(cat "$DIR/$name.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      rm -f "$DIR/$name.pid"
    fi
  done
}

write_conf() {
  cat > "$CONF" <<CONF
ClusterName=jaxtrain-local
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge.socket
SlurmctldPort=${JAXTRAIN_SLURMCTLD_PORT:-6917}
SlurmdPort=${JAXTRAIN_SLURMD_PORT:-6918}
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=30
MinJobAge=3600
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$HOST CPUs=$CPUS RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
}

start() {
  for cmd in munged slurmctld slurmd sinfo; do
    command -v "$cmd" >/dev/null || die "$cmd is not installed; run: apt-get install -y slurm-wlm munge"
  done
  [[ $(id -u) == 0 ]] || die "slurmd must run as root (it starts tasks as their user)"
  stop
  mkdir -p "$DIR/state" "$DIR/spool"
  chmod 700 "$DIR"
  write_conf
  if [[ ! -s $DIR/munge.key ]]; then
    head -c 1024 /dev/urandom > "$DIR/munge.key"
  fi
  chmod 400 "$DIR/munge.key"
  munged --force --key-file="$DIR/munge.key" --socket="$DIR/munge.socket" \
    --pid-file="$DIR/munged.pid" --log-file="$DIR/munged.log" --seed-file="$DIR/munge.seed" \
    || die "munged did not start; see $DIR/munged.log"
  export SLURM_CONF=$CONF
  slurmctld -f "$CONF" -i || die "slurmctld did not start; see $DIR/slurmctld.log"
  slurmd -f "$CONF" || die "slurmd did not start; see $DIR/slurmd.log"
  for _ in $(seq 100); do  # the node registers, then takes jobs
    state=$(sinfo -h -n "$HOST" -o %t 2>/dev/null || true)
    [[ $state == idle* ]] && { echo "export SLURM_CONF=$CONF"; return 0; }
    sleep 0.2
  done
  die "the node did not come up (state '${state:-none}'); see $DIR/slurmctld.log and $DIR/slurmd.log"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  *) die "usage: $0 start|stop" ;;
esac
