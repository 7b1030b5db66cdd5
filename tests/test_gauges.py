"""The slice's gauges in a real session job: the job cgroup's limit (not the node's), its cores, its
GPUs, and a kernel killed by the memory limit said so (the demo's Slurm task/cgroup, real kernels)."""

import pwd
import time
from pathlib import Path

import pytest

from conftest import stop_and_wait
from hubclient import HubUser, active_jobs, slice_memory_limit

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
    # Its Prometheus loop is off: every second it walked every process of the node, for each session,
    # to feed a /metrics nobody reads (bench/results/session-start.md).
    log = Path(pwd.getpwnam("alice").pw_dir, ".dsportal/logs", f"session-{usage['job_id']}.log").read_text()
    assert "Prometheus metrics reporting disabled in jupyter_resource_usage" in log
    # Reading the gauges is not use (an open JupyterLab reads them every few seconds).
    idle = alice.api("GET", "/user/alice/dsportal/api/idle").json()["idle_s"]
    assert idle >= 0


def test_gpu_slice_gauges_show_each_of_its_gpus_and_its_limit(alice):
    alice.spawn({"profile": "gpu", "gpus": 2})  # 16 CPUs, 96 GB
    usage = usage_of(alice)
    # The job cgroup's limit: the slice's 96 GB, capped by Slurm at the node's memory (slice_memory_limit).
    expected = slice_memory_limit(96 * GiB)  # Slurm's value, page-aligned by the kernel
    assert usage["memory"]["limit_from"] == "cgroup", usage["memory"]
    assert expected - (64 << 20) <= usage["memory"]["limit_bytes"] <= expected, usage["memory"]
    assert usage["cpu"]["cores"] == 16
    mine = alice.run_code("import os; print(os.environ.get('SLURM_JOB_GPUS') or os.environ['CUDA_VISIBLE_DEVICES'])")
    assert [gpu["index"] for gpu in usage["gpus"]] == sorted(int(n) for n in mine.strip().split(","))
    for gpu in usage["gpus"]:
        # The demo's GPUs are device files without a driver: each is listed, with why it has no reading.
        # (Real GPUs: utilisation and memory from NVML, bench/results/gpu-validation.md.)
        assert gpu["utilization_percent"] is None and gpu["error"].startswith("NVML unavailable"), gpu


@pytest.fixture
def student(portal, admin):
    """A student of class101: the profile "class", one core and 2 GB."""
    user = HubUser(portal, "student01").must_login("student01-demo")
    yield user
    stop_and_wait(admin, "student01")


def test_a_kernel_killed_by_the_memory_limit_is_said_so(student):
    """...in the API and in her JupyterLab, open in a real browser: the status bar shows her 2 GB slice,
    and when the limit kills her kernel a notification says so."""
    from playwright.sync_api import sync_playwright

    from test_browser import ARGS, CHROMIUM, HUB, SHOTS, log_in

    student.spawn({"profile": "class"})
    assert usage_of(student)["memory"]["limit_bytes"] == 2 * GiB
    kills = usage_of(student)["memory"]["oom_kills"]
    prefix = "/user/student01/api/kernels"
    kernel = student.api("POST", prefix, json={"name": "python3"}).json()["id"]
    SHOTS.mkdir(exist_ok=True)
    playwright = sync_playwright().start()
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
    try:
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        log_in(page, "student01")
        page.goto(f"{HUB}/user/student01/lab?reset")
        page.wait_for_function("window.dsportalLab && window.dsportalLab.loaded", timeout=90_000)
        gauge = page.locator(".dsportal-UsageStatus")
        gauge.wait_for(timeout=30_000)
        page.wait_for_function("document.querySelector('.dsportal-UsageStatus').textContent.includes('/ 2')",
                               timeout=30_000)
        shown = gauge.inner_text()
        assert shown.startswith("Mem ") and "CPU " in shown and "GPU" not in shown, shown
        gauge.click()  # the details
        page.locator(".dsportal-UsagePanel").wait_for(timeout=10_000)
        # Near the limit (about 95 % with the server), JupyterLab warns before anything is lost.
        ws = student._channels(kernel, 60)
        assert student._execute(ws, "blocks = [bytearray(100 << 20) for _ in range(18)]\nprint('held')", 60).strip() \
            == "held"
        page.locator(".Toastify__toast", has_text="of memory its slice holds").wait_for(timeout=30_000)
        # Past it: the cell is sent, not waited for, the kernel dies under it (its channel then only says so).
        student._ask(ws, "blocks += [bytearray(100 << 20) for _ in range(40)]")
        ws.close()
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
        told = page.locator(".Toastify__toast", has_text="was stopped because your session ran out of memory")
        told.wait_for(timeout=30_000)
        page.screenshot(path=str(SHOTS / "kernel-out-of-memory.png"))
        # The session itself lives on, and the kernel restarted empty.
        ws = student._channels(kernel, 60)
        try:
            assert student._execute(ws, "print('blocks' in dir())", 60).strip() == "False"
        finally:
            ws.close()
    finally:
        browser.close()
        playwright.stop()
        student.api("DELETE", f"{prefix}/{kernel}")
