"""In a real browser (Debian chromium driven by Playwright): JupyterLab loads dsportal's extension,
a right-click on a folder offers "Open TensorBoard", and TensorBoard opens in a new tab; opening a
template opens the user's own copy."""

from __future__ import annotations

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
        "w.close()\n"
        "open(os.path.expanduser('~/ddp_hello.py'), 'w').write(\n"
        "    'import torch, torch.distributed as dist\\n'\n"
        "    'dist.init_process_group(\"gloo\")\\n'\n"
        "    'total = torch.tensor([float(dist.get_rank())]); dist.all_reduce(total)\\n'\n"
        "    'print(f\"rank {dist.get_rank()} allreduce sum {total.item():.0f}\", flush=True)\\n'\n"
        "    'dist.destroy_process_group()\\n')\n", timeout=120)
    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        page.goto(f"{HUB}/hub/login")
        page.fill("#username_input", "alice")
        page.fill("#password_input", "alice-demo")
        page.click("#login_submit")
        page.wait_for_url("**/user/alice/**", timeout=60_000)
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

        # The launcher offers the Jobs panel; it opens and lists what the user may launch.
        page.goto(f"{HUB}/user/alice/dsportal/jobs")
        page.wait_for_function("document.querySelector('#profile').options.length > 0", timeout=30_000)
        assert page.locator("#profile option").all_inner_texts() == ["GPU partition", "CPU partition"]
        page.screenshot(path=str(SHOTS / "jobs-panel.png"))

        # A torchrun job from the panel: 2 nodes x 1 process, each rank's lines live, then COMPLETED.
        page.select_option("#profile", "cpu")
        page.fill("#script", "ddp_hello.py")
        page.fill("#nodes", "2")
        page.select_option("#launcher", "torchrun")
        page.click("#launch button[type=submit]")
        page.locator("#message.ok").wait_for(timeout=30_000)
        assert "torchrun" in page.locator("#message").inner_text()
        page.get_by_text("[rank 1] rank 1 allreduce sum 1").wait_for(timeout=120_000)
        page.locator("#log .state", has_text="COMPLETED").wait_for(timeout=120_000)
        assert page.get_by_text("[rank 0] rank 0 allreduce sum 1").count() == 1
        page.screenshot(path=str(SHOTS / "jobs-panel-torchrun.png"))
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
        page.goto(f"{HUB}/hub/login")
        page.fill("#username_input", "alice")
        page.fill("#password_input", "alice-demo")
        page.click("#login_submit")
        page.wait_for_url("**/user/alice/**", timeout=60_000)
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
