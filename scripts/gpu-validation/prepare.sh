#!/bin/bash
# Fills .devcarry/ (ignored by git) with what validate.sh needs on the GPU machine, which has no
# network: Debian bookworm's Slurm 22.05 + munge debs and the libraries they use, the Jupyter
# kernel stack as cp312 wheels, and the #SBATCH lines the portal renders for 1- and 2-GPU sessions.
set -eu
cd "$(dirname "$0")/../.."
# Horovod's tensor fusion and cycle time, tuned as its docs advise (docs/how-to/add-a-partition-profile.md)
HOROVOD_TUNED="HOROVOD_ENABLE_ASYNC_COMPLETION=1 HOROVOD_FUSION_THRESHOLD=33554432 HOROVOD_CYCLE_TIME=0.5"
mkdir -p .git/info && { grep -qx "/.devcarry/" .git/info/exclude 2>/dev/null || echo "/.devcarry/" >> .git/info/exclude; }
rm -rf .devcarry && mkdir -p .devcarry/debs .devcarry/whl
(cd .devcarry/debs && apt-get download libmunge2 munge libslurm38 slurm-client slurm-wlm-basic-plugins slurmctld slurmd \
   libhwloc15 libnuma1 libjson-c5 liblua5.1-0 libyaml-0-2 liblz4-1 libreadline8 libdbus-1-3 libsystemd0 libudev1 \
   libcap2 libgcrypt20 libgpg-error0 liblzma5 libzstd1 libtinfo6 \
   libpmix2 libevent-core-2.1-7 libevent-pthreads-2.1-7)  # PMIx 4, the one Slurm's mpi/pmix plugin was built for
[ "${1:-}" = debs ] && { du -sh .devcarry; exit 0; }  # isolation.sh needs only Slurm
if [ "${1:-}" = shares ]; then  # shares.sh: Slurm, NVML's Python binding for the gauges, a share's #SBATCH lines
  /opt/dsportal/env/bin/python -m pip download -q --no-deps -d .devcarry/whl nvidia-ml-py
  /opt/dsportal/env/bin/python - <<'PYEOF'
from portal.core import settings
from portal.core.rules import slice_for
from portal.core.templating import render
# no slurmdbd there; its one partition, gpu, holds the shares (slurm-up.sh SHARDS=4)
profile = settings.load("config/portal.yaml").profile("class-gpu").model_copy(update={"account": None, "partition": "gpu"})
chosen = slice_for(profile, None)
script = render("session.sbatch.j2", job_name="dsportal-student", partition=profile.partition, gpus=chosen.gpus,
                shares=chosen.shares, cpus=chosen.cpus, mem_mb=chosen.mem_mb, walltime="00:10:00",
                log_path="/dev/null", workdir="/tmp", profile=profile.model_dump(), environment="/opt/dsportal/env",
                command=["true"], catalog="", umask="077")
open(".devcarry/header-share.txt", "w").write(
    "\n".join(l for l in script.splitlines() if l.startswith("#SBATCH") and "--output" not in l and "--chdir" not in l) + "\n")
PYEOF
  cat .devcarry/header-share.txt; du -sh .devcarry; exit 0
fi
if [ "${1:-}" = apptainer ] || [ "${1:-}" = scaling ]; then  # apptainer.sh: also Apptainer's debs (install-apptainer.sh's cache), patchelf, the SIF tools
  mkdir -p .devcarry/apptainer .devcarry/tools
  cp "${DSPORTAL_APPTAINER_CACHE:-/var/cache/dsportal/apptainer}"/*.deb .devcarry/apptainer/
  (cd .devcarry/tools && apt-get download patchelf squashfs-tools squashfuse libsquashfuse0 libfuse3-3 fuse3 liblzo2-2)
fi
PY=/opt/dsportal/env/bin/python
$PY -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
   --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform any \
   -d .devcarry/whl nbclient ipykernel nbformat
# already in the GPU machine's Python
(cd .devcarry/whl && rm -f attrs-* packaging-* psutil-* pygments-* python_dateutil-* typing_extensions-* tzdata-*)
[ "${1:-}" = apptainer ] && { du -sh .devcarry; exit 0; }
[ "${1:-}" = scaling ] && rm -rf .devcarry/whl  # (only the kernel checks need those)
$PY - <<'PYEOF'
from portal.core import settings
from portal.core.templating import render
from portal.core.rules import slice_for
s = settings.load("config/portal.yaml")
for gpus in (1, 2):
    chosen = slice_for(s.profile("gpu"), gpus, None)
    script = render("session.sbatch.j2", job_name="dsportal-alice", partition=chosen.profile.partition,
                    gpus=chosen.gpus, cpus=chosen.cpus, mem_mb=chosen.mem_mb, walltime=chosen.walltime,
                    log_path="/home/alice/.dsportal/logs/session-%j.log", workdir="/home/alice",
                    profile=chosen.profile.model_dump(), environment="/opt/dsportal/env", command=["true"], catalog="",
                    umask="077")
    open(f".devcarry/header-{gpus}gpu.txt", "w").write(
        "\n".join(l for l in script.splitlines() if l.startswith("#SBATCH")) + "\n")
PYEOF
du -sh .devcarry

# For scaling.sh (issue 13): Horovod's sdist and what its build and import need, cp312; the
# portal's rendered batch jobs of bench/gpu_scaling.py.
mkdir -p .devcarry/scaling/whl
$PY -m pip download -q --no-deps --no-binary :all: -d .devcarry/scaling horovod==0.28.1
$PY -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64 \
   --platform manylinux2014_x86_64 --platform any -d .devcarry/scaling/whl cffi pycparser cloudpickle
# scaling.sh's defaults: Horovod's ranks started by srun --mpi=pmix, every rank in the machine's own
# userland as an Apptainer image (scaling.sh makes it), Horovod tuned as its docs advise.
$PY bench/gpu_scaling.py render --out .devcarry/scaling/jobs --image /opt/img/torch --apptainer /usr/local/bin/apptainer \
   --image-python /opt/torch/.venv/bin/python3 --steps 100 --horovod-env $HOROVOD_TUNED
du -sh .devcarry .devcarry/scaling
