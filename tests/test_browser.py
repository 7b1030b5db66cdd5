"""In a real browser (Debian chromium driven by Playwright): JupyterLab loads dsportal's extension
(TypeScript, built by JupyterLab's builder); a right-click on a folder offers "Open TensorBoard", and
TensorBoard opens in a new tab; opening a template opens the user's own copy; the Jobs panel docks in
JupyterLab, launches a 2x2 Horovod job and a torchrun job, shows every rank live, filters by rank,
cancels, in the light and the dark theme; the status bar shows the session's slice."""

from __future__ import annotations

import subprocess
from pathlib import Path

from playwright.sync_api import sync_playwright

from conftest import HUB

CHROMIUM = "/usr/bin/chromium"
# The closed network refuses Chromium's background connections: keep it from trying.
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
SHOTS = Path("/tmp/dsportal-screenshots")


def test_open_tensorboard_from_the_file_browser(alice):
    alice.spawn({"profile": "cpu"})
    alice.run_code(
        "import os, shutil\n"
        "from torch.utils.tensorboard import SummaryWriter\n"
        "shutil.rmtree(os.path.expanduser('~/tb-browser'), ignore_errors=True)\n"
        "w = SummaryWriter(os.path.expanduser('~/tb-browser/run1'))\n"
        "[w.add_scalar('accuracy', 0.5 + s / 10, s) for s in range(4)]\n"
        "w.close()\n", timeout=120)
    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        log_in(page)
        page.goto(f"{HUB}/user/alice/lab?reset")  # ?reset: the layout of earlier runs is not restored
        page.wait_for_function("window.dsportalLab && window.dsportalLab.loaded", timeout=90_000)
        folder = page.locator('.jp-DirListing-item[data-isdir="true"]', has_text="tb-browser")
        folder.wait_for(timeout=30_000)
        folder.click(button="right")
        item = page.locator(".lm-Menu-item", has_text="Open TensorBoard")
        item.wait_for(timeout=10_000)
        page.screenshot(path=str(SHOTS / "file-browser-menu.png"))
        with context.expect_page(timeout=60_000) as opened:
            item.click()
        board = opened.value
        board.wait_for_load_state()
        assert "/user/alice/dsportal/tensorboard/tb-browser-" in board.url, board.url
        runs = board.evaluate("fetch('data/runs').then(r => r.json())")
        assert runs == ["run1"], runs
        board.wait_for_timeout(3000)
        board.screenshot(path=str(SHOTS / "tensorboard.png"))

        browser.close()


def test_opening_a_template_opens_my_own_copy(alice):
    """Double-clicking a notebook in templates/ opens the user's copy, made on the spot."""
    from test_templates import forget_templates, home

    forget_templates("alice")
    alice.spawn({"profile": "cpu"})
    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        log_in(page)
        page.goto(f"{HUB}/user/alice/lab/tree/templates?reset")  # ?reset: no tabs restored from earlier runs
        page.wait_for_function("window.dsportalLab && window.dsportalLab.templatesFolder === 'templates'",
                               timeout=90_000)
        listing = page.locator(".jp-DirListing-content")
        listing.get_by_text("dsportal", exact=True).dblclick()
        listing.get_by_text("getting-started.ipynb", exact=True).wait_for(timeout=30_000)
        page.screenshot(path=str(SHOTS / "templates-folder.png"))
        listing.get_by_text("getting-started.ipynb", exact=True).dblclick()
        copy_tab = page.locator('.lm-DockPanel-tabBar .lm-TabBar-tab[title*="Path: notebooks/dsportal/getting-started.ipynb"]')
        copy_tab.wait_for(timeout=60_000)
        page.get_by_text("This is your own copy, notebooks/dsportal/getting-started.ipynb").wait_for(timeout=30_000)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(SHOTS / "template-copy.png"))
        assert page.locator('.lm-DockPanel-tabBar .lm-TabBar-tab[title*="Path: templates/"]').count() == 0
        browser.close()
    copy = home("alice") / "notebooks/dsportal/getting-started.ipynb"
    assert copy.read_bytes() == Path("/opt/dsportal/env/share/dsportal/notebooks/getting-started.ipynb").read_bytes()


HVD_ALLREDUCE = """
import os, time
import torch
import horovod.torch as hvd
hvd.init()
print(f"rank {hvd.rank()} of {hvd.size()} on {os.environ.get('SLURMD_NODENAME')}", flush=True)
time.sleep(6)  # the job is still running while the panel shows these first lines
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)
print(f"rank {hvd.rank()} allreduce sum {total.item():.0f}", flush=True)
"""

DDP_HELLO = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())]); dist.all_reduce(total)
print(f"rank {dist.get_rank()} allreduce sum {total.item():.0f}", flush=True)
dist.destroy_process_group()
"""

SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n"

THEMES = "/user/alice/lab/api/settings/@jupyterlab/apputils-extension:themes"


def log_in(page, user: str = "alice", to_session: bool = True) -> None:
    """Log in through the hub's form; ``to_session``: wait until it leads into the user's session."""
    page.goto(f"{HUB}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", f"{user}-demo")
    page.click("#login_submit")
    if to_session:
        page.wait_for_url(f"**/user/{user}/**", timeout=60_000)
    else:
        page.wait_for_load_state()


def open_lab(playwright, path: str = "lab?reset", height: int = 900):
    """Chromium, alice logged in, JupyterLab at /user/alice/<path> with dsportal's extension loaded
    (?reset: the layout of earlier runs is not restored): (browser, page)."""
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
    page = browser.new_context(viewport={"width": 1400, "height": height}).new_page()
    log_in(page)
    page.goto(f"{HUB}/user/alice/{path}")
    page.wait_for_function("window.dsportalLab && window.dsportalLab.loaded", timeout=90_000)
    return browser, page


def launch(panel, job_id_of, **fields) -> int:
    """Fill the Jobs panel's form and launch; the job id from the panel's message."""
    for name in ("profile", "gpus_per_node", "launcher", "image"):
        if name in fields:
            select = panel.locator(f"select[name={name}]")
            select.select_option(index=0) if fields[name] == "" else select.select_option(str(fields[name]))
    for name in ("script", "nodes", "walltime"):
        if name in fields:
            panel.locator(f"input[name={name}]").fill(str(fields[name]))
    panel.locator("button[type=submit]").click()
    message = panel.locator(".dsportal-Jobs-message.dsportal-Jobs-ok")
    message.wait_for(timeout=30_000)
    return job_id_of(message.inner_text())


def test_jobs_panel_docks_launches_follows_filters_and_cancels(alice):
    """The docked Jobs panel: a 2x2 Horovod job with every rank live then COMPLETED, the rank filter,
    a torchrun job, cancel; light and dark theme; the status bar's slice."""
    import re

    from test_jobs import scontrol_state

    alice.spawn({"profile": "cpu"})
    files = [("hvd_panel.py", HVD_ALLREDUCE), ("ddp_hello.py", DDP_HELLO), ("sleeper.py", SLEEPER)]
    alice.run_code(f"import os\nfor name, text in {files!r}:\n"
                   "    open(os.path.expanduser('~/' + name), 'w').write(text)\n")
    alice.api("PUT", THEMES, json={"raw": '{"theme": "JupyterLab Light"}'})
    SHOTS.mkdir(exist_ok=True)

    def job_id_of(text: str) -> int:
        return int(re.search(r"Submitted job (\d+)", text).group(1))

    with sync_playwright() as playwright:
        browser, page = open_lab(playwright, height=1000)

        # The status bar: the session's slice (cpu profile: no GPU, 4 CPUs, 16 GB) and its walltime left.
        status = page.locator(".dsportal-SliceStatus")
        status.get_by_text("left").wait_for(timeout=30_000)
        text = status.inner_text()
        assert re.fullmatch(r"0 GPUs · 4 CPUs · 16 GB · \d+ (h|h \d\d min|min) left", text), text

        # The launcher card docks the panel in JupyterLab's main area, beside the launcher.
        page.locator(".jp-LauncherCard", has_text="Multi-node jobs").click()
        panel = page.locator(".lm-DockPanel .dsportal-Jobs")
        panel.wait_for(timeout=30_000)
        assert page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="Jobs").count() == 1
        page.wait_for_function("window.dsportalLab.jobsPolicy === true", timeout=30_000)
        assert panel.locator("select[name=profile] option").all_inner_texts() == ["GPU partition", "CPU partition",
                                                                                 "GPU partition, scavenger"]

        # Horovod, 2 nodes x 2 GPUs in the horovod image: each rank's first line shows while Slurm
        # says RUNNING, then every rank's allreduce, then COMPLETED.
        job = launch(panel, job_id_of, profile="gpu", gpus_per_node=2, nodes=2, launcher="mpi", image="horovod",
                     script="hvd_panel.py")
        log = panel.locator(".dsportal-Jobs-log")
        states = {}
        for rank in range(4):
            log.get_by_text(re.compile(rf"^\[rank {rank}\] rank {rank} of 4 on node\d$")).wait_for(timeout=180_000)
            states[rank] = scontrol_state(job)
        assert set(states.values()) == {"RUNNING"}, states
        page.screenshot(path=str(SHOTS / "jobs-panel-live.png"))
        log.locator(".dsportal-Jobs-state", has_text=f"job {job}: COMPLETED (exit code 0:0)").wait_for(timeout=120_000)
        for rank in range(4):
            assert log.get_by_text(f"[rank {rank}] rank {rank} allreduce sum 6").count() == 1
        row = panel.locator(f"tr[data-job-id='{job}']")
        row.locator(".dsportal-state-COMPLETED").wait_for(timeout=30_000)
        # The rank filter: rank 2's lines only (the final state stays in view).
        panel.locator("select.dsportal-Jobs-rankFilter").select_option("2")
        visible = log.locator(".dsportal-Jobs-line:visible").all_inner_texts()
        assert visible and all(line.startswith("[rank 2]") or line.startswith(f"job {job}:") for line in visible), visible
        assert "[rank 2] rank 2 allreduce sum 6" in visible
        page.screenshot(path=str(SHOTS / "jobs-panel-rank2.png"))
        panel.locator("select.dsportal-Jobs-rankFilter").select_option("all")
        light = panel.evaluate("node => getComputedStyle(node).backgroundColor")

        # torchrun, 2 nodes x 1 process (cpu profile, session Python).
        job = launch(panel, job_id_of, profile="cpu", nodes=2, launcher="torchrun", image="", script="ddp_hello.py")
        assert "torchrun" in panel.locator(".dsportal-Jobs-message").inner_text()
        log.get_by_text("[rank 1] rank 1 allreduce sum 1").wait_for(timeout=120_000)
        log.locator(".dsportal-Jobs-state", has_text=f"job {job}: COMPLETED").wait_for(timeout=120_000)

        # Cancel from the job's row: the log ends CANCELLED, the row loses its Cancel button.
        job = launch(panel, job_id_of, profile="cpu", nodes=1, launcher="mpi", image="", script="sleeper.py")
        log.get_by_text("[rank 0] sleeping").wait_for(timeout=120_000)
        row = panel.locator(f"tr[data-job-id='{job}']")
        row.locator(".dsportal-Jobs-cancel").click()
        log.locator(".dsportal-Jobs-state", has_text=f"job {job}: CANCELLED").wait_for(timeout=60_000)
        row.locator(".dsportal-state-CANCELLED").wait_for(timeout=30_000)
        assert row.locator(".dsportal-Jobs-cancel").count() == 0
        assert scontrol_state(job) in ("CANCELLED", "")

        # The dark theme: the panel follows JupyterLab's theme (and comes back docked after a reload).
        try:
            assert alice.api("PUT", THEMES, json={"raw": '{"theme": "JupyterLab Dark"}'}).status_code == 204
            page.reload()
            page.wait_for_function("window.dsportalLab && window.dsportalLab.loaded", timeout=90_000)
            panel.wait_for(timeout=60_000)  # JupyterLab's layout restorer docks it again
            page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
            page.wait_for_timeout(1000)
            dark = panel.evaluate("node => getComputedStyle(node).backgroundColor")
            page.screenshot(path=str(SHOTS / "jobs-panel-dark.png"))
        finally:
            alice.api("PUT", THEMES, json={"raw": '{"theme": "JupyterLab Light"}'})
        browser.close()

    def brightness(css: str) -> int:
        return sum(int(n) for n in re.findall(r"\d+", css)[:3])

    assert brightness(light) > 600 and brightness(dark) < 200, (light, dark)


def test_a_template_notebook_runs_as_a_job_and_a_grid_as_an_array_from_the_file_browser(alice):
    """Issue 50 in the browser: "Run as job" on a course template in the file browser fills the Jobs panel;
    the run's log says which cell runs and its executed notebook opens from the panel; a 3 x 2 grid runs as
    one Slurm array whose results table shows six rows, sortable; a failing cell is named; a scheduled run."""
    import re

    from test_notebook_jobs import FAILING, TRAIN, put_notebook

    alice.spawn({"profile": "cpu"})
    put_notebook(alice, "nbjobs/failing.ipynb", FAILING)
    put_notebook(alice, "nbjobs/train.ipynb", TRAIN)
    SHOTS.mkdir(exist_ok=True)

    def job_id_of(text: str) -> int:
        return int(re.search(r"Submitted job (\d+)", text).group(1))

    with sync_playwright() as playwright:
        browser, page = open_lab(playwright, path="lab/tree/templates/dsportal?reset", height=1000)
        template = page.locator('.jp-DirListing-item[data-file-type="notebook"]', has_text="digits-pytorch.ipynb")
        template.wait_for(timeout=30_000)
        template.click(button="right")
        page.locator(".lm-Menu-item", has_text="Run as job").click()
        panel = page.locator(".lm-DockPanel .dsportal-Jobs")
        panel.wait_for(timeout=30_000)
        page.wait_for_function("window.dsportalLab.jobsPolicy === true", timeout=30_000)
        assert panel.locator("input[name=script]").input_value() == "templates/dsportal/digits-pytorch.ipynb"
        assert panel.locator("input[name=nodes]").is_hidden() and panel.locator("input[name=grid]").is_visible()

        # One run, 4 epochs: the log says which cell runs; the executed notebook opens from the panel.
        panel.locator("select[name=profile]").select_option("cpu")
        panel.locator("input[name=parameters]").fill('{"epochs": 4}')
        panel.locator("button[type=submit]").click()
        message = panel.locator(".dsportal-Jobs-message.dsportal-Jobs-ok")
        message.wait_for(timeout=30_000)
        job = job_id_of(message.inner_text())
        log = panel.locator(".dsportal-Jobs-log")
        log.get_by_text(re.compile(r"^\[batch\] dsportal: running cell 4 \(model = nn\.Sequential\(\), of 6 code cells$")) \
            .wait_for(timeout=180_000)
        log.locator(".dsportal-Jobs-state", has_text=f"job {job}: COMPLETED").wait_for(timeout=180_000)
        assert log.get_by_text(re.compile(r"^\[batch\] test accuracy: 0\.\d{4}$")).count() == 1
        row = panel.locator(f"tr[data-job-id='{job}']")
        row.locator(".dsportal-Jobs-open").click()
        executed = page.locator(".jp-NotebookPanel", has=page.locator(".jp-OutputArea-output", has_text="test accuracy"))
        executed.wait_for(timeout=60_000)
        assert page.locator(".lm-TabBar-tab.lm-mod-current", has_text="output.ipynb").count() == 1
        page.screenshot(path=str(SHOTS / "notebook-job-output.png"))
        page.locator(".lm-TabBar-tab", has_text="Jobs").click()
        # Compare: the executed notebook beside the copy that was submitted (its parameters cell as it was).
        row.locator(".dsportal-Jobs-compare").click()
        page.locator(".lm-TabBar-tab", has_text="input.ipynb").wait_for(timeout=60_000)
        page.wait_for_function("document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden)').length >= 2",
                               timeout=30_000)  # side by side
        page.screenshot(path=str(SHOTS / "notebook-job-compare.png"))
        # Both open as the job left them, with no kernel: none was started for them.
        opened = [s["path"] for s in alice.api("GET", "/user/alice/api/sessions").json()]
        assert not [p for p in opened if p.endswith(("output.ipynb", "input.ipynb"))], opened
        page.locator(".lm-TabBar-tab", has_text="Jobs").click()

        # A 3 x 2 grid, 2 epochs each, at most 2 at once: one array, six rows of results.
        panel.locator("input[name=parameters]").fill('{"epochs": 2}')
        panel.locator("input[name=grid]").fill('{"lr": [0.0003, 0.001, 0.003], "seed": [0, 1]}')
        panel.locator("input[name=max_running]").fill("2")
        panel.locator("button[type=submit]").click()
        panel.locator(".dsportal-Jobs-message.dsportal-Jobs-ok", has_text="6 runs (a Slurm array, at most 2 at once)") \
            .wait_for(timeout=30_000)
        array = job_id_of(panel.locator(".dsportal-Jobs-message").inner_text())
        # This job's row: its id may be an older job's too (ids restart with a fresh Slurm state, as on each
        # release of compatibility.sh), whose row the list showed before the submission.
        row = panel.locator(f"tr[data-job-id='{array}']", has_text="6 runs")
        row.locator(".dsportal-state-COMPLETED").wait_for(timeout=300_000)
        assert row.locator("td").nth(4).inner_text() == "6 runs"
        row.locator(".dsportal-Jobs-results").click()
        table = panel.locator(".dsportal-Jobs-resultsTable")
        table.wait_for(timeout=30_000)
        assert table.locator("thead th").all_inner_texts()[:6] == ["run", "epochs", "lr", "seed", "state", "accuracy"]
        assert table.locator("tbody tr").count() == 6
        assert set(table.locator("tbody tr td:nth-child(5)").all_inner_texts()) == {"COMPLETED"}
        table.locator("thead th", has_text="accuracy").click()
        accuracies = [float(text) for text in table.locator("tbody tr td:nth-child(6)").all_inner_texts()]
        assert accuracies == sorted(accuracies) and all(0 < a <= 1 for a in accuracies), accuracies
        assert panel.get_by_text("Download CSV").get_attribute("href").endswith(f"/dsportal/api/jobs/{array}/results?format=csv")
        page.screenshot(path=str(SHOTS / "notebook-job-grid.png"))

        # A failing cell is named, in the log and on the job's state.
        panel.locator("input[name=script]").fill("nbjobs/failing.ipynb")
        panel.locator("input[name=parameters]").fill("")
        panel.locator("input[name=grid]").fill("")
        panel.locator("button[type=submit]").click()
        message = panel.locator(".dsportal-Jobs-message.dsportal-Jobs-ok", has_text="notebook failing.ipynb")
        message.wait_for(timeout=30_000)
        failed = job_id_of(message.inner_text())
        log.get_by_text("[batch] dsportal: cell 3 (z = y / 0): ZeroDivisionError: division by zero").wait_for(timeout=180_000)
        failed_row = panel.locator(f"tr[data-job-id='{failed}']", has_text="nb-failing")
        failed_row.locator(".dsportal-state-FAILED").wait_for(timeout=60_000)
        assert "cell 3 (z = y / 0): ZeroDivisionError" in failed_row.locator(".dsportal-state-FAILED").get_attribute("title")

        # On a schedule, through Slurm's cron (every minute is allowed on the demo): a row in My schedules with
        # its next run; its first run is a job of its own in My jobs, named after the schedule; deleted, the run stays.
        try:
            panel.locator("input[name=script]").fill("nbjobs/train.ipynb")
            panel.locator("input[name=parameters]").fill('{"label": "scheduled"}')
            panel.locator("input[name=schedule]").fill("* * * * *")
            assert panel.locator("button[type=submit]").inner_text() == "Schedule"
            panel.locator("button[type=submit]").click()
            panel.locator(".dsportal-Jobs-message.dsportal-Jobs-ok", has_text="every minute, next run").wait_for(timeout=30_000)
            schedule = panel.locator(".dsportal-Jobs-schedules tbody tr")
            schedule.wait_for(timeout=30_000)
            last = schedule.locator(".dsportal-Jobs-lastRun")
            last.wait_for(timeout=240_000)
            run = int(last.get_attribute("data-job-id"))
            row = panel.locator(f"tr[data-job-id='{run}']")
            row.locator("td", has_text="schedule ").wait_for(timeout=30_000)
            row.locator(".dsportal-state-COMPLETED").wait_for(timeout=240_000)
            page.screenshot(path=str(SHOTS / "notebook-job-schedule.png"))
            schedule.locator(".dsportal-Jobs-deleteSchedule").click()
            panel.locator(".dsportal-Jobs-message.dsportal-Jobs-ok", has_text="is deleted").wait_for(timeout=30_000)
            assert panel.locator(".dsportal-Jobs-schedules tbody tr").count() == 0
            assert panel.locator(f"tr[data-job-id='{run}']").count() == 1
        finally:
            subprocess.run(["runuser", "-u", "alice", "--", "scrontab", "-r"], capture_output=True)
            subprocess.run(["runuser", "-u", "alice", "--", "scancel", "--name=nb-train"], capture_output=True)
        browser.close()
