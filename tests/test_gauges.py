"""The slice's gauges in a real session job: the job cgroup's limit (not the node's), its cores, its
GPUs, and a kernel killed by the memory limit said so (the demo's Slurm task/cgroup, real kernels)."""

import time

import pytest

from conftest import stop_and_wait
from hubclient import HubUser, active_jobs

GiB = 1 << 30


def usage_of(user: HubUser) -> dict:
    response = user.api("GET", f"/user/{user.name}/dsportal/api/usage")
    assert response.status_code == 200, response.text
    return response.json()


def node_memory() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


def test_cpu_slice_gauges_show_its_cgroup_limit_and_cores_and_no_gpu(alice):
    alice.spawn({"profile": "cpu"})  # 4 CPUs, 16 GB
    usage = usage_of(alice)
    assert usage["memory"]["limit_bytes"] == 16 * GiB != node_memory()
    assert usage["memory"]["limit_from"] == "cgroup"
    assert "/job_" in usage["memory"]["cgroup"]  # Slurm's cgroup of the job (or of its step)
    assert 0 < usage["memory"]["used_bytes"] < 2 * GiB
    assert (usage["cpu"]["cores"], usage["cpu"]["cores_from"]) == (4, "slurm")
    assert usage["gpus"] == []
    assert usage["job_id"] == str(active_jobs("alice")[0]["job_id"])
    # jupyter-resource-usage (its kernel usage panel, /api/metrics/v1) is given the same limits.
    metrics = alice.api("GET", "/user/alice/api/metrics/v1").json()
    assert metrics["limits"]["memory"]["rss"] == 16 * GiB
    assert metrics["limits"]["cpu"]["cpu"] == 4
    # Reading the gauges is not use (an open JupyterLab reads them every few seconds).
    idle = alice.api("GET", "/user/alice/dsportal/api/idle").json()["idle_s"]
    assert idle >= 0


def test_gpu_slice_gauges_show_each_of_its_gpus_and_its_limit(alice):
    alice.spawn({"profile": "gpu", "gpus": 2})  # 16 CPUs, 96 GB
    usage = usage_of(alice)
    assert usage["memory"]["limit_bytes"] == 96 * GiB and usage["memory"]["limit_from"] == "cgroup"
    assert usage["cpu"]["cores"] == 16
    mine = alice.run_code("import os; print(os.environ.get('SLURM_JOB_GPUS') or os.environ['CUDA_VISIBLE_DEVICES'])")
    assert [gpu["index"] for gpu in usage["gpus"]] == sorted(int(n) for n in mine.strip().split(","))
    for gpu in usage["gpus"]:
        # The demo's GPUs are device files without a driver: each is listed, with why it has no reading.
        # (Real GPUs: utilisation and memory from NVML, docs/gpu-validation.md.)
        assert gpu["utilization_percent"] is None and gpu["error"].startswith("NVML unavailable"), gpu


@pytest.fixture
def student(portal, admin):
    """A student of class101: the profile "class", one core and 2 GB."""
    user = HubUser(portal, "student01").must_login("student01-demo")
    yield user
    stop_and_wait(admin, "student01")


def test_a_kernel_killed_by_the_memory_limit_is_said_so(student):
    student.spawn({"profile": "class"})
    assert usage_of(student)["memory"]["limit_bytes"] == 2 * GiB
    kills = usage_of(student)["memory"]["oom_kills"]
    prefix = "/user/student01/api/kernels"
    kernel = student.api("POST", prefix, json={"name": "python3"}).json()["id"]
    try:
        with pytest.raises(Exception):  # the kernel dies under the cell: no reply, or a dead status
            student._execute(student._channels(kernel, 30), "blocks = [bytearray(100 << 20) for _ in range(40)]", 30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            usage = usage_of(student)
            if usage["kernel_deaths"]:
                break
            time.sleep(1)
        death = usage["kernel_deaths"][-1]
        assert death["kernel_id"] == kernel and death["by_memory_limit"], usage
        assert usage["memory"]["oom_kills"] > kills
        assert death["message"].startswith("The kernel Python 3 (ipykernel) was stopped because your session ran out "
                                           "of memory: its slice holds 2 GB")
        # The session itself lives on, and the kernel restarted empty.
        ws = student._channels(kernel, 60)
        try:
            assert student._execute(ws, "print('blocks' in dir())", 60).strip() == "False"
        finally:
            ws.close()
    finally:
        student.api("DELETE", f"{prefix}/{kernel}")
