# Sourced by validate.sh and scaling.sh on the GPU machine (root): Debian bookworm's Slurm 22.05 and
# munge from .devcarry/debs, one node "gpunode1" with GRES on the real /dev/nvidiaN, the user alice.
# Expects $C (the carried folder); leaves SLURM_CONF and PATH exported and $NGPU set.
NGPU=$(ls /dev | grep -cE '^nvidia[0-9]+$')
echo "== Slurm + munge from Debian bookworm debs"
mkdir -p /opt/sl && for f in $C/debs/*.deb; do dpkg -x $f /opt/sl; done
mkdir -p /opt/sl/private
for so in /opt/sl/usr/lib/x86_64-linux-gnu/*.so.* /opt/sl/lib/x86_64-linux-gnu/*.so.*; do
  [ -e "$so" ] || continue; n=$(basename $so)
  ldconfig -p | grep -qP "^\t$n " || cp -a $so /opt/sl/private/
done
echo /opt/sl/private > /etc/ld.so.conf.d/zz-dsportal-slurm.conf; ldconfig
echo "private libs: $(ls /opt/sl/private | tr '\n' ' ')"
for b in slurmd slurmstepd slurmctld; do ln -sf /opt/sl/usr/sbin/$b-wlm /usr/sbin/$b; done
ln -sfn /opt/sl/usr/lib/x86_64-linux-gnu/slurm-wlm /usr/lib/x86_64-linux-gnu/slurm-wlm
export PATH=/opt/sl/usr/bin:/opt/sl/usr/sbin:/usr/sbin:$PATH
for b in /usr/sbin/slurmd /usr/sbin/slurmctld /opt/sl/usr/bin/sbatch; do ldd $b | grep "not found"; done
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge && chmod 700 /etc/munge /var/lib/munge /var/log/munge && chmod 755 /run/munge
dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; chmod 400 /etc/munge/munge.key
/opt/sl/usr/sbin/munged --force || { echo "munged failed"; cat /var/log/munge/munged.log; exit 1; }
HOST=$(hostname); grep -q gpunode1 /etc/hosts || echo "127.0.0.1 gpunode1" >> /etc/hosts
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=gpuval
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
PluginDir=/opt/sl/usr/lib/x86_64-linux-gnu/slurm-wlm
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerParameters=bf_interval=5
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
NodeName=gpunode1 NodeHostname=$HOST NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=200000 Gres=gpu:$NGPU State=UNKNOWN
PartitionName=gpu Nodes=gpunode1 Default=YES MaxTime=12:00:00 State=UP
CONF
echo "NodeName=gpunode1 Name=gpu File=/dev/nvidia[0-$((NGPU-1))]" > /etc/slurm/gres.conf
# Firecracker VM: cgroup v2 without systemd/dbus; slurmd makes its scope itself
printf 'CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n' > /etc/slurm/cgroup.conf
echo "+cpuset +cpu +memory" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || echo "(could not enable cgroup controllers)"
mkdir -p /sys/fs/cgroup/system.slice && echo "+cpuset +cpu +memory" > /sys/fs/cgroup/system.slice/cgroup.subtree_control 2>/dev/null
export SLURM_CONF=/etc/slurm/slurm.conf
pkill -x slurmd; pkill -x slurmctld; sleep 1; rm -rf /var/spool/slurmctld/* /var/log/slurm/*
slurmctld -c -i; sleep 2; slurmd -N gpunode1
for i in $(seq 30); do sinfo -h -N -o %T | grep -qE "idle|mix" && break; sleep 1; done
sinfo -N -o "%N %T %c %m %G"
sinfo -h -N -o %T | grep -qE "idle|mix" || { for f in /var/log/slurm/*.log; do tail -n 30 $f; done; exit 1; }

echo "== the user"
id alice 2>/dev/null || useradd -m -s /bin/bash alice
