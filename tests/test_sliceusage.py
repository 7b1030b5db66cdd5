"""What the slice's gauges parse: /proc/self/cgroup, mountinfo, cgroup files, the job's GPUs.

The measurement itself runs against real cgroups and a real server in test_slice_usage_local.py,
on the demo in test_gauges.py, and on a real GPU in bench/results/gpu-validation.md; these pin the parsing."""

from pathlib import Path

import pytest

from portal.session.usage.sliceusage import (
    Cgroup,
    Gpu,
    busy_gpus,
    cgroup_of,
    job_gpu_uuids,
    job_top,
    limiting_cgroup,
    only_the_jobs,
    parse_cpu_max,
    parse_flat_keyed,
    parse_mountinfo,
    parse_proc_cgroup,
    read_memory,
    slice_cores,
)

pytestmark = pytest.mark.quick

V1 = """12:memory:/slurm/uid_1001/job_42/step_batch/task_0
3:cpu,cpuacct:/slurm/uid_1001/job_42/step_batch/task_0
1:name=systemd:/user.slice
0::/user.slice
"""
MOUNTS = """30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
24 25 0:22 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
"""


def test_v1_and_v2_places_of_a_job_are_read_not_guessed():
    where = parse_proc_cgroup(V1)
    assert where["memory"] == where["cpuacct"] == "/slurm/uid_1001/job_42/step_batch/task_0"
    assert where[""] == "/user.slice" and where["systemd"] == "/user.slice"
    mounts = parse_mountinfo(MOUNTS)
    assert mounts["memory"] == ("/", "/sys/fs/cgroup/memory")
    assert mounts["cpuacct"] == mounts["cpu"] == ("/", "/sys/fs/cgroup/cpu,cpuacct")
    assert mounts[""] == ("/", "/sys/fs/cgroup/unified")


def test_the_smallest_limit_on_the_way_up_is_the_one_that_binds(tmp_path):
    # Slurm v2: the limit on job_<id>, none on the step and task below it.
    top = tmp_path
    job = top / "system.slice" / "slurmstepd.scope" / "job_42"
    task = job / "step_batch" / "user" / "task_0"
    task.mkdir(parents=True)
    for folder in (top / "system.slice", job.parent, job / "step_batch", job / "step_batch" / "user", task):
        (folder / "memory.max").write_text("max\n")
    (job / "memory.max").write_text(str(2 << 30))
    (job / "memory.current").write_text(str(1 << 30))
    (job / "memory.stat").write_text("anon 805306368\ninactive_file 268435456\n")
    (job / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")
    group, limit = limiting_cgroup(Cgroup(task, 2), top)
    assert (group.path, limit) == (job, 2 << 30)
    memory = read_memory(Cgroup(task, 2), top)
    assert (memory.limit_bytes, memory.used_bytes, memory.oom_kills, memory.hits) == (2 << 30, 768 << 20, 1, 7)
    assert memory.limit_from == "cgroup" and memory.fraction == 0.375


def test_v1_memory_counts_the_oom_killer_and_leaves_page_cache_out(tmp_path):
    job = tmp_path / "slurm" / "uid_1001" / "job_42"
    job.mkdir(parents=True)
    (job / "memory.limit_in_bytes").write_text(str(4 << 30))
    (job / "memory.usage_in_bytes").write_text(str(3 << 30))
    (job / "memory.stat").write_text("cache 1073741824\ntotal_inactive_file 1073741824\n")
    (job / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (job / "memory.failcnt").write_text("12\n")
    for folder in (tmp_path / "slurm", tmp_path / "slurm" / "uid_1001"):
        (folder / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    memory = read_memory(Cgroup(job, 1), tmp_path)
    assert (memory.limit_bytes, memory.used_bytes, memory.oom_kills, memory.hits) == (4 << 30, 2 << 30, 2, 12)
    # v1 counts a kill where the killed process lives, below the limit (Slurm: job_N/step_batch/task_0).
    task = job / "step_batch" / "task_0"
    task.mkdir(parents=True)
    (task / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert read_memory(Cgroup(job, 1), tmp_path).oom_kills == 3


def test_the_slices_cores():
    assert parse_cpu_max("max 100000") is None and parse_cpu_max("250000 100000") == 2.5
    assert slice_cores(None, affinity=2, slurm_cpus=4) == (4.0, "slurm")  # a node that does not confine cores
    assert slice_cores(None, affinity=8, slurm_cpus=None) == (8.0, "cpuset")
    assert slice_cores(0.5, affinity=8, slurm_cpus=4) == (0.5, "quota")
    assert parse_flat_keyed("usage_usec 1500000\nuser_usec 1000000\n")["usage_usec"] == 1500000


def test_only_the_jobs_gpus_and_the_busy_ones():
    readings = [Gpu(index=0, uuid="GPU-a", utilization_percent=0), Gpu(index=1, uuid="GPU-b", utilization_percent=37),
                Gpu(index=2, uuid="GPU-c", utilization_percent=90), Gpu(index=3, uuid="GPU-d", utilization_percent=3)]
    mine = only_the_jobs(readings, {1, 3}, set())
    assert [gpu.index for gpu in mine] == [1, 3]  # GPU 2 is busy, but it is somebody else's
    assert busy_gpus(mine, threshold=5) == [1]
    # A node that lets each job open only its own devices: all NVML opens are the job's.
    assert [gpu.index for gpu in only_the_jobs(readings[1:2] + readings[3:], {0, 1}, set())] == [1, 3]
    assert [gpu.index for gpu in only_the_jobs(readings, set(), {"GPU-c"})] == [2]
    # An unconfined node, the job's 2 GPUs named both ways (minor numbers and UUIDs): still only those 2.
    assert [gpu.index for gpu in only_the_jobs(readings, {2, 3}, {"GPU-c", "GPU-d"})] == [2, 3]
    assert job_gpu_uuids({"CUDA_VISIBLE_DEVICES": "GPU-c,MIG-x"}) == {"GPU-c", "MIG-x"}
    assert busy_gpus([Gpu(index=0, error="NVML unavailable")], threshold=5) == []


def test_a_hybrid_hosts_unified_tree_without_the_controller_is_passed_over(tmp_path):
    unified = tmp_path / "unified"
    (unified / "job").mkdir(parents=True)
    (unified / "cgroup.controllers").write_text("")
    assert cgroup_of("memory", {"": "/job"}, {"": ("/", str(unified))}) is None
    (unified / "cgroup.controllers").write_text("cpu memory")
    group, top = cgroup_of("memory", {"": "/job"}, {"": ("/", str(unified))})
    assert (group.path, group.version, top) == (unified / "job", 2, Path(unified))


def test_a_job_cgroup_without_memory_accounting_reads_the_sessions_processes(tmp_path):
    """Slurm without ConstrainRAMSpace on cgroup v2 (the GPU machine's): the job's cgroup has no memory
    files; the reading is what this process and its children hold, against the node's memory."""
    job = tmp_path / "system.slice" / "node_slurmstepd.scope" / "job_2" / "step_batch" / "user" / "task_0"
    job.mkdir(parents=True)
    (job / "cgroup.procs").write_text("1\n")
    memory = read_memory(Cgroup(job, 2), tmp_path)
    assert memory.limit_from == "node" and memory.oom_kills == 0
    assert 10 << 20 < memory.used_bytes < memory.limit_bytes  # this Python's own resident memory, at least


def test_nothing_above_the_jobs_own_cgroup_is_taken_for_the_job(tmp_path):
    """A site's limit on slurm/ (every job of the node) is not the job's, nor a neighbour's OOM kill."""
    slurm = tmp_path / "slurm"
    job = slurm / "uid_1001" / "job_42"
    task = job / "step_batch" / "task_0"
    neighbour = slurm / "uid_1002" / "job_43" / "step_batch" / "task_0"
    for folder in (task, neighbour):
        folder.mkdir(parents=True)
    for folder in (slurm, slurm / "uid_1001", job, job / "step_batch", task):
        (folder / "memory.limit_in_bytes").write_text("9223372036854771712\n")
        (folder / "memory.usage_in_bytes").write_text(str(1 << 30))
    (slurm / "memory.limit_in_bytes").write_text(str(64 << 30))  # the node's jobs together
    (neighbour / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    top = job_top(Cgroup(task, 1), tmp_path)
    assert top == job
    memory = read_memory(Cgroup(task, 1), top)
    assert memory.limit_from == "node" and memory.oom_kills == 0
    assert job_top(Cgroup(tmp_path / "user.slice", 1), tmp_path) == tmp_path  # outside a job: as before
