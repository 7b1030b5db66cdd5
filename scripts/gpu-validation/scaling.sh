#!/bin/bash
# Multi-GPU jobs through the portal's job path on real GPUs (run on the `device` machine, see
# bench/results/gpu-scaling.md): real Slurm (slurm-up.sh; SLURM_NODES=1+2: one node with every GPU
# and two with half each), Horovod 0.28.1 built with NCCL for the machine's PyTorch, Apptainer and an
# image of the machine's own userland (image.sh), then bench/gpu_scaling.py run: ResNet-50, Horovod
# and DDP (torchrun) on the GPUS asked for, each as the portal's rendered batch job and bare.
# Log and results in $OUT.
set -u
R=$PWD; C=$R/.devcarry; S=$R/scripts/gpu-validation; O=${OUT:-/tmp/out}; mkdir -p $O
export SLURM_NODES=${SLURM_NODES:-1+2}
IMG=/opt/img/torch MINI=/opt/img/mini VENV=/opt/torch/.venv
G=${GPUS:-1,2}; exec > >(tee $O/gpu-scaling-${SLURM_NODES/+/-}n-${G//,/-}${TAG:+-$TAG}.log) 2>&1
# JOBS: rendered jobs (bench/gpu_scaling.py render --out .devcarry/scaling/JOBS [--horovod-env ... --steps N]);
# HVD_ENV and STEPS must be the ones they were rendered with, for the bare runs.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "== machine"; nvidia-smi -L; python3 -V; which python3 nvcc mpirun mpicxx cmake; grep PRETTY /etc/os-release; nproc
PY=$(readlink -f "$(which python3)"); PYBIN=$(dirname "$(which python3)")
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'GPUs', torch.cuda.device_count())"

if [ "${SKIP_SETUP:-}" = 1 ] && [ -d /opt/hvd-site/horovod ] && [ -d $IMG ] && SLURM_CONF=/etc/slurm/slurm.conf /opt/sl/usr/bin/sinfo -h >/dev/null 2>&1; then
  echo "== Slurm and Horovod already set up on this machine (SKIP_SETUP=1)"
  export SLURM_CONF=/etc/slurm/slurm.conf PATH=/opt/sl/usr/bin:/opt/sl/usr/sbin:/usr/sbin:/usr/local/bin:$PATH
else
source $S/slurm-up.sh

echo "== the session environment the rendered jobs name (/opt/gpuenv)"
# wrappers, not links: a venv's python finds its packages only when started by its own path
mkdir -p /opt/gpuenv/bin
printf '#!/bin/sh\nexec %s "$@"\n' "$PYBIN/python3" > /opt/gpuenv/bin/python
printf '#!/bin/sh\nexec %s -m torch.distributed.run "$@"\n' "$PYBIN/python3" > /opt/gpuenv/bin/torchrun
chmod 755 /opt/gpuenv/bin/python /opt/gpuenv/bin/torchrun
runuser -u alice -- /opt/gpuenv/bin/python -c "import torch; print('alice: torch', torch.__version__, torch.cuda.device_count(), 'GPU(s)')"

if [ "${SKIP_HOROVOD:-}" != 1 ]; then
echo "== Horovod 0.28.1 with NCCL (issue 13's recipe)"
started=$(date +%s)
python3 -m pip install -q --no-index --no-deps $C/scaling/whl/cffi-*.whl $C/scaling/whl/pycparser-*.whl
mkdir -p /opt/hvd-site && python3 -m pip install -q --no-index --no-deps --target /opt/hvd-site $C/scaling/whl/cloudpickle-*.whl
NCCL_PKG=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])")
mkdir -p /opt/nccl/lib && ln -sfn $NCCL_PKG/include /opt/nccl/include
for f in $NCCL_PKG/lib/*; do ln -sf $f /opt/nccl/lib/; done; ln -sf /opt/nccl/lib/libnccl.so.2 /opt/nccl/lib/libnccl.so
ls -la /opt/nccl/lib /opt/nccl/include | head
work=$(mktemp -d); tar -xzf $C/scaling/horovod-0.28.1.tar.gz -C $work; src=$work/horovod-0.28.1
sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' $src/CMakeLists.txt $src/horovod/torch/CMakeLists.txt
(
  cd $src
  export CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)"
  export CXXFLAGS="-include cstdint -include string -include stdexcept -include limits -include memory -include functional -include algorithm"
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
  export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_BUILD_CUDA_CC_LIST=90 HOROVOD_NCCL_HOME=/opt/nccl
  export HOROVOD_CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(which nvcc)")")")
  python3 -m pip wheel -q --no-deps --no-build-isolation -w $work/wheel . 2>&1 | tail -30
)
python3 -m pip install -q --no-deps --target /opt/hvd-site $work/wheel/horovod-*.whl
chmod -R a+rX /opt/hvd-site
echo "Horovod build + install: $(( $(date +%s) - started )) s"
(cd /tmp && PYTHONPATH=/opt/hvd-site runuser -u alice -- env PYTHONPATH=/opt/hvd-site python3 -c "import horovod.torch as hvd; print('horovod', hvd.__version__ if hasattr(hvd, '__version__') else '', 'nccl', hvd.nccl_built(), 'mpi', hvd.mpi_built())")
fi

if [ "${SKIP_IMAGE:-}" != 1 ]; then
  echo "== Apptainer and the image the ranks run in ($IMG: this machine's userland, Horovod bound in)"
  source $S/image.sh
  apptainer_install
  host_image quick
  (cd /tmp && runuser -u alice -- env PYTHONPATH=/opt/hvd-site apptainer exec --contain --nv --bind /opt/hvd-site,/opt/nccl $IMG \
     $VENV/bin/python3 -c "import torch, horovod.torch as hvd; print('in the image, as alice:', torch.__version__, torch.cuda.device_count(), 'GPU(s), horovod nccl', hvd.nccl_built())")
fi

fi

echo "== the benchmark: portal job path vs bare"
mkdir -p /home/alice && chown alice: /home/alice
echo "srun's MPI plugins: $(srun --mpi=list 2>&1 | tr -s ' \n' ' ')"
(cd /tmp && runuser -u alice -- srun --mpi=pmix -p gpu -N 1 -n 1 -t 1 env 2>&1 | grep -E "^PMIX_(VERSION|RANK|SERVER_URI4|NAMESPACE)=|error" | head -n 6)
python3 $R/bench/gpu_scaling.py run --jobs $C/scaling/${JOBS:-jobs} --out $O --gpus ${GPUS:-1,2} --modes ${MODES:-hvd,ddp} \
  --horovod-env ${HVD_ENV:-} ${STEPS:+--steps $STEPS} ${TAG:+--tag $TAG}
cat /var/log/slurm/slurmctld.log /var/log/slurm/slurmd-*.log > $O/slurm-logs.txt 2>/dev/null
echo "== done"
