#!/usr/bin/env bash
# Starts a one-node Slurm cluster on this machine (munged, slurmctld, slurmd, started by hand: no
# systemd), for the srun tests and for trying slurm/*.sbatch without a cluster. Idempotent: a running
# cluster started by this script is reused. The node advertises WB_SLURM_CPUS CPUs (default 64) so that
# jobs with more tasks than cores can run.
#
#   bash scripts/slurm-local.sh start     # prints the SLURM_CONF to export
#   bash scripts/slurm-local.sh stop
set -euo pipefail
action=${1:-start}
state=${WB_SLURM_DIR:-/tmp/wb-slurm}
cpus=${WB_SLURM_CPUS:-64}
conf=$state/slurm.conf
node=$(hostname -s)

stop() {
  for daemon in slurmd slurmctld; do
    if [[ -f $state/$daemon.pid ]]; then kill "$(cat "$state/$daemon.pid")" 2>/dev/null || true; fi
  done
  if [[ -f $state/munged.pid ]]; then kill "$(cat "$state/munged.pid")" 2>/dev/null || true; fi
  rm -f "$state"/*.pid
}

if [[ $action == stop ]]; then
  stop
  exit 0
fi

mkdir -p "$state"/{spool,ctld,munge,log}
export SLURM_CONF=$conf

if [[ -f $state/slurmd.pid ]] && kill -0 "$(cat "$state/slurmd.pid")" 2>/dev/null && scontrol ping >/dev/null 2>&1; then
  echo "export SLURM_CONF=$conf"
  exit 0
fi
stop

# munge: a key of our own, a socket of our own.
if [[ ! -f $state/munge/munge.key ]]; then
  dd if=/dev/urandom of="$state/munge/munge.key" bs=1024 count=1 status=none
fi
chmod 700 "$state/munge"
chmod 400 "$state/munge/munge.key"
socket=$state/munge/munge.socket
munged --key-file="$state/munge/munge.key" --socket="$socket" --pid-file="$state/munged.pid" \
  --log-file="$state/log/munged.log" --seed-file="$state/munge/munge.seed" --force

cat >"$conf" <<CONF
ClusterName=wb-local
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmdSpoolDir=$state/spool
StateSaveLocation=$state/ctld
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
SlurmctldPort=${WB_SLURMCTLD_PORT:-16817}
SlurmdPort=${WB_SLURMD_PORT:-16818}
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
InactiveLimit=0
KillWait=5
MinJobAge=60
NodeName=$node CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF

slurmctld -f "$conf"
slurmd -f "$conf"
for _ in $(seq 1 30); do
  if scontrol ping 2>/dev/null | grep -q UP && sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
    echo "export SLURM_CONF=$conf"
    exit 0
  fi
  sleep 1
done
echo "slurm-local: the cluster did not come up; logs in $state/log" >&2
tail -n 20 "$state"/log/*.log >&2 || true
exit 1
