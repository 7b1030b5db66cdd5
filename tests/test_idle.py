"""Idle GPU sessions are stopped so their GPUs go back to the queue; working ones are kept.

A second hub with a 30 s idle limit for GPU sessions (production: hours) and activity reports
every 2 s, on the real cluster: alice leaves her GPU session alone with JupyterLab still open
(polling it), bob's kernel runs a long cell that prints nothing, carol's session has no GPU
(no limit for those in this profile).
"""

from __future__ import annotations

import threading
import time

from playwright.sync_api import sync_playwright

from conftest import login
from hubclient import active_jobs, squeue_jobs
from portal.slurm.slurmparse import job_gpus
from test_browser import ARGS, CHROMIUM, SHOTS

LIMIT = 30


def idle_config(config) -> None:
    config["hub"].update(poll_interval=2)
    config["session"] = {**config.get("session", {}), "activity_interval": 2}
    for profile in config["profiles"]:
        profile["idle_timeout"] = f"00:00:{LIMIT}"
        profile.pop("idle_timeout_without_gpu", None)


def wait_stopped(user, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not user.model()["servers"]:
            return True
        time.sleep(1)
    return False


def test_unused_gpu_session_is_stopped_and_busy_ones_are_kept(second_hub):
    base = second_hub(idle_config)
    alice, bob, carol = login(base, "alice"), login(base, "bob"), login(base, "carol")
    form = alice.web.get(f"{base}/hub/spawn").text
    assert f"nobody uses for 00:00:{LIMIT} is stopped" in form

    alice.spawn({"profile": "gpu", "gpus": "1"})
    bob.spawn({"profile": "gpu", "gpus": "1"})
    carol.spawn({"profile": "cpu"})
    carol.spawn({"profile": "gpu", "gpus": "1"}, server="train")  # a second session of hers, left unused
    alice_job = active_jobs("alice")[0]["job_id"]

    # bob: one cell that computes for 3 x the limit without printing anything.
    result = {}
    cell = threading.Thread(target=lambda: result.update(out=bob.run_code(
        f"import time\nend = time.time() + {3 * LIMIT}\nwhile time.time() < end: sum(range(10000))\nprint('done')",
        timeout=6 * LIMIT)))
    cell.start()

    SHOTS.mkdir(exist_ok=True)
    # alice left JupyterLab open in her browser: it keeps polling her session; that is not use.
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{base}/hub/login")
        page.fill("#username_input", "alice")
        page.fill("#password_input", "alice-demo")
        page.click("#login_submit")
        page.wait_for_url("**/user/alice/**", timeout=60_000)
        page.goto(f"{base}/user/alice/lab?reset")
        page.wait_for_function("window.dsportalLab && window.dsportalLab.loaded", timeout=90_000)
        # The idle clock starts now (a busy machine may take a while to load JupyterLab).
        assert alice.api("POST", "/user/alice/dsportal/api/idle").json()["idle_s"] == 0
        # Before the hub stops it, JupyterLab warns, with a button that keeps the session.
        warning = page.get_by_text("This session has not been used for")
        warning.wait_for(timeout=(LIMIT + 30) * 1000)
        assert "so its resources go back to others" in warning.inner_text()
        page.wait_for_timeout(1000)  # the notification slides in
        page.screenshot(path=str(SHOTS / "idle-warning.png"))
        page.get_by_role("button", name="Keep my session").click()
        page.get_by_text("Your session is kept").wait_for(timeout=10_000)
        page.wait_for_timeout(LIMIT // 2 * 1000)
        assert alice.model()["servers"], "alice's session was stopped although she kept it"
        deadline = time.monotonic() + LIMIT + 90
        while alice.model()["servers"] and time.monotonic() < deadline:
            page.wait_for_timeout(1000)  # the tab stays open, JupyterLab polls as it does
        assert not alice.model()["servers"], "alice's unused GPU session was not stopped"
        # Her next visit to her JupyterLab says what happened.
        page.goto(f"{base}/user/alice/lab")
        page.get_by_text("without use, to give its 1 GPU(s) back to others").wait_for(timeout=30_000)
        page.screenshot(path=str(SHOTS / "idle-session-stopped.png"))
        browser.close()
    ended = squeue_jobs().get(alice_job)
    assert ended is None or ended["job_state"] in ("CANCELLED", "COMPLETING"), ended
    page = alice.web.get(f"{base}/hub/home").text
    assert f"Your session job {alice_job} was stopped after" in page
    assert "without use, to give its 1 GPU(s) back to others" in page

    cell.join()
    assert result.get("out", "").strip() == "done", result
    assert bob.model()["servers"], "bob's session was stopped while his kernel was computing"
    # Each session is judged on its own: carol's unused GPU session went, her CPU session beside it stays.
    assert list(carol.model()["servers"]) == [""], "a session without GPUs was stopped (no limit for those here)"
    assert "Session train: Your session job" in carol.web.get(f"{base}/hub/home").text
    # Once bob's cell is over, his session is unused too.
    assert wait_stopped(bob, timeout=LIMIT + 60)
    # Counted for the admins' dashboards (this hub's own /hub/metrics).
    metrics = login(base, "dave").api("GET", "/hub/metrics").text
    assert 'dsportal_idle_gpus_reclaimed_total{partition="gpu"} 3.0' in metrics
    assert 'dsportal_sessions_ended_outside_total{how="IDLE",partition="gpu"} 3.0' in metrics or \
        'dsportal_sessions_ended_outside_total{partition="gpu",how="IDLE"} 3.0' in metrics
    carol.stop_server()


def test_gpu_readings_count_only_the_jobs_own_gpus():
    # NVML readings and which are the job's: tests/test_sliceusage.py (the one measurement)
    assert job_gpus({"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}) == {2, 3}
    assert job_gpus({}) == set()
