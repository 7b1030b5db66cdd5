"""The proxy is a service of its own (hub.external_proxy): restarting the hub drops no route."""

import os
import signal
import time
from pathlib import Path

import requests
import yaml

import democluster as demo
from conftest import CONFIG, HUB, active_jobs

SETTINGS = yaml.safe_load(CONFIG.read_text())["hub"]
PROXY_PIDFILE = Path(SETTINGS["data_dir"]) / "proxy.pid"


def parent_of(pid: int) -> int:
    return int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("PPid:")))


def through_the_proxy(path: str) -> requests.Response:
    """A request to alice's server the way her browser sends it: her host, the proxy's port."""
    return requests.get(f"{HUB}{path}", headers={"Host": "alice.localhost:8000"}, allow_redirects=False, timeout=10)


def kill_the_proxy_and_start_it_again() -> int:
    """The proxy killed with -9; once it is gone, RestartSec, then its service starts it again, the hub
    untouched (what systemd's Restart=on-failure does). The dead proxy's pid."""
    proxy = int(PROXY_PIDFILE.read_text())
    os.kill(proxy, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proxy}").exists() and "zombie" not in Path(f"/proc/{proxy}/status").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(2)  # RestartSec
    demo.ensure_proxy_service()
    return proxy


def test_the_hub_going_down_and_up_leaves_the_proxy_and_every_route(alice, portal):
    alice.spawn()
    job = [j["job_id"] for j in active_jobs("alice")]
    proxy, hub = int(PROXY_PIDFILE.read_text()), int(demo.hub_pidfile().read_text())
    assert parent_of(proxy) != hub, "the proxy is the hub's child: stopping the hub would take it along"
    assert through_the_proxy("/user/alice/api").json()["version"]

    os.kill(hub, signal.SIGTERM)  # as systemd stops it
    deadline = time.monotonic() + 30
    while Path(f"/proc/{hub}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{hub}").exists() or "zombie" in Path(f"/proc/{hub}/status").read_text()
    # The hub is gone: the proxy still runs and still routes alice to her own session.
    assert Path(f"/proc/{proxy}").exists()
    answer = through_the_proxy("/user/alice/api")
    print(f"alice's server through the proxy while the hub is down: {answer.status_code} {answer.text[:80]}")
    assert answer.status_code == 200 and answer.json()["version"]

    demo.ensure_hub()
    assert int(PROXY_PIDFILE.read_text()) == proxy, "the proxy was restarted with the hub"
    assert [j["job_id"] for j in active_jobs("alice")] == job
    assert alice.api("GET", "/user/alice/api/status").status_code == 200
    assert "still here" in alice.run_code("print('still here')")
    # The restarted hub found her route in place (JupyterHub logs each one it has to add back).
    latest_start = (demo.paths().log / "hub.log").read_text(errors="replace").rsplit("Running JupyterHub version", 1)[-1]
    assert "Adding missing route for alice" not in latest_start


def test_a_proxy_killed_with_kill_9_and_started_again_gets_every_route_back_within_seconds(alice, portal):
    """systemd starts dsportal-proxy again (Restart=on-failure, RestartSec=2); the new proxy holds no route,
    and the hub puts every running session's route back within seconds (portal/hub/proxywatch.py), where
    before it waited for the hub's next restart. No session is lost; a kernel answers through it again."""
    alice.spawn()
    job = [j["job_id"] for j in active_jobs("alice")]
    assert through_the_proxy("/user/alice/api").status_code == 200
    proxy = kill_the_proxy_and_start_it_again()
    started = time.monotonic()
    assert int(PROXY_PIDFILE.read_text()) != proxy
    deadline = started + 30
    while (answer := through_the_proxy("/user/alice/api")).status_code != 200:
        assert time.monotonic() < deadline, f"alice's route not back 30 s after the proxy restarted: {answer.status_code}"
        time.sleep(0.2)
    back_s = time.monotonic() - started
    print(f"alice's route back through the restarted proxy {back_s:.1f} s after it listened")
    assert [j["job_id"] for j in active_jobs("alice")] == job  # no session lost
    assert "back again" in alice.run_code("print('back again')")  # a kernel's websocket through the new proxy
    log = (demo.paths().log / "hub.log").read_text(errors="replace")
    assert "dsportal: the proxy had lost its routes (it restarted): every running session's route put back" in log


def test_an_open_jupyterlab_page_works_on_by_itself_when_the_proxy_is_killed_with_kill_9(alice, portal):
    """In a real browser: her notebook open in JupyterLab, its kernel run once; the proxy killed with -9 and
    started again by its service. The same page, never reloaded, runs its next cell through the new proxy: the
    kernel's connection comes back by itself, and nothing of the notebook is lost."""
    from playwright.sync_api import sync_playwright

    from test_browser import open_lab

    alice.spawn({"profile": "cpu"})
    alice.run_code(
        "import nbformat, os\n"
        "nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(\"print('before', 6 * 7)\"),\n"
        "                                     nbformat.v4.new_code_cell(\"print('after', 6 * 7)\")])\n"
        "nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}\n"
        "nbformat.write(nb, os.path.expanduser('~/proxy-restart.ipynb'))\n")
    job = [j["job_id"] for j in active_jobs("alice")]
    last_save = Path("/home/alice/proxy-restart.ipynb").read_bytes()
    with sync_playwright() as playwright:
        browser, page = open_lab(playwright, "lab/tree/proxy-restart.ipynb?reset")
        cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell")
        cells.nth(1).wait_for(timeout=60_000)
        # Its kernel started and connected (a cell run before then is not sent).
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=90_000)

        def run(cell: int, text: str, timeout_ms: int) -> None:
            cells.nth(cell).locator(".cm-content").click(timeout=90_000)  # once the notebook's spinner is gone
            page.keyboard.press("Shift+Enter")
            try:
                cells.nth(cell).locator(".jp-OutputArea-output", has_text=text).wait_for(timeout=timeout_ms)
            except Exception:
                page.screenshot(path=f"/tmp/dsportal-screenshots/proxy-restart-cell{cell}.png")
                raise

        run(0, "before 42", 90_000)
        kill_the_proxy_and_start_it_again()  # the page meanwhile finds its server gone
        started = time.monotonic()
        run(1, "after 42", 120_000)
        answered_s = time.monotonic() - started
        dialogs = page.locator(".jp-Dialog").all_inner_texts()
        page.screenshot(path="/tmp/dsportal-screenshots/proxy-restart.png")
        browser.close()
    print(f"her open page ran its next cell {answered_s:.1f} s after the new proxy listened, not reloaded; "
          f"dialogs left open: {dialogs}")
    assert dialogs == [], dialogs  # nothing for her to dismiss
    assert [j["job_id"] for j in active_jobs("alice")] == job  # the same session
    assert Path("/home/alice/proxy-restart.ipynb").read_bytes() == last_save  # her work: her last save
