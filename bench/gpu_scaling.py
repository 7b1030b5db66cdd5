"""GPU scaling of jobs launched through the portal, side by side with the same run launched bare.

ResNet-50 on synthetic data (bench/resnet_synthetic.py), Horovod and torch DDP (torchrun), on 1, 2
and 4 GPUs of one node and on 2 nodes x 2 GPUs (``run --gpus 1,2,4,2x2`` picks; SLURM_NODES=1+2 in
scaling.sh gives partition gpu one node with every GPU and partition gpu2 two nodes with half each).
Horovod's ranks are started as the profile's launcher says: ``srun --mpi=pmix`` (the default, as on
a cluster) or ``mpirun`` inside the allocation. With ``--image`` each rank runs in that Apptainer
image with ``--nv`` (outside-in, as the portal launches them); the bare runs stay on the host. Two
steps, because the GPU machine has neither the portal's Python stack nor a network:

  render  (here) the portal's own job path: each request goes through ``plan_job`` (the
          validation sessions use) and ``render_script`` (templates/mpi_job.sbatch.j2: the
          slice's #SBATCH lines, the launcher, the per-rank log wrapper); the batch scripts and
          the benchmark land in --out, for a GPU profile like the demo's.
  run     (on the GPU machine, as root, Slurm up; stdlib only) submits each rendered job as the
          user, follows every rank's log while the job runs (as the session's log stream does),
          then runs the same benchmark bare (torchrun --standalone, mpirun) as the user. Prints
          img/s, scaling efficiency 1 -> 2 GPUs, portal vs bare; the last line sums up.

    python bench/gpu_scaling.py render --out .devcarry/gpu-scaling
    python3 bench/gpu_scaling.py run --jobs .devcarry/gpu-scaling      # on the GPU machine
    python bench/gpu_scaling.py collect bench/results/gpu-scaling-DATE-*.log   # here: each log as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = [(mode, gpus) for mode in ("hvd", "ddp") for gpus in (1, 2, 4, "2x1", "2x2")]  # 2x2: 2 nodes x 2 GPUs
USER, HOME = "alice", "/home/alice"
ENVIRONMENT = "/opt/gpuenv"  # on the GPU machine: bin/python and bin/torchrun of its PyTorch
JOB_TIMEOUT = 150  # seconds a portal job may take before it is cancelled (a run takes well under 60)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def label(mode: str, gpus) -> str:
    return f"{mode}-{gpus}gpu"


def layout(gpus) -> tuple[int, int]:
    """(nodes, GPUs per node) of a run: 4 -> (1, 4), '2x2' -> (2, 2)."""
    nodes, _, per_node = str(gpus).rpartition("x")
    return int(nodes or 1), int(per_node)


# ----------------------------------------------------------------------------- render (here)
def parse_env(pairs: list[str]) -> dict[str, str]:
    """--horovod-env HOROVOD_CYCLE_TIME=0.1 ...: tuning an admin would put in the profile's jobs.env."""
    return dict(pair.split("=", 1) for pair in pairs)


def render(out: Path, hvd_site: str, horovod_env: dict[str, str] | None = None, steps: int | None = None,
           launcher: str = "srun", image: str | None = None, apptainer: str = "apptainer",
           image_python: str = "python3") -> None:
    sys.path.insert(0, str(HERE.parent))
    from portal.core import rules, settings
    from portal.session.job import launcher as jobs

    gpu = settings.load(HERE.parent / "config" / "portal.yaml").profile("gpu")
    env = {"NCCL_DEBUG": "WARN", "HOROVOD_LOG_LEVEL": "warning", "PYTHONPATH": hvd_site, **NO_MULTICAST}
    if launcher == "srun":  # the demo profile's PMIx setting (ranks in containers ask the node's server)
        env["PMIX_MCA_gds"] = gpu.jobs.env.get("PMIX_MCA_gds", "hash")
        if image:  # each rank's container is a user namespace of its own: no cross-memory attach between them
            env["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"
    else:  # Open MPI's Slurm allocation module finds no nodes where Slurm's node names are not the host's
        env["OMPI_MCA_ras"] = "^slurm"
    jobs_settings = gpu.jobs.model_copy(update={
        "launcher": launcher, "env": {**env, **(horovod_env or {})},
        # Horovod, the NCCL it was linked against, the nodes' TmpFS (Slurm's PMIx server folders)
        "container_binds": [hvd_site, "/opt/nccl", "/opt/nodes"] if image else []})
    profiles = [gpu.model_copy(update={"name": name, "partition": name, "gpu_choices": [1, 2, 4], "default_gpus": 1,
                                       "jobs": jobs_settings}) for name in ("gpu", "gpu2")]
    images = [settings.Image(name="host", display_name="The GPU machine's own userland", source="local",
                             path=image, runtime="apptainer", runtime_binary=apptainer, python=image_python)] if image else []
    policy = jobs.LaunchPolicy(profiles=profiles, default_profile="gpu", environment=ENVIRONMENT, images=images,
                               node_gpus={"gpu": 4, "gpu2": 2}, node_count={"gpu": 1, "gpu2": 2})
    code = (HERE / "resnet_synthetic.py").read_text()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copy(HERE / "resnet_synthetic.py", out / "resnet_synthetic.py")
    shutil.copy(__file__, out / "gpu_scaling.py")
    for mode, gpus in RUNS:
        name = label(mode, gpus)
        nodes, per_node = layout(gpus)
        bench_args = ["--mode", mode, "--label", "portal", *(["--steps", str(steps)] if steps else [])]
        request = {"code": code, "args": bench_args, "nodes": nodes, "gpus_per_node": per_node,
                   "launcher": "torchrun" if mode == "ddp" else "mpi", "walltime": "00:20:00", "name": f"bench-{name}",
                   "profile": "gpu2" if nodes > 1 else "gpu", **({"image": "host"} if image else {})}
        # the image is on the GPU machine, not here: taken as built
        plan = rules.plan_job(rules.JobRequest.parse(request), policy, HOME, lambda _image: ("built", ""))
        job_dir = f"{HOME}/.dsportal/jobs/{name}"
        folder = out / name
        folder.mkdir()
        (folder / "cell.py").write_text(code)
        (folder / "job.sbatch").write_text(jobs.render_script(plan, policy, job_dir, f"{job_dir}/cell.py", HOME))
        (folder / "plan.txt").write_text(plan.describe() + "\n")
        print(f"{name}: {plan.describe()}")
    print(f"rendered {len(RUNS)} jobs into {out}")


# ---------------------------------------------------------------------- run (GPU machine)
def as_user(argv: list[str], env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **NO_MULTICAST, **(env or {})}
    return subprocess.run(["runuser", "-u", USER, "--", *argv], env=full_env, text=True, capture_output=True,
                          cwd=HOME, **kwargs)


def squeue_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout.strip()
    return out or "GONE"


def run_portal_job(jobs: Path, name: str) -> dict:
    job_dir = Path(f"{HOME}/.dsportal/jobs/{name}")
    shutil.rmtree(job_dir, ignore_errors=True)
    job_dir.mkdir(parents=True)
    for file in ("cell.py", "job.sbatch"):
        shutil.copy(jobs / name / file, job_dir / file)
    subprocess.run(["chown", "-R", f"{USER}:", f"{HOME}/.dsportal"], check=True)
    os.chmod(f"{HOME}/.dsportal", 0o700)
    submitted = as_user(["sbatch", "--parsable", str(job_dir / "job.sbatch")])
    if submitted.returncode != 0:
        return {"name": name, "error": submitted.stderr.strip()}
    job_id = submitted.stdout.strip().split(";")[0]
    started, first_line, states = time.monotonic(), {}, []
    while True:  # the session's log stream reads the same files every 0.25 s
        state = squeue_state(job_id)
        for rank_file in job_dir.glob("rank-*.out"):
            rank = int(rank_file.stem.split("-")[1])
            if rank not in first_line and rank_file.stat().st_size:
                first_line[rank] = (time.monotonic() - started, state)
        if state == "GONE":
            break
        if time.monotonic() - started > JOB_TIMEOUT and "CANCELLING" not in states:
            subprocess.run(["scancel", job_id])  # a rank that hangs (MPI set-up, say) must not hold the machine
            state = "CANCELLING"
        states.append(state)
        time.sleep(0.25)
    final = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    job_state = re.search(r"JobState=(\S+)", final)
    outputs = "".join(p.read_text(errors="replace") for p in sorted(job_dir.glob("rank-*.out")))
    result = re.search(r"RESULT \S+ mode=\S+ gpus=(\d+) img_per_s=([\d.]+)", outputs)
    return {"name": name, "job_id": job_id, "seconds": time.monotonic() - started,
            "state": job_state.group(1) if job_state else "?", "ranks_live": {r: s for r, (_, s) in first_line.items()},
            "img_per_s": float(result.group(2)) if result else None, "ranks": len(first_line),
            "log_tail": "" if result else (outputs[-1500:] + (job_dir / "batch.log").read_text(errors="replace")[-2500:]
                                           + "".join(p.read_text(errors="replace")[-1500:] for p in job_dir.glob("rank-*.err")))}


def run_bare(jobs: Path, mode: str, gpus, hvd_site: str, python: str, torchrun: str,
             horovod_env: dict[str, str] | None = None, steps: int | None = None) -> dict:
    script = f"{HOME}/resnet_synthetic.py"
    shutil.copy(jobs / "resnet_synthetic.py", script)
    os.chmod(script, 0o644)
    args = ["--mode", mode, "--label", "bare", *(["--steps", str(steps)] if steps else [])]
    nodes, per_node = layout(gpus)
    total = nodes * per_node
    if nodes > 1 and mode == "ddp":  # one torchrun agent per "node", each with its GPUs, meeting on this host
        return run_bare_agents(script, args, nodes, per_node, torchrun, label(mode, gpus))
    if mode == "ddp":
        argv = [torchrun, "--standalone", f"--nproc-per-node={total}", script, *args]
    else:  # Horovod: mpirun's ranks on this one host, however many "nodes" the portal's job had
        argv = ["mpirun", "-np", str(total), "-bind-to", "none", "-map-by", "slot", python, script, *args]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(total))), "PYTHONPATH": hvd_site, "NCCL_DEBUG": "WARN",
           **(horovod_env if mode == "hvd" and horovod_env else {})}
    started = time.monotonic()
    try:
        done = as_user(argv, env=env, timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired as expired:
        subprocess.run(["pkill", "-KILL", "-u", USER])  # what it left on the GPUs
        return {"name": label(mode, gpus), "seconds": JOB_TIMEOUT, "returncode": None, "img_per_s": None,
                "log_tail": f"timed out after {expired.timeout} s"}
    result = re.search(r"RESULT \S+ mode=\S+ gpus=(\d+) img_per_s=([\d.]+)", done.stdout)
    return {"name": label(mode, gpus), "seconds": time.monotonic() - started, "returncode": done.returncode,
            "img_per_s": float(result.group(2)) if result else None,
            "log_tail": "" if result else (done.stdout[-1500:] + done.stderr[-2500:])}


def run_bare_agents(script: str, args: list[str], nodes: int, per_node: int, torchrun: str, name: str) -> dict:
    started, agents = time.monotonic(), []
    for node in range(nodes):
        env = {**os.environ, **NO_MULTICAST, "NCCL_DEBUG": "WARN",
               "CUDA_VISIBLE_DEVICES": ",".join(str(node * per_node + g) for g in range(per_node))}
        agents.append(subprocess.Popen(
            ["runuser", "-u", USER, "--", torchrun, f"--nnodes={nodes}", f"--nproc-per-node={per_node}",
             "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29399", "--rdzv-id=bare", f"--rdzv-conf=is_host={int(node == 0)}",
             script, *args], env=env, cwd=HOME, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    try:
        outputs = [agent.communicate(timeout=JOB_TIMEOUT) for agent in agents]
    except subprocess.TimeoutExpired:
        subprocess.run(["pkill", "-KILL", "-u", USER])
        outputs = [agent.communicate() for agent in agents]
    stdout = "".join(out for out, _ in outputs)
    result = re.search(r"RESULT \S+ mode=\S+ gpus=(\d+) img_per_s=([\d.]+)", stdout)
    return {"name": name, "seconds": time.monotonic() - started, "returncode": max(a.returncode for a in agents),
            "img_per_s": float(result.group(2)) if result else None,
            "log_tail": "" if result else (stdout[-1500:] + "".join(err[-1500:] for _, err in outputs))}


def run(jobs: Path, hvd_site: str, python: str, torchrun: str, out: Path, counts: list[str], modes: list[str],
        horovod_env: dict[str, str] | None = None, steps: int | None = None, tag: str = "") -> int:
    portal, bare = {}, {}
    runs = [(mode, gpus) for mode, gpus in RUNS if str(gpus) in counts and mode in modes]
    for mode, gpus in runs:
        name = label(mode, gpus)
        portal[name] = run_portal_job(jobs, name)
        print(f"portal {name}: {json.dumps(portal[name])}", flush=True)
        bare[name] = run_bare(jobs, mode, gpus, hvd_site, python, torchrun, horovod_env, steps)
        print(f"bare   {name}: {json.dumps(bare[name])}", flush=True)
    (out / f"gpu-scaling-{'-'.join(map(str, counts))}{tag and '-' + tag}.json").write_text(json.dumps({"portal": portal, "bare": bare},
                                                                                    indent=1))

    def ips(results, name):
        return results[name].get("img_per_s") or float("nan")

    print("\n| launcher | GPUs | portal img/s | bare img/s | portal vs bare | portal job state | ranks live |")
    print("|---|---|---|---|---|---|---|")
    for mode, gpus in runs:
        name, p = label(mode, gpus), portal[label(mode, gpus)]
        live = f"{sum(1 for s in p.get('ranks_live', {}).values() if s == 'RUNNING')}/{p.get('ranks', 0)}"
        print(f"| {'Horovod' if mode == 'hvd' else 'DDP (torchrun)'} | {gpus} | {ips(portal, name):.0f} | "
              f"{ips(bare, name):.0f} | {100 * (ips(portal, name) / ips(bare, name) - 1):+.1f} % | "
              f"{p.get('state', p.get('error'))} | {live} |")
    summary = []
    for mode, gpus in runs:
        one, top = label(mode, 1), label(mode, gpus)
        nodes, per_node = layout(gpus)
        if one not in portal or nodes * per_node == 1:
            continue
        total = nodes * per_node
        summary.append(f"{'Horovod' if mode == 'hvd' else 'torchrun'} 1->{gpus} GPUs "
                       f"{100 * ips(portal, top) / (total * ips(portal, one)):.1f} % "
                       f"(bare {100 * ips(bare, top) / (total * ips(bare, one)):.1f} %), portal vs bare "
                       f"{100 * (ips(portal, top) / ips(bare, top) - 1):+.1f} %")
    tuning = " ".join(f"{k}={v}" for k, v in (horovod_env or {}).items()) or "Horovod defaults"
    print(f"\ngpu-scaling: ResNet-50 bf16 batch 128/GPU, {steps or 60} timed steps, {tuning} | " + " | ".join(summary))
    return 0


# ----------------------------------------------------------------------------- collect (here)
def collect(logs: list[Path]) -> int:
    """A run's log (``run`` prints each job's result as one JSON line, then a summary) as a dated JSON
    file beside it: the same name ending in .json, with the log's name, its runs in order (each with
    its launch, portal or bare) and its summary lines."""
    for log in logs:
        runs, summary = [], []
        for line in log.read_text(errors="replace").splitlines():
            found = re.match(r"(portal|bare) +(\S+): (\{.*\})$", line)
            if found:
                runs.append({"launch": found.group(1), **json.loads(found.group(3)), "name": found.group(2)})
            elif line.startswith("gpu-scaling: "):
                summary.append(line.removeprefix("gpu-scaling: "))
        date = re.search(r"\d{4}-\d{2}-\d{2}", log.name)
        target = log.with_suffix(".json")
        target.write_text(json.dumps({"log": log.name, "date": date.group(0) if date else None, "runs": runs,
                                      "summary": summary}, indent=1) + "\n")
        print(f"{target}: {len(runs)} runs (portal and bare), {len(summary)} summary line(s)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    r = sub.add_parser("render")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--hvd-site", default="/opt/hvd-site", help="where the GPU machine's Horovod is installed")
    r.add_argument("--launcher", choices=("srun", "mpirun"), default="srun", help="what starts Horovod's ranks")
    r.add_argument("--image", help="an Apptainer image on the GPU machine the ranks run in (else: on the host)")
    r.add_argument("--apptainer", default="apptainer", help="the GPU machine's apptainer command")
    r.add_argument("--image-python", default="python3", help="the Python in the image that runs the benchmark")
    g = sub.add_parser("run")
    g.add_argument("--jobs", type=Path, required=True)
    g.add_argument("--hvd-site", default="/opt/hvd-site")
    g.add_argument("--python", default=f"{ENVIRONMENT}/bin/python")
    g.add_argument("--torchrun", default=f"{ENVIRONMENT}/bin/torchrun")
    g.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    g.add_argument("--gpus", default="1,2", help="GPU counts to run, e.g. 1,2,4 or 1,2x2")
    g.add_argument("--modes", default="hvd,ddp", help="hvd (Horovod), ddp (torchrun) or both")
    for step in (r, g):
        step.add_argument("--horovod-env", nargs="*", default=[], metavar="KEY=VALUE",
                          help="Horovod tuning, in the rendered jobs' environment (the profile's jobs.env) and the bare runs'")
        step.add_argument("--steps", type=int, default=None, help="timed steps per run (resnet_synthetic.py's default: 60)")
    g.add_argument("--tag", default="", help="added to the JSON file's name")
    c = sub.add_parser("collect", help="each run's log (bench/results/gpu-scaling-*.log) as JSON beside it")
    c.add_argument("logs", type=Path, nargs="+")
    args = parser.parse_args()
    if args.step == "collect":
        return collect(args.logs)
    if args.step == "render":
        render(args.out, args.hvd_site, parse_env(args.horovod_env), args.steps, args.launcher, args.image,
               args.apptainer, args.image_python)
        return 0
    return run(args.jobs, args.hvd_site, args.python, args.torchrun, args.out, args.gpus.split(","),
               args.modes.split(","), parse_env(args.horovod_env), args.steps, args.tag)


if __name__ == "__main__":
    sys.exit(main())
