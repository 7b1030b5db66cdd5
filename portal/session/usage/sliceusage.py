"""What the session's slice is using against its limits: the one home of that measurement.

Memory and CPU come from the job's own cgroup, found from /proc/self/cgroup and /proc/self/mountinfo
(never a guessed path): Slurm's task/cgroup puts a job at ``.../slurm/uid_<uid>/job_<id>/`` (cgroup
v1) or ``.../system.slice/slurmstepd.scope/job_<id>/`` (v2), and the server and its kernels in a step
below it. The limit that binds is the smallest one on the way up (Slurm sets it on the job and the
step, not the task), and that cgroup's own use and OOM-kill count are what the kernel's OOM killer
goes by, so those are the ones reported. Memory "used" is the working set (use less reclaimable page
cache), as the OOM killer would find it.

The GPUs are the job's alone (Slurm's SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES, slurmclient.job_gpus),
read through NVML (nvidia-ml-py): utilisation and memory of each. A slice without GPUs reads none,
and never loads NVML.

The gauges (gauges.py: dsportal/api/usage, JupyterLab's status bar), idle reclaim's GPU-busy signal
(activity.py) and the limits jupyter-resource-usage is given all read through here.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from portal.core.sessionvars import GPU_SHARE
from portal.slurm.slurmclient import job_gpus

UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2**63-1; anything above this is none


# ------------------------------------------------------------------ where the job's cgroups are
@dataclass(frozen=True)
class Cgroup:
    """One cgroup folder and its version (1: one hierarchy per controller; 2: unified)."""

    path: Path
    version: int

    def read(self, name: str) -> str | None:
        try:
            return (self.path / name).read_text()
        except OSError:
            return None

    def parent(self, top: Path) -> Cgroup | None:
        return Cgroup(self.path.parent, self.version) if self.path != top else None


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup -> {controller: path}; the v2 (unified) path under the key ""."""
    where = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            where[controller.removeprefix("name=")] = path
    return where


def parse_mountinfo(text: str) -> dict[str, tuple[str, str]]:
    """/proc/self/mountinfo -> {controller: (root in the hierarchy, mount point)}; cgroup2's under "".
    Where a controller is mounted twice, the first mount counts (the host's, before any bind)."""
    mounts: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if tail[0] == "cgroup2":
            mounts.setdefault("", (root, point))
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                if option not in ("rw", "ro") and "=" not in option:
                    mounts.setdefault(option, (root, point))
                elif option.startswith("name="):
                    mounts.setdefault(option[5:], (root, point))
    return mounts


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def cgroup_of(controller: str, proc_cgroup: dict[str, str], mounts: dict[str, tuple[str, str]]) -> tuple[Cgroup, Path] | None:
    """The cgroup of this process for ``controller`` (v1 where the controller is mounted there, else
    the unified v2 hierarchy if it has the controller), with the mounted hierarchy's top."""
    for key, version in ((controller, 1), ("", 2)):
        if key not in proc_cgroup or key not in mounts:
            continue
        root, point = mounts[key]
        path = proc_cgroup[key]
        if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
            path = path[len(root.rstrip("/")):]  # a container's cgroup namespace / bind of a sub-tree
        folder = Path(point) / path.lstrip("/")
        if version == 2 and controller not in ((Path(point) / "cgroup.controllers").read_text().split()
                                               if (Path(point) / "cgroup.controllers").exists() else []):
            continue  # a hybrid host's unified tree without the controller (cgroup v1 has it)
        if folder.is_dir():
            return Cgroup(folder, version), Path(point)
    return None


def _number(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= UNLIMITED else value


def parse_flat_keyed(text: str | None) -> dict[str, int]:
    """memory.stat, memory.events, cpu.stat, memory.oom_control: ``key value`` per line."""
    values = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    return values


# ------------------------------------------------------------------ memory
@dataclass
class Memory:
    used_bytes: int
    limit_bytes: int
    limit_from: str  # "cgroup" (the job's limit) or "node" (no cgroup limit: the node's memory)
    oom_kills: int  # processes the OOM killer has killed in the limiting cgroup (v2 memory.events; v1 oom_control)
    hits: int  # v1 memory.failcnt / v2 memory.events "max": times use reached the limit
    cgroup: str = ""

    @property
    def fraction(self) -> float:
        return self.used_bytes / self.limit_bytes if self.limit_bytes else 0.0


def _memory_limit(group: Cgroup) -> int | None:
    if group.version == 2:
        return _number(group.read("memory.max"))
    return _number(group.read("memory.limit_in_bytes"))


def _node_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def job_top(group: Cgroup, top: Path) -> Path:
    """Slurm's cgroup of the job (``job_<id>``) on the way up from ``group``, where there is one: above
    it the cgroups hold every job of the node (a site's limit on ``slurm/`` is not the job's, nor are
    its neighbours' OOM kills). Else ``top``."""
    for folder in (group.path, *group.path.parents):
        if folder == top or not folder.is_relative_to(top):
            break
        if re.fullmatch(r"job_\d+", folder.name):
            return folder
    return top


def limiting_cgroup(start: Cgroup, top: Path, limit=_memory_limit) -> tuple[Cgroup, int | None]:
    """The cgroup on the way from ``start`` up to ``top`` with the smallest limit (the nearest of
    equals): the one whose limit the OOM killer enforces. None where no cgroup sets one."""
    best, best_limit, group = start, None, start
    while group is not None:
        value = limit(group)
        if value is not None and (best_limit is None or value < best_limit):
            best, best_limit = group, value
        group = group.parent(top)
    return best, best_limit


def _v1_oom_kills_below(group: Cgroup) -> int:
    """cgroup v1 counts an OOM kill in the memory cgroup of the process killed, not in the one whose
    limit was reached (Slurm: the kill shows in job_N/step_batch/task_0, the limit is on job_N): the
    count of ``group`` and every cgroup below it. (v2's memory.events already counts its descendants.)"""
    total = 0
    for folder, _, files in os.walk(group.path):
        if "memory.oom_control" in files:
            total += parse_flat_keyed(Cgroup(Path(folder), 1).read("memory.oom_control")).get("oom_kill", 0)
    return total


def read_memory(group: Cgroup | None, top: Path | None) -> Memory:
    if group is None or top is None:
        total = _node_memory()
        return Memory(used_bytes=total - _node_available(), limit_bytes=total, limit_from="node", oom_kills=0, hits=0)
    group, limit = limiting_cgroup(group, top)
    if group.read("memory.current" if group.version == 2 else "memory.usage_in_bytes") is None:
        # The job's cgroup keeps no memory accounting (Slurm without ConstrainRAMSpace, on cgroup v2
        # the memory controller not enabled there): what the session's own processes hold, against the node.
        return Memory(_process_tree_rss(), _node_memory(), "node", 0, 0, str(group.path))
    stat = parse_flat_keyed(group.read("memory.stat"))
    if group.version == 2:
        usage = _number(group.read("memory.current")) or 0
        inactive = stat.get("inactive_file", 0)
        events = parse_flat_keyed(group.read("memory.events"))
        oom_kills, hits = events.get("oom_kill", 0), events.get("max", 0)
    else:
        usage = _number(group.read("memory.usage_in_bytes")) or 0
        inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
        oom_kills = _v1_oom_kills_below(group)
        hits = _number(group.read("memory.failcnt")) or 0
    used = max(0, usage - inactive)
    if limit is None:
        return Memory(used, _node_memory(), "node", oom_kills, hits, str(group.path))
    return Memory(used, limit, "cgroup", oom_kills, hits, str(group.path))


def _node_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


# ------------------------------------------------------------------ CPU
@dataclass
class Cpu:
    used_cores: float  # CPU time per wall time since the last reading, in cores
    cores: float  # what the slice may use
    cores_from: str  # "quota" (cgroup CPU bandwidth), "cpuset" (the cores it may run on), "slurm" (its allocation)


def parse_cpu_max(text: str | None) -> float | None:
    """v2 cpu.max ``<quota> <period>`` -> cores, None for ``max``."""
    parts = (text or "").split()
    if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit() and int(parts[1]):
        return int(parts[0]) / int(parts[1])
    return None


def _quota_cores(group: Cgroup) -> float | None:
    if group.version == 2:
        return parse_cpu_max(group.read("cpu.max"))
    quota, period = _number(group.read("cpu.cfs_quota_us")), _number(group.read("cpu.cfs_period_us"))
    return quota / period if quota and quota > 0 and period else None


def slice_cores(quota_cores: float | None, affinity: int, slurm_cpus: int | None) -> tuple[float, str]:
    """The cores the slice may use: Slurm's allocation where there is one (the cpuset equals it where
    the node confines cores; where it does not, the cpuset is the whole node's), else the cores it may
    run on; a tighter CPU quota wins over either."""
    cores, source = (float(slurm_cpus), "slurm") if slurm_cpus else (float(affinity), "cpuset")
    if quota_cores and quota_cores < cores:
        return quota_cores, "quota"
    return cores, source


def _cpu_seconds(group: Cgroup) -> float | None:
    if group.version == 2:
        usec = parse_flat_keyed(group.read("cpu.stat")).get("usage_usec")
        return usec / 1e6 if usec is not None else None
    nanoseconds = _number(group.read("cpuacct.usage"))
    return nanoseconds / 1e9 if nanoseconds is not None else None


# ------------------------------------------------------------------ GPUs
def share_per_gpu(environ=os.environ) -> int:
    """4 for a session holding one share of 4 of its GPU (sessionvars.GPU_SHARE "1/4"); 0 for whole GPUs."""
    found = re.fullmatch(r"1/([0-9]{1,2})", environ.get(GPU_SHARE, ""))
    return int(found.group(1)) if found and int(found.group(1)) > 1 else 0


@dataclass
class Gpu:
    index: int  # the device's minor number (/dev/nvidiaN), as Slurm names it
    name: str = ""
    uuid: str = ""
    utilization_percent: int | None = None  # the whole GPU's: every session sharing it counts
    memory_used_bytes: int | None = None  # the whole GPU's; on a share, own_memory_bytes is this session's
    memory_total_bytes: int | None = None
    error: str = ""  # why there is no reading, in words
    share: int = 0  # this session holds 1/share of the GPU (0: all of it)
    own_memory_bytes: int | None = None  # on a share: what this session's processes hold on it
    own_utilization_percent: int | None = None  # on a share: its processes' part of the GPU's time (NVML's samples)
    share_memory_bytes: int | None = None  # on a share: its part of the GPU's memory (not enforced)


class Nvml:
    """NVML, initialised once on first use (nvmlInit costs tens of milliseconds: not at session start)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._ready: bool | None = None
        self.error = ""

    def _init(self):
        import pynvml  # nvidia-ml-py: loaded only for a slice with GPUs

        with self._lock:
            if self._ready is None:
                try:
                    pynvml.nvmlInit()
                    self._ready = True
                except pynvml.NVMLError as error:
                    self._ready, self.error = False, f"NVML unavailable: {error}"
        return pynvml if self._ready else None

    def read(self, mine: set[int], uuids: set[str], share: int = 0, own_pids: set[int] | None = None) -> list[Gpu]:
        """The job's GPUs. Where the node confines each job to its own devices, NVML opens only those:
        then all of them are the job's, whatever their numbers (as nvidia-smi shows it)."""
        pynvml = self._init()
        if pynvml is None:
            return [Gpu(index=minor, error=self.error, share=share) for minor in sorted(mine)]
        readings = []
        for position in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(position)
                minor = pynvml.nvmlDeviceGetMinorNumber(handle)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
            except pynvml.NVMLError:
                continue  # another job's device (the device cgroup refuses it)
            gpu = Gpu(index=minor, uuid=uuid)
            try:
                gpu.name = pynvml.nvmlDeviceGetName(handle)
                gpu.utilization_percent = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                gpu.memory_used_bytes, gpu.memory_total_bytes = int(memory.used), int(memory.total)
                if share:  # what this session holds of a GPU others hold shares of too
                    gpu.share, gpu.share_memory_bytes = share, int(memory.total) // share
                    gpu.own_memory_bytes = sum(
                        int(process.usedGpuMemory or 0) for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                        if process.pid in (own_pids or set()))
                    gpu.own_utilization_percent = own_utilization(pynvml, handle, own_pids or set())
            except pynvml.NVMLError as error:
                gpu.error = f"no reading: {error}"
            readings.append(gpu)
        return only_the_jobs(readings, mine, uuids)


def own_utilization(pynvml, handle, own_pids: set[int]) -> int:
    """This session's processes' part of a shared GPU's time, from NVML's recent per-process samples
    (SM %, summed over its processes, at most 100): a neighbour's work on the same GPU is not this
    session's use. 0 where there are none."""
    try:
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, int((time.time() - 10) * 1e6))
    except pynvml.NVMLError:  # no samples in that time (NVML_ERROR_NOT_FOUND): nobody ran on it
        return 0
    latest: dict[int, tuple[int, int]] = {}
    for sample in samples:  # the newest sample of each of her processes
        if sample.pid in own_pids and sample.timeStamp >= latest.get(sample.pid, (0, 0))[0]:
            latest[sample.pid] = (sample.timeStamp, int(sample.smUtil))
    return min(100, sum(util for _, util in latest.values()))


def only_the_jobs(readings: list[Gpu], mine: set[int], uuids: set[str]) -> list[Gpu]:
    """The job's own GPUs among NVML's readings. A node that lets each job open only its own devices
    shows no more than the job holds: all of them are the job's, whatever their numbers. Otherwise only
    those Slurm names (minor number or UUID), counted by the GPUs the job holds, not by its names for
    them (SLURM_JOB_GPUS and UUIDs in CUDA_VISIBLE_DEVICES name the same GPUs twice): never a neighbour's."""
    if len(readings) > max(len(mine), len(uuids)):
        readings = [gpu for gpu in readings if gpu.index in mine or gpu.uuid in uuids]
    return sorted(readings, key=lambda gpu: gpu.index)


def job_gpu_uuids(environ=os.environ) -> set[str]:
    """CUDA_VISIBLE_DEVICES given as UUIDs (some sites' GRES setup) rather than numbers."""
    return {part.strip() for part in environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
            if part.strip().startswith(("GPU-", "MIG-"))}


# ------------------------------------------------------------------ the slice
@dataclass
class Usage:
    memory: Memory
    cpu: Cpu
    gpus: list[Gpu] = field(default_factory=list)
    job_id: str | None = None
    read_at: float = 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "memory": {**asdict(self.memory), "fraction": round(self.memory.fraction, 4)}}


class SliceUsage:
    """Readings of this process's slice. One per server (``shared()``): CPU use is the CPU time
    between two readings, so its last reading is kept."""

    def __init__(self, environ=os.environ, proc: Path = Path("/proc/self")):
        proc_cgroup = parse_proc_cgroup((proc / "cgroup").read_text())
        mounts = parse_mountinfo((proc / "mountinfo").read_text())
        memory = cgroup_of("memory", proc_cgroup, mounts)
        cpu = cgroup_of("cpuacct", proc_cgroup, mounts) or cgroup_of("cpu", proc_cgroup, mounts)
        quota = cgroup_of("cpu", proc_cgroup, mounts)
        self.memory_group, self.memory_top = (memory[0], job_top(*memory)) if memory else (None, None)
        self.cpu_group = cpu[0] if cpu and cpu[0].path != cpu[1] else None  # the root cgroup is the node's
        quota_cores = None
        if quota:
            _, quota_cores = limiting_cgroup(quota[0], job_top(*quota), _quota_cores)
        slurm_cpus = environ.get("SLURM_CPUS_ON_NODE") or environ.get("SLURM_CPUS_PER_TASK") or ""
        self.cores, self.cores_from = slice_cores(quota_cores, len(os.sched_getaffinity(0)),
                                                  int(slurm_cpus) if slurm_cpus.isdigit() else None)
        self.gpus, self.gpu_uuids = job_gpus(environ), job_gpu_uuids(environ)
        self.share = share_per_gpu(environ)
        self.job_id = environ.get("SLURM_JOB_ID")
        self.nvml = Nvml()
        self._last_cpu: tuple[float, float] | None = None

    def memory(self) -> Memory:
        return read_memory(self.memory_group, self.memory_top)

    def memory_limit(self) -> int:
        return self.memory().limit_bytes

    def cpu(self) -> Cpu:
        now = time.monotonic()
        seconds = _cpu_seconds(self.cpu_group) if self.cpu_group else _process_tree_cpu_seconds()
        used = 0.0
        if seconds is not None and self._last_cpu and now > self._last_cpu[0]:
            used = max(0.0, (seconds - self._last_cpu[1]) / (now - self._last_cpu[0]))
        if seconds is not None:
            self._last_cpu = (now, seconds)
        return Cpu(round(used, 2), self.cores, self.cores_from)

    def read_gpus(self) -> list[Gpu]:
        if not self.gpus and not self.gpu_uuids:
            return []  # a CPU slice: no GPU, and NVML is never loaded
        return self.nvml.read(self.gpus, self.gpu_uuids, self.share, self.job_pids() if self.share else None)

    def job_pids(self) -> set[int]:
        """The processes of this session's job (its cgroup and those below it: kernels, containers, the
        server), as NVML names a GPU's users: what on a shared GPU is this session's."""
        top = self.memory_top
        pids: set[int] = set()
        if not top or not re.fullmatch(r"job_\d+", Path(top).name):  # not in a Slurm job: never the node's
            return {os.getpid()}
        for folder, _, files in os.walk(top):
            if "cgroup.procs" in files:
                try:
                    pids.update(int(line) for line in Path(folder, "cgroup.procs").read_text().split())
                except (OSError, ValueError):
                    continue
        return pids

    def read(self) -> Usage:
        return Usage(self.memory(), self.cpu(), self.read_gpus(), self.job_id, time.time())


def _process_tree_cpu_seconds() -> float | None:
    """Outside a job's cgroup (a server started by hand): the server's and its children's CPU time."""
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def _process_tree_rss() -> int:
    """The resident memory of this server and its children (kernels, terminals)."""
    try:
        import psutil
    except ImportError:
        return 0
    me = psutil.Process()
    total = 0
    for process in [me, *me.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total


_shared: SliceUsage | None = None


def shared() -> SliceUsage:
    global _shared
    if _shared is None:
        _shared = SliceUsage()
    return _shared


def busy_gpus(gpus: list[Gpu], threshold: int) -> list[int]:
    """The GPUs (minor numbers) at or above ``threshold`` % utilisation: they count as use."""
    busy = []
    for gpu in gpus:
        # On a share, what its own processes use: a neighbour busy on the same GPU keeps no idle share.
        percent = gpu.own_utilization_percent if gpu.share else gpu.utilization_percent
        if percent is not None and percent >= threshold:
            busy.append(gpu.index)
    return busy
