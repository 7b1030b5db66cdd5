"""The README's and the docs' screenshots, taken from the running demo (`make screenshots`).

Real users of the demo do what the pictures show, through the portal's own APIs and a real browser
(Debian's chromium, Playwright): alice's spawn form; her session with a notebook run as a grid (one
Slurm array) and on a schedule, in the Jobs panel; the same session shared with bob, seen from both
sides. Every picture is of the current code: run it again after a change to the UI.

    python scripts/screenshots.py [--out docs/images]

Leaves nothing behind: alice's session is stopped, her schedule deleted, bob's share taken back.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # the demo cluster (democluster/) is not installed
os.environ.setdefault("DSPORTAL_DEMO", "1")

from hubclient import HubUser  # noqa: E402  (tests/hubclient.py: the suite's client of the hub)

HUB = "http://127.0.0.1:8000"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
NOTEBOOK = "examples/train.ipynb"
TRAIN = {  # a notebook with a parameters cell and a results cell: a grid of it finishes in seconds
    "cells": [
        {"cell_type": "code", "execution_count": None, "id": "params", "metadata": {"tags": ["parameters"]},
         "outputs": [], "source": "lr = 0.1\nseed = 0"},
        {"cell_type": "code", "execution_count": None, "id": "train", "metadata": {}, "outputs": [],
         "source": "import json\nscore = round(1 / (1 + lr) + seed / 100, 4)\nprint('score', score)"},
        {"cell_type": "code", "execution_count": None, "id": "results", "metadata": {"tags": ["results"]},
         "outputs": [], "source": "print(json.dumps({'score': score}))"},
    ],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5,
}


def say(text: str) -> None:
    print(f"[screenshots] {text}", flush=True)


def user(name: str) -> HubUser:
    return HubUser(HUB, name).must_login(f"{name}-demo")


def log_in(page, name: str) -> None:
    page.goto(f"{HUB}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", f"{name}-demo")
    page.click("#login_submit")
    page.wait_for_load_state()


def wait_job(alice: HubUser, job_id: int, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = alice.api("GET", f"/user/alice/dsportal/api/jobs/{job_id}").json()["job"]
        if job["finished"]:
            return job
        time.sleep(2)
    raise SystemExit(f"job {job_id} did not finish within {timeout:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "images"))
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    alice = user("alice")
    user("bob")  # the hub knows people once they have signed in: then she can share with him
    if alice.model()["servers"]:
        raise SystemExit("alice has a session running: stop it first (the pictures start from none)")
    schedule = None
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            a = chromium.new_context(viewport={"width": 1400, "height": 900}).new_page()
            b = chromium.new_context(viewport={"width": 1400, "height": 900}).new_page()

            # 1. The spawn form: each partition with what is free now, the slice, the share box.
            log_in(a, "alice")
            a.goto(f"{HUB}/hub/spawn")
            a.locator('input[name="profile"]').first.wait_for(timeout=30_000)
            a.screenshot(path=str(out / "spawn-form.png"), full_page=True)
            say(f"{out / 'spawn-form.png'}")

            # 2. Her session, shareable; a notebook as a grid of six (one Slurm array) and on a schedule.
            alice.spawn({"profile": "cpu", "shared": True}, timeout=180)
            alice.api("PUT", "/user/alice/api/contents/examples", json={"type": "directory"})
            saved = alice.api("PUT", f"/user/alice/api/contents/{NOTEBOOK}", json={"type": "notebook", "content": TRAIN})
            assert saved.status_code in (200, 201), saved.text
            grid = alice.api("POST", "/user/alice/dsportal/api/jobs", json={
                "notebook": NOTEBOOK, "profile": "cpu", "max_running": 2,
                "grid": {"lr": [0.01, 0.1, 1.0], "seed": [0, 1]}})
            assert grid.status_code == 201, grid.text
            job_id = grid.json()["job"]["job_id"]
            made = alice.api("POST", "/user/alice/dsportal/api/schedules", json={
                "notebook": NOTEBOOK, "profile": "cpu", "schedule": "0 2 * * *", "parameters": {"seed": 7}})
            assert made.status_code == 201, made.text
            schedule = made.json()["schedule"]["id"]
            wait_job(alice, job_id)
            a.goto(f"{HUB}/user/alice/lab?reset")
            a.wait_for_function("window.dsportalLab && window.dsportalLab.loaded", timeout=120_000)
            a.locator(".dsportal-SliceStatus").get_by_text("left").wait_for(timeout=30_000)
            a.locator(".jp-LauncherCard", has_text="Multi-node jobs").click()  # docks the Jobs panel
            a.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").click()  # the file browser folded
            panel = a.locator(".lm-DockPanel .dsportal-Jobs")
            panel.wait_for(timeout=30_000)
            row = panel.locator(f"tr[data-job-id='{job_id}']")
            row.locator(".dsportal-state-COMPLETED").wait_for(timeout=60_000)
            row.locator(".dsportal-Jobs-results").click()
            panel.locator(".dsportal-Jobs-resultsTable").wait_for(timeout=30_000)
            a.wait_for_timeout(1000)
            a.screenshot(path=str(out / "jupyterlab-jobs-panel.png"))
            say(f"{out / 'jupyterlab-jobs-panel.png'}")

            # 3. Shared with bob: he edits as her guest; her Share panel shows him connected.
            shared = alice.api("POST", "/user/alice/dsportal/api/sharing", json={"user": "bob"})
            assert shared.status_code == 200, shared.text
            log_in(b, "bob")
            b.goto(f"{HUB}/user/alice/lab/tree/{NOTEBOOK}?reset")
            authorize = b.locator("form button[type=submit]", has_text="Authorize")
            try:
                authorize.wait_for(timeout=10_000)
                authorize.click()
            except Exception:  # noqa: BLE001 - not asked
                pass
            b.locator(".dsportal-GuestBanner").wait_for(timeout=120_000)
            b.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
            b.wait_for_timeout(1500)
            b.screenshot(path=str(out / "sharing-guest.png"))
            say(f"{out / 'sharing-guest.png'}")
            a.locator("#dsportal-share-button").click()
            sharing = a.locator(".dsportal-Sharing")
            sharing.locator(".dsportal-Sharing-share[data-user=bob]").wait_for(timeout=30_000)
            a.wait_for_timeout(1500)
            a.screenshot(path=str(out / "sharing-owner.png"))
            say(f"{out / 'sharing-owner.png'}")
        finally:
            chromium.close()
            alice.api("DELETE", "/user/alice/dsportal/api/sharing?user=bob")
            if schedule:
                alice.api("DELETE", f"/user/alice/dsportal/api/schedules/{schedule}")
            alice.stop_server()
    for png in sorted(out.glob("*.png")):
        size = png.stat().st_size
        say(f"{png.name}: {size // 1024} KiB{'' if size > 10_000 else ' (nearly empty?)'}")


if __name__ == "__main__":
    main()
