"""Relaunch: the form starts from the user's last choice; an instructor's link presets a profile
and slice in the form (fragment) without starting anything. Real hub, real browser."""

import re

from playwright.sync_api import sync_playwright

from conftest import HUB, stop_and_wait


def checked_profile(html: str) -> str:
    return re.search(r'name="profile" id="profile-([a-z0-9_-]+)" value="[^"]+"\s*checked', html).group(1)


def test_the_form_starts_from_the_last_choice(alice, admin):
    alice.spawn({"profile": "cpu", "walltime": "01:30:00"})
    stop_and_wait(admin, "alice")
    html = alice.web.get(f"{HUB}/hub/spawn").text
    assert checked_profile(html) == "cpu", html
    assert re.search(r'id="walltime-cpu" name="walltime.cpu"\s*value="01:30:00"', html), html
    # Other profiles keep their own defaults.
    assert re.search(r'id="walltime-gpu" name="walltime.gpu"\s*value="08:00:00"', html), html


def test_a_lecture_link_presets_the_form_and_starts_nothing(alice):
    from test_browser import ARGS, CHROMIUM, log_in

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_context().new_page()
        log_in(page, to_session=False)
        page.goto(f"{HUB}/hub/spawn#profile=gpu&gpus=2&walltime=00:45:00")
        page.wait_for_selector("#profile-gpu")
        assert page.is_checked("#profile-gpu")
        assert page.input_value("#gpus-gpu") == "2"
        assert page.input_value("#walltime-gpu") == "00:45:00"
        assert page.inner_text("#slice-gpu") == "2 GPUs, 16 CPU cores, 96 GB memory"
        browser.close()
    assert alice.model()["servers"] == {}, "a link only presets the form"


def test_the_ended_notice_and_its_start_again_button_are_hers_alone(alice, bob, admin):
    """A session that ended outside the portal: her home page says why and offers to start it again with her
    last choices. Another user who opens her stopped session's page (an admin may; a stranger may not) sees
    neither her notice nor a button of his own that would start her session with his choices."""
    import html
    import subprocess
    import time

    from hubclient import active_jobs

    for user in (admin, bob):  # each has a last choice of his own, and an ended notice the page could show
        user.spawn({"profile": "cpu", "walltime": "00:45:00"})
        subprocess.run(["scancel", *(str(j["job_id"]) for j in active_jobs(user.name))], check=True)
    alice.spawn({"profile": "cpu", "walltime": "01:30:00"})
    subprocess.run(["scancel", *(str(j["job_id"]) for j in active_jobs("alice"))], check=True)
    deadline = time.monotonic() + 60
    while any("" in u.model()["servers"] for u in (alice, bob, admin)):
        assert time.monotonic() < deadline, [u.model()["servers"] for u in (alice, bob, admin)]
        time.sleep(1)
    home = html.unescape(alice.web.get(f"{HUB}/hub/home").text)
    assert "was cancelled (Slurm: CANCELLED" in home and "Start it again as before" in home, home[-3000:]
    assert 'name="walltime.cpu" value="01:30:00"' in home
    for viewer in (admin, bob):
        page = viewer.web.get(f"{HUB}/hub/user/alice/", timeout=30)
        text = html.unescape(page.text)
        assert "dsportal-relaunch" not in text and "dsportal-session-ended" not in text, (viewer.name, page.status_code)
        assert "00:45:00" not in text, viewer.name  # never his own choices, on her page
