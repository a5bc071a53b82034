#!/usr/bin/env bash
# A one-machine Slurm cluster for CI and for trying deploy/slurm/pushpull.sbatch: installs
# Debian's slurm-wlm and munge if missing, writes a munge key (0400, owned by munge) and a
# slurm.conf for this host (named from `hostname -s`, its CPUs and memory), and starts munged
# (as the munge user), slurmctld and slurmd as root. No cgroups: proctrack/linuxproc and
# task/none, so it runs in a container. Idempotent: a cluster already up is left as it is.
#
#   sudo deploy/slurm/one-machine.sh          # then: sinfo; sbatch --wait ...
#   sudo deploy/slurm/one-machine.sh --stop   # stops the daemons
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "one-machine.sh: needs root (it installs packages and starts daemons)" >&2
    exit 2
fi
if [ "${1:-}" = "--stop" ]; then
    pkill -x slurmd || true
    pkill -x slurmctld || true
    pkill -x munged || true
    exit 0
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    echo "== installing slurm-wlm and munge"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi

host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)

# munge: its key readable by munge only; munged runs as munge.
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! pgrep -x munged >/dev/null; then
    runuser -u munge -- /usr/sbin/munged
fi

install -d -m 0755 /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > /etc/slurm/slurm.conf <<CONF
# Written by pushpull's deploy/slurm/one-machine.sh: one node, no cgroups, no accounting.
ClusterName=pushpull
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=5
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=main Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF

if ! pgrep -x slurmctld >/dev/null; then
    slurmctld
fi
if ! pgrep -x slurmd >/dev/null; then
    slurmd
fi
for _ in $(seq 60); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
        echo "== slurm: $(sinfo -h -o '%N %T %c CPUs')"
        exit 0
    fi
    sleep 1
done
echo "one-machine.sh: the node did not become idle in 60 s:" >&2
sinfo >&2 || true
tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
exit 1
