#!/bin/bash
# Apptainer --nv on a real GPU, inside Slurm jobs with the demo's confinement (issue 30; run on the
# `device` machine as root from the repo root, .devcarry carried: `prepare.sh apptainer` fills it).
#  1. Apptainer 1.4.5 from the carried .debs through scripts/install-apptainer.sh (relocated, no setuid).
#  2. Slurm 22.05 with CONFINE=1 (slurm-up.sh; isolation.sh's fallbacks), users alice and bob.
#  3. An image with CUDA PyTorch: the machine's own userland as hard links (no registry can be
#     reached), without /usr/local/nvidia (the driver must come in through --nv), made a sandbox.
#  4. alice, 1-GPU job: nvidia-smi, torch and a bf16 matmul in the container; exec times; a kernel
#     started from the kernelspec portal.session.kernel.specs writes, a notebook cell run through it.
#  5. bob, CPU-only job on the same node, the same command: no GPU.
#  6. A SIF of a small sandbox, exec'd by alice.
# Log: $OUT/gpu-apptainer.log.
set -u
R=$PWD; C=$R/.devcarry; S=$R/scripts/gpu-validation; O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/gpu-apptainer.log) 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
IMG=/opt/img/torch MINI=/opt/img/mini VENV=/opt/torch/.venv
KERNEL_SITE=/opt/kernelhost-site SRC=/opt/dsportal-src   # outside /tmp: job_container/tmpfs hides the host's /tmp
T0=$SECONDS
source $S/image.sh; source $S/jobs.sh  # step, state, wait_done, asuser, confined_slurm_up

step "machine"
nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; uname -r; grep PRETTY /etc/os-release
PY=$(command -v python3); echo "python3: $PY -> $(readlink -f $PY); $($PY -V)"; grep home $VENV/pyvenv.cfg
ls -l /dev/fuse /dev/nvidia* 2>&1; df -h / /opt /tmp | uniq
for tool in dpkg-deb patchelf mksquashfs squashfuse squashfuse_ll fusermount3 ldconfig nvidia-smi; do echo "$tool: $(command -v $tool || echo -)"; done
sysctl user.max_user_namespaces kernel.apparmor_restrict_unprivileged_userns 2>&1
HOST_UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n 1); echo "host GPU UUID: $HOST_UUID"

step "1. Apptainer from the carried debs (scripts/install-apptainer.sh)"
apptainer_install

step "3. the image: this machine's userland as hard links, without /usr/local/nvidia"
host_image
SITE=$($PY -c 'import site; print(site.getsitepackages()[0])')
t=$SECONDS
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $IMG$SITE $C/whl/*.whl 2>&1 | grep -v "already exists" | tail -n 3
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $KERNEL_SITE $C/whl/*.whl 2>&1 | tail -n 3
mkdir -p $SRC && cp -a $R/portal $SRC/ && chmod -R a+rX $KERNEL_SITE $SRC $IMG$SITE
echo "ipykernel wheels into the image's $SITE and the host side's $KERNEL_SITE in $((SECONDS - t)) s"
# --userns: root here lacks a capability (checkpoint_restore) that Apptainer asks for as root without it
apptainer exec --userns --containall $IMG $VENV/bin/python3 -c 'import ipykernel, zmq, torch; print("as root in the image: ipykernel", ipykernel.__version__, "pyzmq", zmq.__version__, "torch", torch.__version__)'

step "2. Slurm with the demo's confinement (CONFINE=1), users alice and bob"
export SLURM_NODES=1
confined_slurm_up
grep -E "Proctrack|TaskPlugin|JobContainer" /etc/slurm/slurm.conf; cat /etc/slurm/cgroup.conf; echo
mount -o remount,hidepid=invisible /proc && echo "/proc: hidepid=invisible"
# alice outside Slurm first: a failure here is Apptainer's (user namespaces, /proc), not the job's.
asuser alice apptainer exec --containall $IMG id || {
  echo "alice's apptainer exec failed with hidepid=invisible: again with hidepid=0"; mount -o remount,hidepid=0 /proc
  asuser alice apptainer exec --containall $IMG id; }
echo "Slurm up with $CONFINED"

step "4. alice, a 1-GPU job: apptainer exec --containall --nv --bind /tmp:/tmp"
cat > /usr/local/share/dsportal-run-kernel.py <<'PYEOF'
"""Runs one notebook cell through a kernelspec, as a session's Jupyter server would: jupyter_client
starts the kernel from the kernelspec's argv and env, its channels on unix sockets in the session's
runtime folder named as portal.session.kernel.kernelsockets names them (k + 8 hex digits of the kernel id;
that module needs jupyter_server, not carried), and nbclient executes the cell."""
import datetime, os, sys, time, uuid
import nbformat
from nbclient import NotebookClient
from traitlets.config import Config

kernel_name, runtime_dir = sys.argv[1], sys.argv[2]
kernel_id = str(uuid.uuid4())
ipc = Config({"KernelManager": {"transport": "ipc", "connection_file": os.path.join(runtime_dir, f"kernel-{kernel_id}.json"),
                                "ip": os.path.join(runtime_dir, "k" + kernel_id.replace("-", "")[:8])}})
cell = '''import os, socket, torch
print("in the container:", os.path.isdir("/.singularity.d"), "| uid", os.getuid(), "| /usr/local/nvidia there:", os.path.exists("/usr/local/nvidia"))
print("env: CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"), "| SLURM_JOB_ID", os.environ.get("SLURM_JOB_ID"), "| JUPYTER_RUNTIME_DIR", os.environ.get("JUPYTER_RUNTIME_DIR"))
print("torch", torch.__version__, "| cuda", torch.cuda.is_available(), "| device_count", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print("device", i, p.name, "uuid", p.uuid, p.total_memory // 2**30, "GiB", p.multi_processor_count, "SMs")
x = torch.randn(4096, 4096, device="cuda")
print("4096^2 fp32 matmul on it, finite:", bool(torch.isfinite((x @ x).sum())))
print("environment the kernel got:", sorted(os.environ))
print("the session's runtime folder:", sorted(os.listdir(os.environ["JUPYTER_RUNTIME_DIR"])))
'''
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
started = datetime.datetime.now(datetime.timezone.utc)
client = NotebookClient(nb, kernel_name=kernel_name, config=ipc, timeout=300, startup_timeout=180,
                        resources={"metadata": {"path": os.path.expanduser("~")}})
ok = True
try:
    client.execute()  # starts the kernel, runs the cell, shuts the kernel down
except Exception as error:
    ok = False
    print("NOTEBOOK ERROR:", (str(error).strip().splitlines() or [type(error).__name__])[-1])
ended = datetime.datetime.now(datetime.timezone.utc)
for out in nb.cells[0].get("outputs", []):
    sys.stdout.write(out["text"] if out.get("output_type") == "stream" else f"{out.get('ename')}: {out.get('evalue')}\n")
timing = nb.cells[0].metadata.get("execution", {})
busy = timing.get("iopub.status.busy")
if busy:
    to_first = datetime.datetime.fromisoformat(busy.replace("Z", "+00:00")) - started
    print(f"kernel start to the cell's first message: {to_first.total_seconds():.1f} s")
print(f"NOTEBOOK {'PASSED' if ok else 'FAILED'} in {(ended - started).total_seconds():.1f} s (start, cell, shutdown)")
PYEOF
chmod 644 /usr/local/share/dsportal-run-kernel.py
{ echo "#!/bin/bash"; echo "IMG=$IMG VENV=$VENV KERNEL_SITE=$KERNEL_SITE SRC=$SRC HOST_UUID=$HOST_UUID"; cat <<'JOB'
A="apptainer exec --containall --nv --bind /tmp:/tmp"
echo "job $SLURM_JOB_ID on $SLURMD_NODENAME as $(id -un): CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; the job (host side) sees: $(nvidia-smi -L)"
export APPTAINERENV_CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES
TIMEFORMAT=%R
for i in 1 2 3 4; do echo "TIME '$A IMG true' #$i: $( { time $A $IMG true; } 2>&1 | tail -n 1) s"; done
echo "TIME the same without --nv: $( { time apptainer exec --containall --bind /tmp:/tmp $IMG true; } 2>&1 | tail -n 1) s"
echo "-- what of the driver the container has, with --nv: $($A $IMG sh -c 'echo $(find /usr/local/nvidia 2>&1 | head -n 8); echo "| binds onto /.singularity.d/libs:" $(grep -c " /.singularity.d/libs/" /proc/self/mountinfo) "| under /usr/local/nvidia:" $(grep -c " /usr/local/nvidia" /proc/self/mountinfo)')"
echo "   without --nv: $(apptainer exec --containall --bind /tmp:/tmp $IMG sh -c 'ls /usr/local/nvidia 2>&1; ls /.singularity.d/libs | wc -l') (files in /.singularity.d/libs)"
echo "-- nvidia-smi -L in the container:"; $A $IMG nvidia-smi -L || { echo "rc=$?; apptainer -d:"; apptainer -d exec --containall --nv --bind /tmp:/tmp $IMG nvidia-smi -L 2>&1 | grep -iE "nv|error|warn" | tail -n 25; }
echo "-- without APPTAINERENV_ (--containall passes nothing): CUDA_VISIBLE_DEVICES=$(env -u APPTAINERENV_CUDA_VISIBLE_DEVICES $A $IMG $VENV/bin/python3 -c 'import os; print(os.environ.get("CUDA_VISIBLE_DEVICES"))')"
echo "-- torch in the container:"
$A $IMG $VENV/bin/python3 - <<'EOF'
import os, time, torch
print("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"), "| LD_LIBRARY_PATH", os.environ.get("LD_LIBRARY_PATH"), "| /usr/local/nvidia there:", os.path.exists("/usr/local/nvidia"))
print("/.singularity.d/libs:", len(os.listdir("/.singularity.d/libs")), "files, e.g.", sorted(os.listdir("/.singularity.d/libs"))[:5])
n = torch.cuda.device_count()
print("torch", torch.__version__, "device_count", n, [(torch.cuda.get_device_name(i), str(torch.cuda.get_device_properties(i).uuid)) for i in range(n)])
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); torch.cuda.synchronize()
def rate(count):
    t = time.time(); [x @ x for _ in range(count)]; torch.cuda.synchronize()
    return count * 2 * 8192**3 / (time.time() - t) / 1e12
first = rate(20); warmed = rate(50)
print(f"bf16 8192^3 matmul: {first:.0f} TFLOP/s the first 20 (unwarmed), {warmed:.0f} TFLOP/s the next 50")
EOF
echo "-- a kernel as the portal starts it"
export PYTHONPATH=$KERNEL_SITE:$SRC
runtime=$(mktemp -d /tmp/dsportal-$(id -un)-$SLURM_JOB_ID-XXXXXXXXXX)/runtime; mkdir -m 700 $runtime
dest=$HOME/.dsportal/kernels-$SLURM_JOB_ID
catalog='{"images": [{"name": "torch", "display_name": "PyTorch (the GPU machine'"'"'s userland)", "source": "local: hard links of /usr /etc /opt/torch", "path": "'$IMG'", "runtime": "apptainer", "runtime_binary": null, "python": "'$VENV'/bin/python3", "profiles": [], "packages": [], "wheels": []}], "data_mounts": []}'
python3 -m portal.session.kernel.specs --dest $dest --catalog "$catalog" --runtime-dir $runtime
cat $dest/kernels/dsportal-torch/kernel.json
JUPYTER_PATH=$dest JUPYTER_RUNTIME_DIR=$runtime python3 /usr/local/share/dsportal-run-kernel.py dsportal-torch $runtime
echo "runtime folder after the kernel's shutdown: $(ls -A $runtime | tr '\n' ' ')"
JOB
} > /home/alice/gpu-job.sh
chmod 755 /home/alice/gpu-job.sh
a=$(asuser alice sbatch --parsable --gres=gpu:1 -c 4 --mem=16G -t 10 -o /home/alice/a-%j.out /home/alice/gpu-job.sh)
echo "alice's job $a: $(wait_done $a 300)"; scontrol show job $a | grep -oE "(RunTime|TRES)=[^ ]*" | tr '\n' ' '; echo
sed 's/^/  | /' /home/alice/a-$a.out

step "5. bob, a CPU-only job (no --gres) on the same node, the same apptainer --nv command"
{ echo "#!/bin/bash"; echo "IMG=$IMG VENV=$VENV"; cat <<'JOB'
A="apptainer exec --containall --nv --bind /tmp:/tmp"
echo "job $SLURM_JOB_ID on $SLURMD_NODENAME as $(id -un): CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"
echo "-- nvidia-smi -L in the container:"; $A $IMG nvidia-smi -L; echo "rc=$?"
echo "-- torch:"; $A $IMG $VENV/bin/python3 -c 'import torch; print("torch.cuda.is_available()", torch.cuda.is_available(), "| device_count", torch.cuda.device_count())' 2>&1 | tail -n 2
echo "-- /dev/nvidia*:"; $A $IMG sh -c 'ls /dev/nvidia*; for f in /dev/nvidia0 /dev/nvidiactl; do (: < $f) 2>/dev/null && echo "$f: opened" || echo "$f: refused"; done'
JOB
} > /home/bob/cpu-job.sh
chmod 755 /home/bob/cpu-job.sh
b=$(asuser bob sbatch --parsable -c 2 --mem=4G -t 5 -o /home/bob/b-%j.out /home/bob/cpu-job.sh)
echo "bob's job $b: $(wait_done $b 120)"
sed 's/^/  | /' /home/bob/b-$b.out

step "6. a SIF of the small sandbox, exec'd by alice"
t=$SECONDS; apptainer build --force $MINI.sif $MINI 2>&1 | tail -n 3; chmod 644 $MINI.sif 2>/dev/null
echo "apptainer build mini.sif: $((SECONDS - t)) s, $(ls -l $MINI.sif 2>&1)"
{ echo "#!/bin/bash"; echo "SIF=$MINI.sif"; cat <<'JOB'
echo "job $SLURM_JOB_ID as $(id -un), CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES, $(ls -l /dev/fuse)"
export APPTAINERENV_CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES TIMEFORMAT="exec of the SIF: %R s"
time apptainer exec --containall --nv --bind /tmp:/tmp $SIF sh -c 'head -n 1 /etc/os-release; id -un; nvidia-smi -L'
echo "rc=$?"
JOB
} > /home/alice/sif-job.sh
chmod 755 /home/alice/sif-job.sh
sif_job() {
  local j=$(asuser alice sbatch --parsable --gres=gpu:1 -c 1 --mem=1G -t 5 -o /home/alice/sif-%j.out /home/alice/sif-job.sh)
  echo "job $j: $(wait_done $j 120)"; sed 's/^/  | /' /home/alice/sif-$j.out
}
echo "-- /dev/fuse as this machine has it: $(ls -l /dev/fuse 2>&1)"; sif_job
if [ -e /dev/fuse ] && [ "$(stat -c %a /dev/fuse)" != 666 ]; then
  mode=$(stat -c %a /dev/fuse); chmod 666 /dev/fuse
  echo "-- /dev/fuse 0666 (as most distributions ship it)"; sif_job; chmod $mode /dev/fuse
fi

step "done"
mount -o remount,hidepid=0 /proc
grep -hiE "error" /var/log/slurm/slurmd-*.log | grep -v "Controller memory" | tail -n 8
echo "total $((SECONDS - T0)) s"
