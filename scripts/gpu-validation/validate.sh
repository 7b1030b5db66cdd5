#!/bin/bash
# GPU validation of dsportal's slices on real NVIDIA GPUs (run on the `device` machine, see
# bench/results/gpu-validation.md): real Slurm 22.05 (Debian's, carried as .devcarry/debs), GRES on the
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

source $S/slurm-up.sh
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
