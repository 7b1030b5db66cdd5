# Sourced by validate.sh and scaling.sh on the GPU machine (root): Debian bookworm's Slurm 22.05 and
# munge from .devcarry/debs, one node "gpunode1" with GRES on the real /dev/nvidiaN, the user alice.
# Expects $C (the carried folder); leaves SLURM_CONF and PATH exported and $NGPU set.
NGPU=$(ls /dev | grep -cE '^nvidia[0-9]+$')
# SLURM_NODES=2 splits the host into two Slurm nodes (two slurmd, as the demo cluster does), the GPUs halved.
# SLURM_NODES=1+2: both at once, for jobs run one after another: partition gpu is gpunode1 with every
# GPU, partition gpu2 is gpunode2 and gpunode3 with half of them each (the same devices again).
NODES=${SLURM_NODES:-1}
# SHARDS=4: each GPU also gives 4 shares (Slurm's shard GRES, on the same devices: Slurm 22.05 refuses
# shards on a GPU that is not also a "gpu"), as the demo declares.
SHARDS=${SHARDS:-0}
[ "$NODES" = 1+2 ] && [ "$NGPU" -lt 2 ] && NODES=1   # (one GPU cannot be halved)
# (The nodes of gpu and gpu2 are the same GPUs, CPUs and memory counted twice: jobs run one at a time.)
if [ "$NODES" = 1+2 ]; then
  NODES=3; PER=$((NGPU / 2)); GPUS_OF=(- "$NGPU" "$PER" "$PER"); FIRST_OF=(- 0 0 "$PER")
  PARTITIONS="PartitionName=gpu Nodes=gpunode1 Default=YES MaxTime=12:00:00 State=UP
PartitionName=gpu2 Nodes=gpunode[2-3] MaxTime=12:00:00 State=UP"
else
  PER=$((NGPU / NODES)); GPUS_OF=(-); FIRST_OF=(-)
  for n in $(seq $NODES); do GPUS_OF+=("$PER"); FIRST_OF+=($(( (n - 1) * PER ))); done
  PARTITIONS="PartitionName=gpu Nodes=gpunode[1-$NODES] Default=YES MaxTime=12:00:00 State=UP"
fi
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
GresTypes=gpu$([ "$SHARDS" -gt 0 ] && echo ,shard)
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
# Each node's slurmd reads this file plus its own TmpFS (below): no warning for that.
DebugFlags=NO_CONF_HASH
SchedulerParameters=bf_interval=5
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
$(for n in $(seq $NODES); do echo "NodeName=gpunode$n NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((17000 + n)) CPUs=$(( $(nproc) * GPUS_OF[n] / NGPU )) RealMemory=$((200000 * GPUS_OF[n] / NGPU)) Gres=gpu:${GPUS_OF[n]}$([ "$SHARDS" -gt 0 ] && echo ",shard:$((GPUS_OF[n] * SHARDS))") State=UNKNOWN"; done)
$PARTITIONS
TaskProlog=/etc/slurm/taskprolog.sh
CONF
# Test harness only: Slurm numbers a node's GPUs from 0, which on separate hosts are that host's own;
# here the Slurm nodes share one host, so node N's GPU k is the host's GPU FIRST_OF[N]+k.
cat > /etc/slurm/taskprolog.sh <<PROLOG
#!/bin/sh
case \$SLURMD_NODENAME in
$(for n in $(seq $NODES); do echo "  gpunode$n) o=${FIRST_OF[n]};;"; done)
  *) o=0;;
esac
if [ -n "\${CUDA_VISIBLE_DEVICES:-}" ] && [ "\$o" -gt 0 ]; then
  echo "export CUDA_VISIBLE_DEVICES=\$(echo "\$CUDA_VISIBLE_DEVICES" | awk -F, -v o=\$o '{for (i = 1; i <= NF; i++) printf "%s%d", (i > 1 ? "," : ""), \$i + o}')"
fi
PROLOG
chmod 755 /etc/slurm/taskprolog.sh
for n in $(seq $NODES); do
  echo "NodeName=gpunode$n Name=gpu File=/dev/nvidia[${FIRST_OF[n]}-$(( FIRST_OF[n] + GPUS_OF[n] - 1 ))]"
  [ "$SHARDS" -gt 0 ] && echo "NodeName=gpunode$n Name=shard Count=$((GPUS_OF[n] * SHARDS)) File=/dev/nvidia[${FIRST_OF[n]}-$(( FIRST_OF[n] + GPUS_OF[n] - 1 ))]"
done > /etc/slurm/gres.conf
for n in $(seq 2 $NODES); do grep -q gpunode$n /etc/hosts || echo "127.0.0.1 gpunode$n" >> /etc/hosts; done
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
# Each node's own TmpFS, as the demo's nodes have (democluster/slurmdaemons.py): Slurm's PMIx
# plugin keeps a folder per step there (spmix_appdir_<uid>_<job>.<step>), which a job's second node
# on the same host would find taken in a shared /tmp. Ranks' containers bind /opt/nodes.
for n in $(seq $NODES); do
  mkdir -p /etc/slurm/gpunode$n /opt/nodes/gpunode$n/tmp && chmod 1777 /opt/nodes/gpunode$n/tmp && chmod 755 /opt/nodes
  { cat /etc/slurm/slurm.conf; echo "TmpFS=/opt/nodes/gpunode$n/tmp"; } > /etc/slurm/gpunode$n/slurm.conf
  for f in gres.conf cgroup.conf job_container.conf; do ln -sf /etc/slurm/$f /etc/slurm/gpunode$n/$f; done
done
# Slurm's mpi/pmix plugin loads the PMIx of /usr/lib/x86_64-linux-gnu/pmix2 and refuses any but the
# major version it was built for (4: Debian bookworm's). Where the machine's own is another, slurmd
# runs in a mount namespace of its own that sees the carried PMIx 4 there; jobs' containers keep
# their image's, whose clients talk to that server.
PMIX=/usr/lib/x86_64-linux-gnu/pmix2; RUN_SLURMD=(exec)
if [ -d /opt/sl$PMIX ]; then
  mkdir -p $PMIX
  # the names the plugin and the loader look for (made by ldconfig and libpmix-dev where installed)
  for name in libpmix.so libpmix.so.2; do ln -sf $(basename /opt/sl$PMIX/lib/libpmix.so.2.*) /opt/sl$PMIX/lib/$name; done
  RUN_SLURMD=(exec unshare -m --propagation private sh -c "mount --bind /opt/sl$PMIX $PMIX && exec \"\$@\"" slurmd-in-ns)
  echo "PMIx for slurmd: bookworm's $(ls /opt/sl$PMIX/lib | grep -o 'libpmix.so.[0-9.]*' | sort | tail -n 1) (this machine's: $(ls $PMIX/lib 2>/dev/null | grep -o 'libpmix.so.[0-9.]*' | sort | tail -n 1 || echo none))"
fi
for n in $(seq $NODES); do (echo $BASHPID > /sys/fs/cgroup/system.slice/slurmd.service/cgroup.procs; "${RUN_SLURMD[@]}" slurmd -f /etc/slurm/gpunode$n/slurm.conf -N gpunode$n); done
sleep 1
# slurmd enables in its stepd scope only what it found there; the job cgroups below need memory.
for f in /sys/fs/cgroup/system.slice/*_slurmstepd.scope/cgroup.subtree_control; do echo "+cpuset +cpu +memory" > $f; done
for f in /sys/fs/cgroup/system.slice/cgroup.subtree_control /sys/fs/cgroup/system.slice/*/cgroup.subtree_control; do echo "$f: $(cat $f)"; done
for i in $(seq 30); do [ "$(sinfo -h -N -o %T | grep -cE "idle|mix")" = "$NODES" ] && break; sleep 1; done
sinfo -N -o "%N %T %c %m %G"
sinfo -h -N -o %T | grep -qE "idle|mix" || { for f in /var/log/slurm/*.log; do tail -n 30 $f; done; exit 1; }

echo "== the user"
id alice 2>/dev/null || useradd -m -s /bin/bash alice
