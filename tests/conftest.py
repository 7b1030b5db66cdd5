"""Fixtures bringing up the real embedded cluster (munge, slurmctld, slurmd x2, slapd, hub)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests
import yaml

from democluster.base import CONFIGLESS, SLURM_RELEASE, release_config
from hubclient import SLURM_BIN, SLURM_ENV, HubUser, active_jobs

REPO = Path(__file__).resolve().parent.parent
# The demo's own portal.yaml (the checkout's), and the one the running demo reads: the same, but on another
# Slurm release (make test SLURM=24.11) the file derived from it for that release (democluster/base.py).
DEMO_CONFIG = REPO / "config" / "portal.yaml"
CONFIG = release_config(DEMO_CONFIG) if SLURM_RELEASE else DEMO_CONFIG
if SLURM_RELEASE and not os.environ.get("PATH", "").startswith(f"{SLURM_BIN}:"):
    os.environ["PATH"] = f"{SLURM_BIN}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
DSPORTAL = str(Path(sys.executable).parent / "dsportal")
PASSWORDS = {u["name"]: u["password"] for u in yaml.safe_load((REPO / "config/demo/users.yaml").read_text())["users"]}
HUB = "http://127.0.0.1:8000"
# The suite runs dsportal's production commands (`dsportal check`, `dsportal hub` ...) against the demo's own
# settings, which they refuse elsewhere (portal/core/settings.py: refuse_demo): this says it is the demo, for every
# command the tests run, also when pytest is run without make (which exports it too).
os.environ.setdefault("DSPORTAL_DEMO", "1")


def pytest_collection_modifyitems(items):
    """A test marked quick runs without the cluster: one that needs it (through any fixture) is a mistake."""
    wrong = [item.nodeid for item in items if item.get_closest_marker("quick") and "portal" in item.fixturenames]
    if wrong:
        raise pytest.UsageError("marked quick but they need the demo cluster (the portal fixture): " + ", ".join(wrong))


@pytest.fixture(scope="session")
def portal():
    """The demo portal, up (idempotently) for the whole run."""
    result = subprocess.run([sys.executable, "-m", "democluster", "--config", str(CONFIG), "up"], capture_output=True,
                            text=True, cwd=REPO)
    assert result.returncode == 0, f"python -m democluster up failed:\n{result.stdout}\n{result.stderr}"
    if CONFIGLESS:  # as on a configless cluster's login node: the commands find sackd's copy
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = SLURM_ENV["SLURM_CONF"]
    # A clean slate: no session or job left by an earlier (interrupted) run holds the nodes.
    admin = login(HUB, "dave")
    # Right after a hub (re)start it checks each recorded session; a stop then is refused
    # ("pending check"), so wait for those checks (at most http_timeout) before stopping.
    deadline = time.time() + 120
    while time.time() < deadline:
        users = admin.api("GET", "/hub/api/users").json()
        if not any(user.get("pending") == "check" for user in users):
            break
        time.sleep(1)
    for user in users:
        if user.get("servers") or user.get("pending"):
            admin.stop_server(user["name"])
    cancel_jobs_of(PASSWORDS)
    yield HUB


def cancel_jobs_of(users) -> None:
    for user in users:  # scancel -u takes one user name, not a list
        subprocess.run(["scancel", "-u", user], capture_output=True)
    deadline = time.monotonic() + 30
    while any(active_jobs(u) for u in users) and time.monotonic() < deadline:
        time.sleep(0.5)


def stop_and_wait(admin: HubUser, name: str) -> None:
    """Stop the user's session and wait until Slurm has ended its job (no longer COMPLETING):
    the next test starts on nodes nobody's job still holds."""
    admin.stop_server(name)
    wait_no_jobs(name)


def login(base: str, name: str) -> HubUser:
    return HubUser(base, name).must_login(PASSWORDS[name])


@pytest.fixture
def admin(portal) -> HubUser:
    return login(portal, "dave")


@pytest.fixture
def alice(portal, admin):
    user = login(portal, "alice")
    yield user
    stop_and_wait(admin, "alice")


@pytest.fixture
def bob(portal, admin):
    user = login(portal, "bob")
    yield user
    stop_and_wait(admin, "bob")


@pytest.fixture
def carol(portal, admin):
    user = login(portal, "carol")
    yield user
    stop_and_wait(admin, "carol")


def wait_no_jobs(user: str, timeout: float = 30) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = active_jobs(user)
        if not jobs:
            return []
        time.sleep(0.5)
    return active_jobs(user)


def listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture
def second_hub(portal, tmp_path):
    """Start another hub on the same cluster and LDAP with an edited portal.yaml; yields a starter."""
    processes = []

    def start(edit) -> str:
        config = yaml.safe_load(CONFIG.read_text())
        login = urlparse(config["hub"]["hub_bind_url"]).hostname  # where the compute nodes reach the hub
        config["hub"].update(bind_url="http://127.0.0.1:8010", hub_bind_url=f"http://{login}:8091",
                             proxy_api_url="http://127.0.0.1:8011", data_dir=str(tmp_path / "hub"),
                             db_url=None, db_password_file=None)  # its own SQLite: never the main hub's database
        if config["hub"].get("subdomain_host"):  # users' own origins, at this hub's port
            config["hub"]["subdomain_host"] = "http://localhost:8010"
        # A scratch hub runs as root (its data is in this test's folder): the same mediator, through runuser.
        config["hub"].pop("account", None)
        config["slurm"]["submit_as"] = "runuser"
        config["hub"].update(external_proxy=False, proxy_token_file=None)  # it starts a proxy of its own
        edit(config)
        path = tmp_path / "portal.yaml"
        path.write_text(yaml.safe_dump(config))
        hub = config["hub"]
        api = urlparse(hub["hub_bind_url"])
        service = (api.hostname, hub.get("service_port") or api.port + 1)  # dsportal's service (settings: service_urls)
        # A hub an earlier test left would answer in this one's place.
        for host, port in [(urlparse(hub[url]).hostname, urlparse(hub[url]).port)
                           for url in ("bind_url", "proxy_api_url", "hub_bind_url")] + [service]:
            assert not listening(host, port), f"{host}:{port} is still taken (a hub of an earlier test?)"
        log = open(tmp_path / "hub.log", "wb")
        process = subprocess.Popen([DSPORTAL, "--config", str(path), "hub"], stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        processes.append(process)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "hub.log").read_text()
            try:
                # Its API, then dsportal's service, which the hub starts after it (a hub stopped while that
                # service is still starting took 33 s to end).
                if requests.get("http://127.0.0.1:8010/hub/api", timeout=2).status_code == 200 and \
                        listening(*service):
                    return "http://127.0.0.1:8010"
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        raise AssertionError("second hub did not start:\n" + (tmp_path / "hub.log").read_text())

    yield start
    for process in processes:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # its proxy and service with it
            process.wait(timeout=30)
    # Sessions of the second hub (kept across hub restarts by design) end with the test.
    cancel_jobs_of(["alice", "bob", "carol"])
