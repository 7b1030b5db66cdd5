"""CPU time a session and a kernel cost, read from the real processes of the session's Slurm job.

A session's start: utime + stime of every process of the job's steps (its cgroups on the node;
the batch script, or srun's step where stock batchspawner starts its server; not the extern step's
sleep), plus what they reaped (cutime + cstime: the kernelspec writer, short helpers), read when
the hub says the session is ready: the batch script, the entry point, the Jupyter server and its
extensions. A kernel's start: the kernel process's own CPU time after its first answer.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
FREEZER = Path("/sys/fs/cgroup/freezer")


def _process_times(pid: int) -> tuple[float, float, float, float]:
    """(utime, stime, cutime, cstime) of a process, in seconds (zeros if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0, 0.0, 0.0
    return tuple(int(fields[i]) / TICKS for i in (11, 12, 13, 14))  # fields 14-17 of proc(5)


def process_cpu(pid: int, waited_children: bool = True) -> float:
    """utime + stime of a process, and cutime + cstime (the children it waited for) unless not
    ``waited_children``, in seconds (0 if it is gone)."""
    return sum(_process_times(pid)[:4 if waited_children else 2])


def _job_pids(job_id: int) -> set[int]:
    pids = set()
    for procs in FREEZER.glob(f"slurm_*/uid_*/job_{job_id}/step_*/cgroup.procs"):
        if procs.parent.name != "step_extern":
            pids |= {int(line) for line in procs.read_text().split()}
    if not pids:
        raise RuntimeError(f"no processes of job {job_id} found under {FREEZER} (cgroup v1 freezer, proctrack/cgroup)")
    return pids


def job_cpu_seconds(job_id: int) -> float:
    """CPU seconds of the job's steps so far, on whichever node runs it."""
    return sum(process_cpu(pid) for pid in _job_pids(job_id))


def job_cpu_parts(job_id: int) -> dict[str, float]:
    """The job's CPU seconds so far in parts: ``running`` (its processes' own utime + stime: the
    server, and kernels still running), ``reaped`` (what they waited for: kernels shut down, short
    helpers), and ``system`` (the kernel-mode share of both, utime left out)."""
    parts = {"running": 0.0, "reaped": 0.0, "system": 0.0}
    for pid in _job_pids(job_id):
        utime, stime, cutime, cstime = _process_times(pid)
        parts["running"] += utime + stime
        parts["reaped"] += cutime + cstime
        parts["system"] += stime + cstime
    return parts


def kernel_cpu_seconds(user) -> float:
    """Start a Python kernel in the user's session, get its first answer (its pid): its CPU seconds."""
    pid = int(user.run_code("import os; print(os.getpid())", timeout=120, keep=True).strip())
    return process_cpu(pid)
