"""The walltime's end: JupyterLab warns with Save all and Extend; a user extends her own running
session up to her profile's maximum (the hub, a Slurm operator, changes the job's time limit),
and is told in words where the profile or Slurm says no. Real hub, real Slurm, a real browser."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests
from playwright.sync_api import sync_playwright

import democluster as demo
from conftest import CONFIG, HUB, REPO, login
from democluster.base import paths
from portal.core import settings as settings_module
from portal.hub.extend import MOST_CONNECTIONS
from test_profiles import only_job, scontrol


def extend(user, minutes):
    return user.api("POST", f"/user/{user.name}/dsportal/api/extend", json={"minutes": minutes})


def at_service(token: str, **kwargs) -> requests.Response:
    """POST to dsportal's service (portal/hub/extend.py) where sessions reach it, as a session does: TLS
    with the hub's certificate, a client certificate of the internal CAs', a token."""
    hub = settings_module.load(CONFIG).hub
    store = hub.data_dir / "internal-ssl"
    return requests.post(f"{hub.service_urls()[1]}/services/dsportal/extend", timeout=60,
                         headers={"Authorization": f"token {token}"}, verify=str(store / "hub-ca" / "hub-ca.crt"),
                         cert=(str(store / "proxy-client" / "proxy-client.crt"), str(store / "proxy-client" / "proxy-client.key")),
                         **kwargs)


def test_a_user_extends_her_session_up_to_the_profiles_maximum(alice, bob):
    alice.spawn({"profile": "gpu", "gpus": 1, "walltime": "01:00:00"})
    job_id = only_job("alice")["job_id"]

    done = extend(alice, 60)
    assert done.status_code == 200, done.text
    assert done.json()["message"] == "Your session's walltime is now 2 h (1 h more)."
    assert scontrol(job_id)["TimeLimit"] == "02:00:00"
    assert alice.api("GET", "/user/alice/dsportal/api/slice").json()["time_limit_s"] == 7200

    capped = extend(alice, 24 * 60)  # beyond the profile's 12 h: up to it, and said so
    assert capped.status_code == 200, capped.text
    assert capped.json()["message"] == ("Your session's walltime is now 12 h, the longest GPU partition allows "
                                        "(10 h more).")
    assert scontrol(job_id)["TimeLimit"] == "12:00:00"
    refused = extend(alice, 60)
    assert refused.status_code == 400
    assert refused.json()["message"] == ("Your session already has the longest walltime GPU partition allows, "
                                         "12 h; save your work before it ends.")

    for bad in ("lots", 0, -5, 1.5, True, 10**6, None):
        answer = extend(alice, bad)
        assert answer.status_code == 400, (bad, answer.text)
        assert answer.json()["message"].startswith("expected {'minutes': <1-1440>}"), answer.text
    # bob, without a session, asks the hub for more time: he has nothing to extend, and alice's stays.
    asked = at_service(bob.token, json={"minutes": 60})
    assert asked.status_code == 400 and asked.json()["message"] == "You have no running session to extend."
    # Nor with her session's name: his token opens his sessions only.
    assert at_service(bob.token, json={"minutes": 60, "server": ""}).json()["message"] == asked.json()["message"]
    assert scontrol(job_id)["TimeLimit"] == "12:00:00"
    # Nor through her session's server: neither her extension nor a forged "saved" line in her log.
    assert bob.api("POST", "/user/alice/dsportal/api/extend", json={"minutes": 60}).status_code == 403
    forged = bob.api("POST", "/user/alice/dsportal/api/walltime/saved", json={"saved": ["bob-was-here.ipynb"]})
    assert forged.status_code == 403
    with open(f"/home/alice/.dsportal/logs/session-{job_id}.log") as log:
        assert "bob-was-here" not in log.read()


HUB_CONFIG = """
import json, sys
from traitlets.config import Config
from portal.core import settings
from portal.hub import config
c = Config()
config.configure(c, settings.load(sys.argv[1]))
print(json.dumps({"extra_handlers": "extra_handlers" in c.JupyterHub, "services": c.JupyterHub.services,
                  "roles": c.JupyterHub.load_roles, "session_url": c.SlurmGPUSpawner.service_url}))
"""


def test_more_walltime_is_a_jupyterhub_service_not_a_deprecated_setting():
    """JupyterHub 3.1 deprecated extra_handlers for services: the hub starts dsportal's, with a role
    that reads sessions and their spawners' state, and tells sessions where it is. It has no route on
    the public proxy."""
    out = subprocess.run([sys.executable, "-c", HUB_CONFIG, str(CONFIG)], capture_output=True, text=True,
                         timeout=120, cwd=str(REPO), check=True).stdout
    hub = json.loads(out.splitlines()[-1])
    assert hub["extra_handlers"] is False
    (service,) = [s for s in hub["services"] if s["name"] == "dsportal"]
    assert service["command"][-2:] == ["-m", "portal.hub.extend"] and "url" not in service
    assert Path(service["environment"]["DSPORTAL_CONFIG"]).is_absolute()
    assert service["environment"]["DSPORTAL_SERVICE_BIND"] == "https://dsportal-login:8082"
    assert {"name": "dsportal-service", "services": ["dsportal"],
            "scopes": ["read:servers", "admin:server_state", "list:users", "start:servers"]} in hub["roles"]
    assert hub["session_url"] == "https://dsportal-login:8082/services/dsportal/"  # the hub's address, over TLS


def test_the_service_answers_only_its_tls_and_a_token_that_may_open_the_session(alice, bob):
    alice.spawn({"profile": "cpu", "walltime": "01:00:00"})
    job_id = only_job("alice")["job_id"]
    hub = settings_module.load(CONFIG).hub
    plain = hub.service_urls()[1].replace("https://", "http://")
    with pytest.raises(requests.exceptions.ConnectionError):  # no TLS, no answer
        requests.post(f"{plain}/services/dsportal/extend", json={"minutes": 5}, timeout=10)
    assert at_service("nope", json={"minutes": 5}).json()["message"] == (
        "The hub does not know this token (it may have expired).")
    assert at_service(bob.token, json={"minutes": 5}).status_code == 400  # his own sessions: none
    assert scontrol(job_id)["TimeLimit"] == "01:00:00"
    # Not through the public proxy: a user's scripts ask their session, as JupyterLab does.
    public = alice.api("POST", "/services/dsportal/extend", json={"minutes": 5})
    assert public.status_code in (403, 404) and scontrol(job_id)["TimeLimit"] == "01:00:00", public.text[:200]
    assert extend(alice, 5).status_code == 200 and scontrol(job_id)["TimeLimit"] == "01:05:00"


def test_extending_while_the_hub_is_down_says_so_and_works_once_it_is_back(alice):
    alice.spawn({"profile": "cpu", "walltime": "01:00:00"})
    job_id = only_job("alice")["job_id"]
    assert alice.api("GET", "/user/alice/api/status").status_code == 200  # her token, checked and kept
    demo.stop_hub()  # the proxy is a service of its own: her session is still reached
    try:
        answer = extend(alice, 30)
        assert answer.status_code == 503, answer.text
        assert answer.json()["message"].startswith("The hub is not answering right now, please retry"), answer.text
        assert scontrol(job_id)["TimeLimit"] == "01:00:00"
    finally:
        demo.ensure_hub()
    done = extend(alice, 30)
    assert done.status_code == 200, done.text
    assert scontrol(job_id)["TimeLimit"] == "01:30:00"


# bob's listener on the service's address: TLS with a certificate of his own for the hub's name, every
# connection's first request (or why there was none) appended to a file; bounded to 300 s.
NEIGHBOUR = r"""
import socket, ssl, sys, time
host, port, cert, key, out = sys.argv[1:6]
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
deadline = time.monotonic() + 30
while True:
    try:
        listener.bind((host, int(port)))
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
listener.listen(16)
listener.settimeout(1)
print("listening", flush=True)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
end = time.monotonic() + 300
with open(out, "ab", buffering=0) as log:
    while time.monotonic() < end:
        try:
            connection, _ = listener.accept()
        except socket.timeout:
            continue
        connection.settimeout(5)
        try:
            with context.wrap_socket(connection, server_side=True) as tls:
                log.write(b"handshake done\n" + tls.recv(65536) + b"\n")
        except OSError as error:
            log.write(f"no request: {error}\n".encode())
"""


def test_a_neighbour_on_the_services_port_gets_no_token_and_the_service_takes_it_back(alice):
    """bob, with a shell on the login node, takes the service's address while the hub is down, with a
    certificate of his own for the hub's name. alice's extension fails in words, and nothing of a token
    reaches him: the demo's firewall refuses her session's connection to his listener, and a client
    the firewall lets through (root's, with her token) refuses his certificate. A hub started while he
    holds the port has its service wait for it; sessions extend again once he lets go."""
    alice.spawn({"profile": "cpu", "walltime": "01:00:00"})
    job_id = only_job("alice")["job_id"]
    assert alice.api("GET", "/user/alice/api/status").status_code == 200  # her token, checked and kept
    bind = urlparse(settings_module.load(CONFIG).hub.service_urls()[0])
    folder = Path(tempfile.mkdtemp(prefix="dsportal-test-"))  # pytest's tmp_path is root's alone
    shutil.chown(folder, "bob")
    heard, hub_log = folder / "heard", paths().log / "hub.log"
    bob = None
    try:
        subprocess.run(["runuser", "-u", "bob", "--", "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj", f"/CN={bind.hostname}",
                        "-addext", f"subjectAltName=DNS:{bind.hostname}", "-keyout", str(folder / "key"),
                        "-out", str(folder / "cert")], check=True, capture_output=True)
        demo.stop_hub()
        bob = subprocess.Popen(["runuser", "-u", "bob", "--", sys.executable, "-c", NEIGHBOUR, bind.hostname,
                                str(bind.port), str(folder / "cert"), str(folder / "key"), str(heard)],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert bob.stdout.readline().strip() == "listening"  # the service went with its hub within a second
        answer = extend(alice, 30)
        assert answer.status_code == 503, answer.text
        assert answer.json()["message"].startswith("The hub is not answering right now, please retry"), answer.text
        assert scontrol(job_id)["TimeLimit"] == "01:00:00"
        with pytest.raises(requests.exceptions.SSLError):
            at_service(alice.token, json={"minutes": 30})
        logged = hub_log.stat().st_size
        demo.ensure_hub()  # its service finds the port taken, and waits
        for _ in range(60):
            with open(hub_log, "rb") as log:
                log.seek(logged)
                if b"is taken; sessions cannot extend their walltime until it is free" in log.read():
                    break
            time.sleep(0.5)
        else:
            raise AssertionError("the hub's service did not say it waits for its port")
        assert extend(alice, 30).status_code == 503
    finally:
        if bob:
            os.killpg(bob.pid, signal.SIGKILL)
            bob.wait()
        said = heard.read_bytes() if heard.exists() else b""
        shutil.rmtree(folder, ignore_errors=True)
        demo.ensure_hub()
    assert b"no request" in said, said  # root's client reached him, and left at his certificate
    assert b"handshake done" not in said and b"token" not in said.lower(), said
    for _ in range(60):  # the firewall refuses her at that port for 10 s after bob's listener did
        answer = extend(alice, 30)
        if answer.status_code != 503:
            break
        time.sleep(0.5)
    assert answer.status_code == 200, answer.text
    assert scontrol(job_id)["TimeLimit"] == "01:30:00"


def test_a_flood_of_connections_holds_the_service_to_its_cap_and_it_serves_after(portal):
    """Any local account reaches the service's port. Whoever opens connections to it by the hundred
    holds at most MOST_CONNECTIONS of them: each new one past that closes the oldest, and the service
    never runs out of file descriptors. Once they end, it serves again."""
    url = urlparse(settings_module.load(CONFIG).hub.service_urls()[1])
    flood = []
    try:
        for _ in range(MOST_CONNECTIONS + 40):
            flood.append(socket.create_connection((url.hostname, url.port), timeout=5))
        for connection in flood:
            connection.setblocking(False)
        closed = set()
        for _ in range(16):  # within the service's 10 s for a connection without a request
            for number, connection in enumerate(flood):
                try:
                    if connection.recv(1) == b"":
                        closed.add(number)
                except BlockingIOError:  # kept open, waiting for its TLS handshake
                    pass
                except ConnectionResetError:
                    closed.add(number)
            if len(closed) >= 40:
                break
            time.sleep(0.5)
        assert 40 <= len(closed) < len(flood), len(closed)
        assert min(closed) < 40, sorted(closed)  # the oldest went first
    finally:
        for connection in flood:
            connection.close()
    for _ in range(40):
        try:
            answer = at_service("nope", json={"minutes": 5})
            break
        except requests.ConnectionError:
            time.sleep(0.5)
    else:
        raise AssertionError("the service did not answer after the flood")
    assert answer.status_code == 403, answer.text


def test_the_partitions_own_limit_holds_though_the_hub_is_a_slurm_operator(second_hub):
    def generous_profile(config):  # the portal would allow more than the partition's MaxTime (4 h)
        next(p for p in config["profiles"] if p["name"] == "cpu")["max_walltime"] = "06:00:00"

    alice = login(second_hub(generous_profile), "alice")
    alice.spawn({"profile": "cpu", "walltime": "03:00:00"})
    job_id = only_job("alice")["job_id"]
    capped = extend(alice, 120)
    assert capped.status_code == 200, capped.text
    assert capped.json()["message"] == "Your session's walltime is now 4 h, the longest partition cpu allows (1 h more)."
    assert scontrol(job_id)["TimeLimit"] == "04:00:00"
    refused = extend(alice, 60)
    assert refused.status_code == 400
    assert refused.json()["message"] == ("Your session already has the longest walltime partition cpu allows, 4 h; "
                                         "save your work before it ends.")
    assert scontrol(job_id)["TimeLimit"] == "04:00:00"


def test_jupyterlab_warns_before_the_walltime_ends_and_extends_from_the_warning(alice):
    from test_browser import SHOTS, open_lab

    alice.spawn({"profile": "cpu", "walltime": "00:16:00"})  # 15 minutes left within a minute
    job_id = only_job("alice")["job_id"]
    with sync_playwright() as playwright:
        browser, page = open_lab(playwright)
        warning = page.locator(".Toastify__toast", has_text="Your session's walltime ends in")
        warning.wait_for(timeout=150_000)
        assert warning.get_by_role("button", name="Save all").is_visible()
        SHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOTS / "walltime-warning.png"))
        warning.get_by_role("button", name="Extend by 60 min").click()
        page.locator(".Toastify__toast", has_text="Your session's walltime is now 1 h 16 min").wait_for(timeout=30_000)
        page.locator(".dsportal-SliceStatus", has_text=" left").wait_for(timeout=10_000)
        browser.close()
    assert scontrol(job_id)["TimeLimit"] == "01:16:00"


EMPTY_NOTEBOOK = {"type": "notebook", "content": {
    "cells": [{"cell_type": "code", "source": "", "metadata": {}, "outputs": [], "execution_count": None}],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4, "nbformat_minor": 5}}


def test_at_the_walltimes_end_documents_are_saved_kernels_stop_and_the_next_page_says_so(alice):
    """Slurm signals the session (--signal, save_ahead 120 s) before its 4-minute walltime ends: the
    open JupyterLab saves what was typed and not saved, the kernels stop, the home page says so."""
    from test_browser import SHOTS, open_lab

    alice.spawn({"profile": "cpu", "walltime": "00:04:00"})
    job_id = only_job("alice")["job_id"]
    assert alice.api("PUT", "/user/alice/api/contents/walltime-end.ipynb", json=EMPTY_NOTEBOOK).status_code in (200, 201)
    with sync_playwright() as playwright:
        browser, page = open_lab(playwright, "lab/tree/walltime-end.ipynb?reset")
        editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
        editor.click(timeout=90_000)  # once the notebook's loading spinner is gone
        page.keyboard.type("typed before the end ")
        warning = page.locator(".Toastify__toast", has_text="walltime ends in about")
        for _ in range(200):  # keep typing (never saved by hand) until the session is told: ~1-2 min
            if warning.count():
                break
            page.keyboard.type("x")
            page.wait_for_timeout(1000)
        warning.first.wait_for(timeout=10_000)
        assert "saved walltime-end.ipynb" in warning.first.inner_text()
        SHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOTS / "walltime-end.png"))
        browser.close()
    with open("/home/alice/walltime-end.ipynb") as saved:
        assert "typed before the end x" in saved.read()

    deadline = time.monotonic() + 240  # the time limit, then Slurm's kill
    while alice.model()["servers"] and time.monotonic() < deadline:
        time.sleep(2)
    assert alice.model()["servers"] == {}
    home = alice.web.get(f"{HUB}/hub/home").text
    assert f"Your session job {job_id} reached its time limit (Slurm: TIMEOUT" in home, home
    assert "As it ended, JupyterLab saved: walltime-end.ipynb." in home, home
    log = open(f"/home/alice/.dsportal/logs/session-{job_id}.log").read()
    assert "dsportal: kernels shut down before the walltime's end" in log, log[-2000:]


def test_without_the_services_address_a_session_asks_nobody_in_its_place(monkeypatch):
    """A session started by an older hub has no address of dsportal's service: its extension is refused
    in words (409, jobs_api) and the request is never sent, to the hub's API or anywhere else."""
    import asyncio

    from portal.core import sessionvars
    from portal.session import hubapi

    monkeypatch.delenv(sessionvars.SESSION, raising=False)
    monkeypatch.setenv("JUPYTERHUB_API_URL", "https://127.0.0.1:9/hub/api")  # where a fall-back would go
    assert not hubapi.has_service()
    answer = asyncio.run(hubapi.service_post("extend", {"minutes": 5}))
    assert answer.code == 599 and "no address of dsportal's service" in str(answer.error)
