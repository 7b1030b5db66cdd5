#!/bin/bash
# GPU validation of dsportal's slices on real NVIDIA GPUs (run on the `device` machine, see
# docs/gpu-validation.md): real Slurm 22.05 (Debian's, carried as .devcarry/debs), GRES on the
# real /dev/nvidiaN, session jobs with the portal's own #SBATCH lines, as a user; the
# digits-pytorch template run through a Jupyter kernel inside each job.
set -u
R=$PWD; C=$R/.devcarry; S=$R/scripts/gpu-validation; O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/gpu-validate.log) 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "== machine"; nvidia-smi -L; python3 -V; which python3; grep PRETTY /etc/os-release; nproc; ls /dev/nvidia*
NGPU=$(ls /dev | grep -cE '^nvidia[0-9]+$')
echo "GPU device files: $NGPU"

echo "== user-side python packages (carried wheels)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $C/whl/*.whl || exit 1
chmod -R a+rX /tmp/site

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
mkdir -p /home/alice/.dsportal/logs && cp $R/notebooks/digits-pytorch.ipynb $S/run_nb.py /home/alice/ && chown -R alice: /home/alice
AS="runuser -u alice --"
$AS env PYTHONPATH=/tmp/site python3 -c "import torch, nbclient, ipykernel; print('alice imports torch', torch.__version__, 'cuda', torch.cuda.is_available())" || AS=""

job() {  # $1: header file; the body runs as the user inside the slice
  { echo "#!/bin/bash"; cat $C/header-$1gpu.txt; cat <<'BODY'
unset LD_LIBRARY_PATH
export PYTHONPATH=/tmp/site
echo "job $SLURM_JOB_ID on $SLURMD_NODENAME: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES SLURM_JOB_GPUS=${SLURM_JOB_GPUS:-} cpus=$SLURM_CPUS_PER_TASK mem=$SLURM_MEM_PER_NODE"
for i in ${CUDA_VISIBLE_DEVICES//,/ }; do nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader -i $i; done
python3 -c "
import torch
print('torch sees', torch.cuda.device_count(), 'GPU(s):', [(torch.cuda.get_device_name(i), str(torch.cuda.get_device_properties(i).uuid)) for i in range(torch.cuda.device_count())])
x = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); torch.cuda.synchronize()
import time; t = time.time(); [x @ x for _ in range(20)]; torch.cuda.synchronize(); print(f'bf16 matmul {20 * 2 * 8192**3 / (time.time() - t) / 1e12:.0f} TFLOP/s on its GPU')
"
mkdir -p run-$SLURM_JOB_ID && cd run-$SLURM_JOB_ID && cp ../digits-pytorch.ipynb . && python3 ../run_nb.py digits-pytorch.ipynb
BODY
  } > /home/alice/job-$1gpu.sbatch
  chown alice: /home/alice/job-$1gpu.sbatch
  (cd /home/alice && $AS env SLURM_CONF=$SLURM_CONF PATH=$PATH sbatch --parsable job-$1gpu.sbatch)
}

echo "== three 1-GPU sessions on a node of $NGPU GPUs"
A=$(job 1); B=$(job 1); Cj=$(job 1); sleep 5
squeue -o "%i %u %T %r %b" ; scontrol show job $Cj | grep -E "JobState|Reason" | head -2
wait_done() { for i in $(seq 150); do squeue -h -t PD,R,CG,CF,S -j $1 2>/dev/null | grep -q . || return 0; sleep 2; done; echo "job $1 still not done"; }
wait_done $A; wait_done $B; wait_done $Cj
D=$(job 2); wait_done $D
for j in $A $B $Cj $D; do echo "---- session-$j.log"; cat /home/alice/.dsportal/logs/session-$j.log | grep -v "^\s*$" | grep -v "precision\|macro avg\|weighted avg\|^ *[0-9] *0\.[0-9]" ; done
sacct >/dev/null 2>&1; for j in $A $B $Cj $D; do scontrol show job $j | grep -E "JobId|JobState|RunTime|TRES=" | tr '\n' ' '; echo; done
cp /var/log/slurm/*.log $O/ 2>/dev/null
echo "== done"
