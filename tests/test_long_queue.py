"""A session that waits in Slurm's queue: as long as its profile lets it (not the hub's start
timeout), visibly (its place and Slurm's estimate), as one job whatever the user does meanwhile,
and taken out of the queue in words at the profile's limit. Real hub, real Slurm, a queue filled by
another user's job."""

import re
import subprocess
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from conftest import login, wait_no_jobs
from hubclient import active_jobs

BOOT_SECONDS = 20  # the scratch hub's start_timeout: the time to come up once Slurm runs the job


@contextmanager
def every_gpu_held(user: str = "bob"):
    """Another user's job holding all 8 GPUs of the demo's two nodes; its job id. Cancelled at the end."""
    job = subprocess.run(
        ["runuser", "-u", user, "--", "sbatch", "--parsable", "--partition=gpu", "--nodes=2", "--gres=gpu:4",
         "--mem=1G", "--time=20", "--job-name=gpu-holder", "--output=/dev/null", "--chdir=/tmp", "--wrap=sleep 1200"],
        capture_output=True, text=True, check=True).stdout.strip()
    job_id = int(job.split(";")[0])
    try:
        deadline = time.monotonic() + 60
        while not any(j["job_id"] == job_id and j["job_state"] == "RUNNING" for j in active_jobs(user)):
            assert time.monotonic() < deadline, f"{user}'s GPU holder {job_id} did not start"
            time.sleep(0.5)
        yield job_id
    finally:
        subprocess.run(["scancel", str(job_id)], capture_output=True)


def queue_limit(seconds: str):
    def edit(config):
        config["hub"]["start_timeout"] = BOOT_SECONDS
        next(p for p in config["profiles"] if p["name"] == "gpu")["queue_limit"] = seconds
    return edit


def test_a_queued_session_waits_past_the_hubs_start_timeout_as_one_job_and_starts(second_hub):
    base = second_hub(queue_limit("01:00:00"))
    with every_gpu_held() as holder:
        alice = login(base, "alice")
        assert alice.start_server({"profile": "gpu", "gpus": 1}).status_code == 202
        started = time.monotonic()
        events = alice.progress_events(until=lambda e: time.monotonic() - started > BOOT_SECONDS + 10)
        messages = [e.get("message", "") for e in events]
        queued = [m for m in messages if "queued on partition gpu" in m]
        assert queued and not any("failed" in m.lower() for m in messages), messages
        # Its place in its partition's queue and Slurm's reason, live.
        assert re.search(r"Job (\d+) queued on partition gpu, place 1 of 1 in its queue: waiting for Resources",
                         queued[-1]), queued[-1]
        job_id = int(re.search(r"Job (\d+)", queued[-1]).group(1))

        # She closes the tab and logs in again: the same pending session, the same job, never a second.
        again = login(base, "alice")
        assert again.model()["pending"] == "spawn"
        second_try = again.start_server({"profile": "gpu", "gpus": 1})
        assert second_try.status_code in (202, 400), second_try.text
        assert [j["job_id"] for j in active_jobs("alice")] == [job_id]

        # Past the hub's start_timeout (BOOT_SECONDS) and still waiting; the GPUs come free: it starts.
        assert time.monotonic() - started > BOOT_SECONDS
        released = datetime.now(UTC)
        subprocess.run(["scancel", str(holder)], check=True)
        server = again.wait_ready(timeout=120)
        assert server["ready"]
        assert [j["job_id"] for j in active_jobs("alice")] == [job_id]
        # Its idle clock starts as its server does: the time in the queue is not time left unused
        # (an idle limit shorter than the wait would stop it at once).
        last_activity = datetime.fromisoformat(server["last_activity"].replace("Z", "+00:00"))
        assert last_activity >= released - timedelta(seconds=1), (server["last_activity"], released)


def test_a_session_queued_past_its_profiles_limit_is_taken_out_in_words(second_hub):
    base = second_hub(queue_limit("00:00:30"))
    with every_gpu_held():
        alice = login(base, "alice")
        assert alice.start_server({"profile": "gpu", "gpus": 1}).status_code == 202
        final = alice.progress_events(timeout=180)[-1]["message"]
        assert ("Your session waited 30 s in Slurm's queue for 1 GPU, 8 CPUs, 48 GB, 08:00:00 on gpu (Slurm's reason: "
                "Resources), the longest GPU partition lets a session wait; it was taken out of the queue.") in final, final
        assert wait_no_jobs("alice") == []  # not left queued behind her back
        assert alice.model()["servers"] == {}


# The browser's Notification, recorded: headless Chromium shows none, the page's call is what counts.
RECORD_NOTIFICATIONS = """
window.Notification = class {
  constructor(title, options) { window.dsportalNotified(title, (options || {}).body || ""); }
  static get permission() { return "granted"; }
  static requestPermission() { return Promise.resolve("granted"); }
};
"""


def test_the_pending_page_shows_the_place_and_notifies_when_the_session_starts(alice):
    from playwright.sync_api import sync_playwright

    from conftest import HUB
    from test_browser import ARGS, CHROMIUM, SHOTS, log_in

    with every_gpu_held() as holder:
        assert alice.start_server({"profile": "gpu", "gpus": 1}).status_code == 202
        notified = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            context = browser.new_context(viewport={"width": 1200, "height": 800})
            context.expose_function("dsportalNotified", lambda title, body: notified.append((title, body)))
            context.add_init_script(RECORD_NOTIFICATIONS)
            page = context.new_page()
            log_in(page, to_session=False)
            page.goto(f"{HUB}/hub/spawn-pending/alice")
            page.locator("#progress-message", has_text="place 1 of 1 in its queue").wait_for(timeout=60_000)
            assert page.locator("#dsportal-notify-state").inner_text() == "You will be notified."
            assert "You may close this page" in page.locator("#dsportal-come-back").inner_text()
            SHOTS.mkdir(exist_ok=True)
            page.screenshot(path=str(SHOTS / "spawn-pending-queued.png"))
            subprocess.run(["scancel", str(holder)], check=True)
            page.wait_for_url("**/user/alice/**", timeout=120_000)
            browser.close()
        assert notified == [("Your session is ready", "JupyterLab is opening.")]
