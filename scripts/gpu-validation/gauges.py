"""The slice's gauges on a real GPU (bench/results/gpu-validation.md, "Gauges"): run as root on the device machine.

A job-like cgroup v2 (memory.max, cpu.max, as Slurm's task/cgroup sets them) holds this process; the
job's environment names GPU 0 as Slurm would. portal.session.usage.sliceusage reads memory, CPU and the
job's GPU once a second while a bf16 matrix product runs on that GPU in a child process, then a
CPU slice's reading (no GPU variables), then a kernel of a 512 MB slice past its limit (OOM count).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pynvml

from portal.session.usage import sliceusage

CG = Path("/sys/fs/cgroup")
OUT = Path(os.environ.get("OUT", "/tmp"))


def job_cgroup(name: str, memory: int, cpus: float) -> Path:
    folder = CG / name
    folder.mkdir(exist_ok=True)
    (folder / "memory.max").write_text(str(memory))
    if (folder / "memory.swap.max").exists():
        (folder / "memory.swap.max").write_text("0")
    (folder / "cpu.max").write_text(f"{int(cpus * 100000)} 100000")
    return folder


MATMUL = """
import time, torch
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); b = torch.randn_like(a)
hold = torch.empty(20 << 30, dtype=torch.uint8, device='cuda')  # 20 GiB held on the GPU
end = time.time() + float(__import__('sys').argv[1]); n = 0
while time.time() < end:
    for _ in range(50): c = a @ b
    torch.cuda.synchronize(); n += 50
print(f'matmuls {n}', flush=True)
"""


def main() -> None:
    results = {}
    job = job_cgroup("gaugejob", 16 << 30, 8)
    (job / "cgroup.procs").write_text(str(os.getpid()))
    pynvml.nvmlInit()
    minor = str(pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(0)))
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_GPUS": minor, "CUDA_VISIBLE_DEVICES": "0", "SLURM_CPUS_ON_NODE": "16"}
    usage = sliceusage.SliceUsage(environ=env)
    usage.cpu()
    time.sleep(1)
    rows = []
    child = None
    start = time.time()
    for second in range(22):
        if second == 3:
            child = subprocess.Popen([sys.executable, "-c", MATMUL, "12"], env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"})
        t0 = time.perf_counter()
        reading = usage.read()
        took = time.perf_counter() - t0
        gpu = reading.gpus[0] if reading.gpus else None
        rows.append({"t_s": round(time.time() - start, 1), "matmul_running": child is not None and child.poll() is None,
                     "gpu_util_percent": gpu and gpu.utilization_percent,
                     "gpu_mem_used_gib": gpu and round(gpu.memory_used_bytes / 2**30, 2),
                     "gpu_mem_total_gib": gpu and round(gpu.memory_total_bytes / 2**30, 2),
                     "busy_gpus": sliceusage.busy_gpus(reading.gpus, 5),  # activity.read_gpus: idle reclaim's signal
                     "mem_used_gib": round(reading.memory.used_bytes / 2**30, 2),
                     "mem_limit_gib": round(reading.memory.limit_bytes / 2**30, 2), "mem_limit_from": reading.memory.limit_from,
                     "cpu_used_cores": reading.cpu.used_cores, "cpu_cores": reading.cpu.cores, "cores_from": reading.cpu.cores_from,
                     "read_ms": round(took * 1000, 1)})
        print(json.dumps(rows[-1]), flush=True)
        time.sleep(max(0, 1 - (time.perf_counter() - t0)))
    child.wait()
    results["gpu_slice"] = {"gpus": [vars(g) for g in usage.read_gpus()], "timeline": rows}
    cpu_slice = sliceusage.SliceUsage(environ={"SLURM_JOB_ID": "4243", "SLURM_CPUS_ON_NODE": "4"})
    reading = cpu_slice.read()
    results["cpu_slice"] = {"gpus": reading.gpus, "nvml_loaded": cpu_slice.nvml._ready is not None,
                            "memory_limit_gib": reading.memory.limit_bytes / 2**30, "cores": reading.cpu.cores}
    print("CPU slice:", json.dumps(results["cpu_slice"]), flush=True)
    # A 512 MB slice: a process past the limit is OOM-killed, and the cgroup's count says so.
    small = job_cgroup("gaugejob-small", 512 << 20, 1)
    before = sliceusage.read_memory(sliceusage.Cgroup(small, 2), CG).oom_kills
    hog = subprocess.Popen([sys.executable, "-c", "x = [bytearray(64 << 20) for _ in range(32)]"],
                           preexec_fn=lambda: (small / "cgroup.procs").write_text(str(os.getpid())))
    code = hog.wait()
    after = sliceusage.read_memory(sliceusage.Cgroup(small, 2), CG)
    results["oom"] = {"exit": code, "oom_kills_before": before, "oom_kills_after": after.oom_kills,
                      "limit_mib": after.limit_bytes >> 20, "limit_from": after.limit_from}
    print("OOM:", json.dumps(results["oom"]), flush=True)
    (OUT / "gauges.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
