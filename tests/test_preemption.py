"""Preemption (issue 71): the demo's scavenger partition lends the gpu partition's GPUs, and Slurm takes them back
for the gpu partition's jobs (PreemptMode=REQUEUE, GraceTime=60, preempt_send_user_signal: config/demo/slurm.conf.j2).
In a real browser: the preempted session warns her in JupyterLab, which saves what she typed; her page then says
what happened; and the same job, back in Slurm's queue, is her session again once it runs."""

from __future__ import annotations

import subprocess
import time

from playwright.sync_api import sync_playwright

from hubclient import SLURM_ENV, active_jobs, squeue_jobs
from test_walltime import EMPTY_NOTEBOOK

REQUEUED = "was preempted for higher-priority work and waits to run again"  # her page's progress meanwhile


def as_bob(*argv: str) -> str:
    return subprocess.run(["runuser", "-u", "bob", "--", *argv], env=SLURM_ENV, capture_output=True, text=True,
                          check=True, cwd="/tmp").stdout


def test_a_preempted_session_warns_saves_says_so_and_comes_back_when_its_job_runs_again(alice, portal):
    from test_browser import SHOTS, open_lab

    alice.spawn({"profile": "scavenger", "gpus": 1, "walltime": "01:00:00"})
    [job] = active_jobs("alice")
    job_id, node = job["job_id"], job["nodes"]
    assert alice.api("PUT", "/user/alice/api/contents/preempted.ipynb", json=EMPTY_NOTEBOOK).status_code in (200, 201)
    preemptor = None
    try:
        with sync_playwright() as playwright:
            browser, page = open_lab(playwright, "lab/tree/preempted.ipynb?reset")
            editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
            editor.click(timeout=90_000)
            page.keyboard.type("typed before the preemption ")
            # bob's job on the gpu partition wants every GPU of her node: Slurm preempts her scavenger session.
            preemptor = int(as_bob("sbatch", "--parsable", "-p", "gpu", "-w", node, "--gres=gpu:4", "-t", "5",
                                   "--wrap", "sleep 30").strip().split(";")[0])
            preempted = time.monotonic()
            warning = page.locator(".Toastify__toast", has_text="Preempted: Slurm stops this session")
            for _ in range(120):  # keep typing (never saved by hand) until the session is told
                if warning.count():
                    break
                page.keyboard.type("x")
                page.wait_for_timeout(1000)
            warning.first.wait_for(timeout=10_000)
            warned_s = time.monotonic() - preempted
            said = warning.first.inner_text()
            SHOTS.mkdir(exist_ok=True)
            page.screenshot(path=str(SHOTS / "preempted.png"))
            browser.close()
        assert "saved preempted.ipynb" in said and "It comes back by itself later." in said, said
        with open("/home/alice/preempted.ipynb") as saved:
            assert "typed before the preemption x" in saved.read()

        # Slurm ends the run after its grace time and puts the job back in the queue; the hub keeps the job, and
        # dsportal's service starts her session again to take it over: her page's progress says why it waits.
        deadline, told = time.monotonic() + 240, []
        while not told:
            assert time.monotonic() < deadline, f"never told, {alice.model()}"
            model = alice.model()["servers"].get("")
            if model and model.get("pending") == "spawn":
                told = [e["message"] for e in alice.progress_events(timeout=20, until=lambda e: REQUEUED in e.get(
                    "message", "")) if REQUEUED in e.get("message", "")]
            time.sleep(1)
        requeued_s = time.monotonic() - preempted
        ready = alice.wait_ready(timeout=300)  # bob's job ends; Slurm runs hers again (after its BeginTime)
        back_s = time.monotonic() - preempted
        assert ready["ready"] and [j["job_id"] for j in active_jobs("alice")] == [job_id]  # the same job
        assert squeue_jobs()[job_id]["restart_cnt"] == 1
        assert "still here" in alice.run_code("print('still here')")
        log = open(f"/home/alice/.dsportal/logs/session-{job_id}.log").read()  # both runs: appended
        assert "dsportal: Slurm preempts this session for higher-priority work" in log, log[-3000:]
        assert "dsportal: saved before the walltime ended: preempted.ipynb" in log, log[-3000:]
        print(f"preempted: warned {warned_s:.1f} s after bob's job was submitted; back in the queue and told "
              f"{requeued_s:.1f} s after; serving again {back_s:.1f} s after ({told[0]!r})")
    finally:
        if preemptor:
            subprocess.run(["scancel", str(preemptor)], env=SLURM_ENV, check=False)
