#!/bin/bash
# Slices that share a real GPU node (run on the `device` machine, see bench/results/gpu-validation.md):
# Debian bookworm's Slurm 22.05 with the demo cluster's confinement (CONFINE=1 in slurm-up.sh:
# proctrack/cgroup, task/cgroup with ConstrainDevices/ConstrainRAMSpace, job_container/tmpfs) on
# cgroup v2, GRES on the real /dev/nvidia0. alice holds the GPU in her slice; bob, in a CPU slice on
# the same node, unsets CUDA_VISIBLE_DEVICES and tries it anyway. First without confinement
# (what stock Slurm settings allow), then with it.
set -u
R=$PWD; C=$R/.devcarry; S=$R/scripts/gpu-validation; O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/gpu-isolation.log) 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "== machine"; nvidia-smi -L; uname -r; stat -fc %T /sys/fs/cgroup; cat /proc/self/cgroup /sys/fs/cgroup/cgroup.subtree_control; python3 -c 'import torch; print("torch", torch.__version__)'
PY=$(command -v python3)
chmod -R a+rX "$(dirname "$(dirname "$PY")")" 2>/dev/null

# What bob's CPU slice tries: the node's GPU with CUDA_VISIBLE_DEVICES unset, alice's /tmp and
# /dev/shm files, her processes.
cat > /usr/local/share/dsportal-probe.py <<'PROBE'
import errno, json, os, subprocess, sys
import pwd
result = {"user": pwd.getpwuid(os.getuid()).pw_name, "job": os.environ["SLURM_JOB_ID"], "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
os.environ.pop("CUDA_VISIBLE_DEVICES", None)
try:
    os.close(os.open("/dev/nvidia0", os.O_RDWR)); result["open /dev/nvidia0"] = "opened"
except OSError as e:
    result["open /dev/nvidia0"] = errno.errorcode[e.errno]
smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
result["nvidia-smi -L"] = (smi.stdout + smi.stderr).strip()[:120]
code = "import torch; n = torch.cuda.device_count(); print(n, [str(torch.cuda.get_device_properties(i).uuid) for i in range(n)])"
torch = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
result["torch"] = (torch.stdout.strip() or torch.stderr.strip().splitlines()[-1])[:160]
result["/tmp"] = sorted(os.listdir("/tmp"))[:8]
result["/dev/shm"] = sorted(os.listdir("/dev/shm"))[:8]
owners = set()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        owners.add(os.stat(f"/proc/{pid}").st_uid)
    except OSError:
        pass
result["process owners"] = sorted(pwd.getpwuid(u).pw_name for u in owners)
print("PROBE " + json.dumps(result))
PROBE
chmod 644 /usr/local/share/dsportal-probe.py

source $S/jobs.sh  # state, wait_done, asuser

round() {  # $1: label
  echo; echo "=================== $1"
  id bob >/dev/null 2>&1 || useradd -m -s /bin/bash bob
  chmod 700 /home/alice /home/bob
  rm -f /home/alice/holding; start=$SECONDS
  # alice's 1-GPU slice: sees its GPU (also with CUDA_VISIBLE_DEVICES unset), leaves files, holds it.
  a=$(asuser alice sbatch --parsable --gres=gpu:1 -c 2 --mem=16G -t 10 -o /home/alice/a-%j.out --wrap "
    $PY /usr/local/share/dsportal-probe.py; echo secret > /tmp/alice-secret; echo secret > /dev/shm/alice-shm
    $PY -c 'import torch, time; x = torch.ones(1 << 28, device=\"cuda\"); open(\"/home/alice/holding\", \"w\").write(str(x.sum().item())); time.sleep(45)'")
  for _ in $(seq 60); do [ -s /home/alice/holding ] && break; [ "$(state $a)" = PENDING ] && [ $SECONDS -gt $((start + 20)) ] && break; sleep 1; done
  if [ ! -s /home/alice/holding ]; then
    echo "alice's job $a did not start:"; scontrol show job $a | grep -E "JobState|Reason"; sinfo -R
    grep -h error /var/log/slurm/slurmd-*.log | grep -v "family\|Error connecting" | tail -n 8; scancel $a; return 1
  fi
  echo "alice's job $a: $(state $a), holding the GPU: $(cat /home/alice/holding 2>/dev/null)"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
  # bob's CPU slice on the same node, while alice's runs.
  b=$(asuser bob sbatch --parsable -c 2 --mem=4G -t 10 -o /home/bob/b-%j.out --wrap "$PY /usr/local/share/dsportal-probe.py")
  echo "bob's job $b: $(wait_done $b)"
  # bob's slice that outgrows its memory, and one that leaves a daemon behind.
  m=$(asuser bob sbatch --parsable -c 1 --mem=512M -t 5 -o /dev/null --wrap "$PY -c 'x = b\"x\" * (2 << 30); print(len(x))'")
  echo "bob's 2 GiB in a 512 MB slice, job $m: $(wait_done $m)"
  d=$(asuser bob sbatch --parsable -c 1 --mem=256M -t 5 -o /dev/null --wrap "setsid sleep 3600 < /dev/null > /dev/null 2>&1 & sleep 1")
  echo "bob's job $d that leaves 'sleep 3600' behind: $(wait_done $d); sleep 3 later, bob's sleep 3600 processes: $(sleep 3; pgrep -u bob -fc '^sleep 3600')"
  pkill -u bob -f '^sleep 3600'
  echo "alice's job $a: $(wait_done $a)"
  grep -h PROBE /home/alice/a-$a.out /home/bob/b-$b.out | sed 's/^PROBE /  /'
}

export SLURM_NODES=1
if [ "${SKIP_STOCK:-0}" != 1 ]; then
  CONFINE=0 source $S/slurm-up.sh
  mount -o remount,hidepid=0 /proc 2>/dev/null
  round "stock Slurm settings (proctrack/linuxproc, task/none): nothing confines a job"
  pkill -x munged; sleep 1
fi

CONFINE=1 source $S/slurm-up.sh
mount -o remount,hidepid=invisible /proc && echo "/proc: hidepid=invisible"
cat /etc/slurm/cgroup.conf /etc/slurm/job_container.conf
round "dsportal's confinement (proctrack/cgroup, task/cgroup ConstrainDevices+RAM, job_container/tmpfs, hidepid)" || {
  # What this VM's Slurm 22.05 on cgroup v2 without systemd could not do is left out, one part at a time.
  for without in "CONSTRAIN_RAM=no" "CONSTRAIN_RAM=no JOB_CONTAINER=no"; do
    pkill -x munged; sleep 1
    env $without true; eval "export $without"
    CONFINE=1 source $S/slurm-up.sh
    cat /etc/slurm/cgroup.conf; grep JobContainer /etc/slurm/slurm.conf
    round "dsportal's confinement without $without" && break
  done
}
grep -hiE "error|bpf|device" /var/log/slurm/slurmd-*.log | tail -15
mount -o remount,hidepid=0 /proc
