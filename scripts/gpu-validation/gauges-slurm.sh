#!/bin/bash
# The slice's gauges inside real Slurm jobs on a real GPU (issue 32; run on the `device` machine as
# root from the repo root, .devcarry carried: `prepare.sh debs` fills it).
#  1. Slurm 22.05 with the demo's confinement (CONFINE=1 through slurm-up.sh, apptainer.sh's fallbacks).
#  2. alice, a 1-GPU job (8 CPUs, 16 GB): portal.session.usage.sliceusage reads the job as the session's
#     server does (its cgroup from /proc/self/cgroup, its GPUs from Slurm's variables) once a second
#     while a bf16 matmul runs on the job's GPU in the same job.
#  3. bob, a CPU job on the same node (4 CPUs, 8 GB): the same reading shows no GPU, NVML unloaded.
# Log: $OUT/gpu-gauges-slurm.log.
set -u
R=$PWD; C=$R/.devcarry; S=$R/scripts/gpu-validation; O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/gpu-gauges-slurm.log) 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
SRC=/opt/dsportal-src   # outside /tmp: job_container/tmpfs hides the host's /tmp
PY=$(command -v python3)
T0=$SECONDS
source $S/jobs.sh  # step, state, wait_done, asuser, confined_slurm_up

step "machine"
nvidia-smi -L; uname -r; echo "python3: $PY ($($PY -V)); $($PY -c 'import torch, pynvml, prometheus_client; print("torch", torch.__version__)')"

step "1. Slurm with the demo's confinement, users alice and bob"
export SLURM_NODES=1
confined_slurm_up
cat /etc/slurm/cgroup.conf; echo "Slurm up with $CONFINED"
rm -rf $SRC && mkdir -p $SRC && cp -r $R/portal $SRC/ && chmod -R a+rX $SRC

cat > $SRC/read_gauges.py <<'PYEOF'
"""In the job: the session server's own reading of its slice, once a second; with --matmul a bf16
matrix product runs on the job's GPU in a child process of the same job from the third second."""
import json, os, subprocess, sys, time
from portal.session.usage import sliceusage

MATMUL = """
import time, torch
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); b = torch.randn_like(a)
hold = torch.empty(10 << 30, dtype=torch.uint8, device='cuda')  # 10 GiB held on the GPU
end = time.time() + 10; n = 0
while time.time() < end:
    for _ in range(50): c = a @ b
    torch.cuda.synchronize(); n += 50
print(f'matmuls {n} on', torch.cuda.get_device_name(0), 'of', torch.cuda.device_count(), 'visible', flush=True)
"""
usage = sliceusage.SliceUsage()
print("job", os.environ.get("SLURM_JOB_ID"), "CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"),
      "SLURM_JOB_GPUS", os.environ.get("SLURM_JOB_GPUS"), "memory cgroup", usage.memory_group, flush=True)
usage.cpu()
child, start = None, time.time()
for second in range(16 if "--matmul" in sys.argv else 3):
    if second == 2 and "--matmul" in sys.argv:
        child = subprocess.Popen([sys.executable, "-c", MATMUL])
    t0 = time.perf_counter()
    reading = usage.read()
    took = (time.perf_counter() - t0) * 1000
    print(json.dumps({"t_s": round(time.time() - start, 1), "matmul": child is not None and child.poll() is None,
                      "gpus": [{"index": g.index, "util_percent": g.utilization_percent,
                                "mem_used_gib": g.memory_used_bytes and round(g.memory_used_bytes / 2**30, 2),
                                "mem_total_gib": g.memory_total_bytes and round(g.memory_total_bytes / 2**30, 2),
                                "error": g.error} for g in reading.gpus],
                      "busy_gpus": sliceusage.busy_gpus(reading.gpus, 5),
                      "mem_used_gib": round(reading.memory.used_bytes / 2**30, 2),
                      "mem_limit_gib": round(reading.memory.limit_bytes / 2**30, 2), "mem_from": reading.memory.limit_from,
                      "cpu_used": reading.cpu.used_cores, "cores": reading.cpu.cores, "cores_from": reading.cpu.cores_from,
                      "read_ms": round(took, 1)}), flush=True)
    time.sleep(max(0, 1 - (time.perf_counter() - t0)))
if child:
    child.wait()
print("NVML loaded:", usage.nvml._ready is not None, flush=True)
PYEOF
chmod a+r $SRC/read_gauges.py

step "2. alice, a 1-GPU job (8 CPUs, 16 GB): the gauges while a matmul runs on its GPU"
gpu=$(asuser alice sbatch --parsable --gres=gpu:1 -c 8 --mem=16G -t 5 -o /home/alice/gauges-%j.out \
      --export=ALL,PYTHONPATH=$SRC --wrap "$PY -u $SRC/read_gauges.py --matmul")
echo "job $gpu: $(wait_done $gpu 120)"; cat /home/alice/gauges-$gpu.out

step "3. bob, a CPU job (4 CPUs, 8 GB) on the same node: no GPU"
cpu=$(asuser bob sbatch --parsable -c 4 --mem=8G -t 5 -o /home/bob/gauges-%j.out \
      --export=ALL,PYTHONPATH=$SRC --wrap "$PY -u $SRC/read_gauges.py")
echo "job $cpu: $(wait_done $cpu 60)"; cat /home/bob/gauges-$cpu.out
nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv
step "done"
