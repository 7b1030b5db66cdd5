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
    proxy = int(PROXY_PIDFILE.read_text())
    os.kill(proxy, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proxy}").exists() and "zombie" not in Path(f"/proc/{proxy}/status").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(2)  # RestartSec
    demo.ensure_proxy_service()  # the proxy's service started again, the hub untouched
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
