#!/bin/bash
# GPU shares (issue 52) on the `device` machine: Debian bookworm's Slurm 22.05 with the demo's confinement
# (ConstrainDevices and the rest, slurm-up.sh CONFINE=1) and 4 shards per GPU (SHARDS=4), as the demo
# declares. First a whole GPU alone runs a bf16 matmul (its TFLOPS); then four users' jobs, each with the
# #SBATCH lines the portal renders for a "¼ GPU" session (prepare.sh shares), run the same matmul at once
# on the same card, each holding some GPU memory; while they run, a whole-GPU job is submitted and waits.
# Each share says what it sees (CUDA_VISIBLE_DEVICES, nvidia-smi -L) and what the session's gauges read
# (portal.session.usage.sliceusage with DSPORTAL_GPU_SHARE=1/4: its own GPU memory against its part).
set -u
R=$PWD; C=$R/.devcarry; S=$R/scripts/gpu-validation; O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/gpu-shares.log) 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS
echo "== machine"; nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'
PY=$(command -v python3)
chmod -R a+rX "$(dirname "$(dirname "$PY")")" 2>/dev/null
# The portal's session code and NVML's binding where users read them.
rm -rf /opt/dsportal-src && mkdir -p /opt/dsportal-src && cp -r $R/portal /opt/dsportal-src/
$PY -m pip install -q --no-deps --target /opt/dsportal-src $C/whl/nvidia_ml_py-*.whl
chmod -R a+rX /opt/dsportal-src

cat > /usr/local/share/dsportal-matmul.py <<'PROG'
# bf16 8192x8192 matmuls for $1 seconds, holding $2 GiB of GPU memory besides; with $3, the session's
# gauges are read halfway (what the status bar would show); with $4 = idle, it only holds the memory
# (a share nobody uses: its gauges should not count its neighbours' work as its use). One JSON line.
import json, os, subprocess, sys, threading, time
import torch
seconds, hold_gib, gauges = float(sys.argv[1]), float(sys.argv[2]), len(sys.argv) > 3
idle = sys.argv[4:5] == ["idle"]
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
y = torch.randn_like(x)
hold = torch.empty(int(hold_gib * 2**30), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
result = {"user": os.environ.get("USER"), "job": os.environ.get("SLURM_JOB_ID"),
          "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "SLURM_JOB_GPUS": os.environ.get("SLURM_JOB_GPUS"),
          "gres": os.environ.get("SLURM_JOB_GRES", ""), "DSPORTAL_GPU_SHARE": os.environ.get("DSPORTAL_GPU_SHARE"),
          "nvidia-smi -L": subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()}
def read_gauges():
    time.sleep(seconds / 2)
    from dataclasses import asdict
    from portal.session.usage.sliceusage import SliceUsage
    usage = SliceUsage()
    result["gauges"] = [{k: v for k, v in asdict(g).items() if k in ("index", "share", "utilization_percent",
                        "memory_used_bytes", "memory_total_bytes", "own_memory_bytes", "share_memory_bytes",
                        "own_utilization_percent", "error")}
                        for g in usage.read_gpus()]
reader = threading.Thread(target=read_gauges) if gauges else None
if reader: reader.start()
n, t0 = 0, time.time()
while idle and time.time() - t0 < seconds:
    time.sleep(0.5)
while not idle and time.time() - t0 < seconds:
    for _ in range(10):
        z = x @ y
    torch.cuda.synchronize()
    n += 10
elapsed = time.time() - t0
if reader: reader.join()
result.update(started=t0, elapsed_s=round(elapsed, 2), tflops=round(2 * 8192**3 * n / elapsed / 1e12, 1),
              held_gib=hold_gib)
print("RESULT " + json.dumps(result), flush=True)
PROG
chmod 644 /usr/local/share/dsportal-matmul.py

source $S/jobs.sh
export SHARDS=4 SLURM_NODES=1
confined_slurm_up
echo "confinement: $CONFINED"
sinfo -N -o "%N %T %c %m %G"
for u in carol dave; do id $u >/dev/null 2>&1 || useradd -m -s /bin/bash $u; chmod 700 /home/$u; done
ENVV="PYTHONPATH=/opt/dsportal-src"

step "a whole GPU alone, 20 s"
w=$(asuser alice sbatch --parsable --gres=gpu:1 -c 2 --mem=16G -t 5 -o /home/alice/whole-%j.out \
      --wrap "env $ENVV $PY /usr/local/share/dsportal-matmul.py 20 1")
echo "job $w: $(wait_done $w 120)"; grep RESULT /home/alice/whole-$w.out | sed 's/^RESULT /  /'

step "four users, one share each (the portal's #SBATCH lines for '¼ GPU'), 40 s at once"
cat $C/header-share.txt
ids=()
i=0
for u in alice bob carol dave; do
  i=$((i + 1))
  mode=busy; [ $u = dave ] && mode=idle   # dave's share holds memory and computes nothing
  { echo '#!/bin/bash'; cat $C/header-share.txt; echo "#SBATCH --output=/home/$u/share-%j.out"
    echo "export DSPORTAL_GPU_SHARE=1/4 $ENVV"; echo "$PY /usr/local/share/dsportal-matmul.py 40 $i gauges $mode"; } > /tmp/share-$u.sh
  chmod 644 /tmp/share-$u.sh
  ids+=("$(asuser $u sbatch --parsable /tmp/share-$u.sh)")
done
sleep 8
squeue -o "%i %u %T %b %N %R"
step "while they run: a whole-GPU job"
g=$(asuser alice sbatch --parsable --gres=gpu:1 -c 2 --mem=16G -t 5 -o /home/alice/after-%j.out \
      --wrap "env $ENVV $PY /usr/local/share/dsportal-matmul.py 10 1" 2>/tmp/whole.err) || echo "whole-GPU job refused: $(cat /tmp/whole.err)"
sleep 3
[ -n "$g" ] && echo "whole-GPU job $g: $(state $g) ($(scontrol show job $g | grep -o 'Reason=[A-Za-z_]*'))"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
for j in "${ids[@]}"; do echo "share job $j: $(wait_done $j 180)"; done
[ -n "$g" ] && echo "whole-GPU job $g after the shares: $(wait_done $g 120)"
for u in alice bob carol dave; do grep -h RESULT /home/$u/share-*.out | tail -n 1 | sed "s/^RESULT /  /"; done
[ -n "$g" ] && grep -h RESULT /home/alice/after-$g.out | sed 's/^RESULT /  after: /'
python3 - <<'PYEOF'
import glob, json
def results(pattern):
    return [json.loads(l.split(" ", 1)[1]) for f in glob.glob(pattern) for l in open(f) if l.startswith("RESULT ")]
whole = results("/home/alice/whole-*.out")[-1]["tflops"]
shares = [max(results(f"/home/{u}/share-*.out"), key=lambda r: int(r["job"])) for u in ("alice", "bob", "carol", "dave")]
after = (results("/home/alice/after-*.out") or [None])[-1]
last_end = max(r["started"] + r["elapsed_s"] for r in shares)
share_gpus = sorted({r["SLURM_JOB_GPUS"] for r in shares})
own = [round(r["gauges"][0]["own_memory_bytes"] / 2**30, 2) for r in shares if r.get("gauges")]
own_busy = [r["gauges"][0].get("own_utilization_percent") for r in shares if r.get("gauges")]
print(f"shares: each {', '.join(str(r['tflops']) for r in shares)} TFLOPS against {whole} alone "
      f"({sum(r['tflops'] for r in shares) / whole:.0%} of the card together), all on GPU {', '.join(share_gpus)}; "
      f"their gauges' own GPU memory {own} GiB, own utilisation {own_busy} %; "
      + ("the whole-GPU job was refused: no GPU here is given whole" if after is None else
         f"the whole-GPU job, on GPU {after['SLURM_JOB_GPUS']}, "
         + (f"ran beside them ({last_end - after['started']:.1f} s while they ran)" if after['started'] < last_end else
            f"began {after['started'] - last_end:.1f} s after the last share ended")))
PYEOF
