# Sourced by validate.sh and scaling.sh on the GPU machine (root): Debian bookworm's Slurm 22.05 and
# munge from .devcarry/debs, one node "gpunode1" with GRES on the real /dev/nvidiaN, the user alice.
# Expects $C (the carried folder); leaves SLURM_CONF and PATH exported and $NGPU set.
NGPU=$(ls /dev | grep -cE '^nvidia[0-9]+$')
# SLURM_NODES=2 splits the host into two Slurm nodes (two slurmd, as the demo cluster does), the GPUs halved.
NODES=${SLURM_NODES:-1}; PER=$((NGPU / NODES))
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
# CONFINE=1: the confinement the demo cluster uses (slurm.conf, cgroup.conf, job_container.conf of
# config/demo): a job's processes, GPUs and memory are its own, /tmp and /dev/shm too.
PROCTRACK=proctrack/linuxproc TASKPLUGIN=task/none JOBCONTAINER="" CONFINEMENT=""
if [ "${CONFINE:-0}" = 1 ]; then
  PROCTRACK=proctrack/cgroup TASKPLUGIN=task/cgroup JOBCONTAINER=$'JobContainerType=job_container/tmpfs\nPrologFlags=Contain'
  [ "${JOB_CONTAINER:-yes}" = no ] && JOBCONTAINER=""
  CONFINEMENT=$'ConstrainDevices=yes\n'
  # CONSTRAIN_RAM=no: this VM's cgroup v2 (no systemd) gave slurmstepd no memory controller.
  [ "${CONSTRAIN_RAM:-yes}" = yes ] && CONFINEMENT+=$'ConstrainRAMSpace=yes\nAllowedRAMSpace=100\n'
  # (No ConstrainSwapSpace: the VM has no swap, and slurmd refuses it there.)
fi
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
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmdPidFile=/var/run/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
ProctrackType=$PROCTRACK
TaskPlugin=$TASKPLUGIN
$JOBCONTAINER
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerParameters=bf_interval=5
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
$(for n in $(seq $NODES); do echo "NodeName=gpunode$n NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((17000 + n)) CPUs=$(( $(nproc) / NODES )) RealMemory=$((200000 / NODES)) Gres=gpu:$PER State=UNKNOWN"; done)
PartitionName=gpu Nodes=gpunode[1-$NODES] Default=YES MaxTime=12:00:00 State=UP
TaskProlog=/etc/slurm/taskprolog.sh
CONF
# Test harness only: Slurm numbers a node's GPUs from 0, which on separate hosts are that host's own;
# here the Slurm nodes share one host, so node N's GPU k is the host's GPU (N-1)*PER+k.
cat > /etc/slurm/taskprolog.sh <<PROLOG
#!/bin/sh
n=\${SLURMD_NODENAME#gpunode}
if [ -n "\${CUDA_VISIBLE_DEVICES:-}" ] && [ "\$n" -gt 1 ] 2>/dev/null; then
  echo "export CUDA_VISIBLE_DEVICES=\$(echo "\$CUDA_VISIBLE_DEVICES" | awk -F, -v o=\$(( (n - 1) * $PER )) '{for (i = 1; i <= NF; i++) printf "%s%d", (i > 1 ? "," : ""), \$i + o}')"
fi
PROLOG
chmod 755 /etc/slurm/taskprolog.sh
for n in $(seq $NODES); do echo "NodeName=gpunode$n Name=gpu File=/dev/nvidia[$(( (n - 1) * PER ))-$(( n * PER - 1 ))]"; done > /etc/slurm/gres.conf
grep -q gpunode2 /etc/hosts || echo "127.0.0.1 gpunode2" >> /etc/hosts
# Firecracker VM: cgroup v2 without systemd/dbus; slurmd makes its scope itself
printf 'CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n%s' "$CONFINEMENT" > /etc/slurm/cgroup.conf
{ echo "AutoBasePath=true"; for n in $(seq $NODES); do echo "NodeName=gpunode$n BasePath=/var/spool/slurmd/jobtmp/gpunode$n"; done; } > /etc/slurm/job_container.conf
echo "+cpuset +cpu +memory" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || echo "(could not enable cgroup controllers)"
mkdir -p /sys/fs/cgroup/system.slice && echo "+cpuset +cpu +memory" > /sys/fs/cgroup/system.slice/cgroup.subtree_control 2>/dev/null
export SLURM_CONF=/etc/slurm/slurm.conf
pkill -x slurmd; pkill -x slurmctld; sleep 1; rm -rf /var/spool/slurmctld/* /var/log/slurm/*
mkdir -p $(for n in $(seq $NODES); do echo /var/spool/slurmd/gpunode$n; done)
# slurmd starts in a cgroup of its own under system.slice, whose controllers (memory for
# task/cgroup) its job cgroups then inherit; the runner's cgroup does not delegate them.
mkdir -p /sys/fs/cgroup/system.slice/slurmd.service
slurmctld -c -i; sleep 2
for n in $(seq $NODES); do (echo $BASHPID > /sys/fs/cgroup/system.slice/slurmd.service/cgroup.procs; exec slurmd -N gpunode$n); done
sleep 1
# slurmd enables in its stepd scope only what it found there; the job cgroups below need memory.
for f in /sys/fs/cgroup/system.slice/*_slurmstepd.scope/cgroup.subtree_control; do echo "+cpuset +cpu +memory" > $f; done
for f in /sys/fs/cgroup/system.slice/cgroup.subtree_control /sys/fs/cgroup/system.slice/*/cgroup.subtree_control; do echo "$f: $(cat $f)"; done
for i in $(seq 30); do [ "$(sinfo -h -N -o %T | grep -cE "idle|mix")" = "$NODES" ] && break; sleep 1; done
sinfo -N -o "%N %T %c %m %G"
sinfo -h -N -o %T | grep -qE "idle|mix" || { for f in /var/log/slurm/*.log; do tail -n 30 $f; done; exit 1; }

echo "== the user"
id alice 2>/dev/null || useradd -m -s /bin/bash alice
