"""A session tells the hub of its use only when there is news (portal.session.usage.activity.Reports).

First the seam (the report's sending and the clock given), then a real session server with a stand-in for
the hub's API. The whole path, a session's reports keeping a busy session and one with no news stopped at its
idle limit, is test_idle.py's on the demo cluster.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import secrets
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jupyterhub
import pytest
import requests

from hubclient import free_port
from portal.core import sessionvars
from portal.core.sessionspec import SessionSpec
from portal.session.usage.activity import Reports

pytestmark = pytest.mark.quick

START = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
CHECKOUT = Path(__file__).resolve().parent.parent


class Session:
    def __init__(self, answers=()):
        self.last = START
        self.now = 1000.0
        self.sent: list[datetime] = []
        self.answers = list(answers)
        self.reports = Reports(lambda: self.last, 60, self.send, clock=lambda: self.now, jitter=lambda: 0.5)

    async def send(self, last: datetime) -> bool:
        self.sent.append(last)
        return self.answers.pop(0) if self.answers else True

    def tick(self, after: float = 0.0) -> list[datetime]:
        self.now += after
        asyncio.run(self.reports.tick())
        return self.sent


def test_a_session_left_alone_tells_the_hub_once_every_ten_intervals():
    session = Session()
    for _ in range(119):
        assert session.tick(after=5) == []  # its start is known to the hub already
    assert session.tick(after=5) == [START]  # ten minutes: told again (a hub put back from a backup learns it)
    assert session.tick(after=5) == [START]


def test_use_is_told_at_once_after_a_quiet_spell_then_at_most_once_an_interval():
    session = Session()
    session.tick(after=300)
    session.last = START + timedelta(seconds=300)
    assert session.tick(after=5) == [session.last]  # at once
    assert session.tick(after=5) == [session.last]  # the same use is not told again
    first = session.last
    session.last += timedelta(seconds=10)  # still in use
    assert session.tick(after=10) == [first]  # not yet: the last report is under an interval old
    assert session.tick(after=45) == [first, session.last]  # an interval after the last report


def test_a_report_the_hub_did_not_take_is_tried_again_soon_then_less_often():
    session = Session(answers=[False, False, False, False, False, True])
    session.last = START + timedelta(seconds=30)
    assert session.tick(after=5) == [session.last]
    assert session.tick(after=4) == [session.last]  # not at every look: a hub restarting is not flooded
    tries = [session.tick(after=1) and len(session.sent)]  # 5 s after the first
    waited = 0
    while len(session.sent) < 6:
        session.tick(after=1)
        waited += 1
    assert tries == [2] and waited == 10 + 20 + 30 + 30  # 5, 10, 20, then half an interval
    assert set(session.sent) == {session.last}  # the use is not dropped
    assert session.tick(after=30) == [session.last] * 6  # taken: nothing more


def test_a_last_activity_that_cannot_be_read_is_said_once():
    said = []

    class Log:
        def exception(self, text, *args):
            said.append(text)

    def unreadable():
        raise TypeError("can't compare offset-naive and offset-aware datetimes")

    reports = Reports(lambda: START, 60, None, log=Log())
    reports._last_activity = unreadable
    for _ in range(3):
        asyncio.run(reports.tick())
    assert len(said) == 1


class StandInHub(http.server.BaseHTTPRequestHandler):
    """The hub's API as a session's server meets it: its version, the token check, the activity reports (kept)."""

    reports: list[dict] = []
    token = secrets.token_hex(16)

    def _answer(self, body: dict, code: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("X-JupyterHub-Version", jupyterhub.__version__)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.startswith("/hub/api/user") and self.headers.get("Authorization") == f"token {self.token}":
            self._answer({"kind": "user", "name": "x", "admin": False, "groups": [], "session_id": None,
                          "scopes": ["access:servers!user=x"]})
        elif self.path.startswith("/hub/api/user"):
            self._answer({"status": 403, "message": "no"}, 403)
        else:
            self._answer({"version": jupyterhub.__version__})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        StandInHub.reports.append({"path": self.path, **body})
        self._answer({})

    def log_message(self, *args):
        pass


def test_a_real_session_server_tells_its_hub_of_use_and_of_nothing_else(tmp_path):
    """jupyterhub-singleuser with dsportal's session config (this checkout's) and a stand-in for the hub's API:
    JupyterHub's own reporter is off, nothing is sent while nobody uses the session, and "Keep my session" (a
    request that changes something) reaches the hub within seconds, as JupyterHub's activity API takes it."""
    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInHub)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    config = tmp_path / "config"
    (config / "jupyter_server_config.d").mkdir(parents=True)
    shutil.copy(CHECKOUT / "jupyter-config" / "dsportal-jobs.json", config / "jupyter_server_config.d")
    shutil.copy(CHECKOUT / "jupyter-config" / "jupyter_server_config.json", config)
    port, api = free_port(), f"http://127.0.0.1:{hub.server_port}/hub/api"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "PYTHONPATH": str(CHECKOUT), "JUPYTER_CONFIG_PATH": str(config), "JUPYTER_RUNTIME_DIR": str(tmp_path),
           "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}/user/x/", "JUPYTERHUB_SERVICE_PREFIX": "/user/x/",
           "JUPYTERHUB_API_URL": api, "JUPYTERHUB_API_TOKEN": StandInHub.token, "JUPYTERHUB_USER": "x",
           "JUPYTERHUB_CLIENT_ID": "jupyterhub-user-x", "JUPYTERHUB_ACTIVITY_URL": f"{api}/users/x/activity",
           "JUPYTERHUB_ACTIVITY_INTERVAL": "1",  # JupyterHub's reporter, were it on, would post every second
           "JUPYTERHUB_OAUTH_ACCESS_SCOPES": json.dumps(["access:servers!user=x"]),
           sessionvars.SESSION: SessionSpec(activity_interval=2).model_dump_json()}
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([str(Path(sys.executable).parent / "jupyterhub-singleuser"), "--allow-root"],
                                  env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}/user/x"
        headers = {"Authorization": f"token {StandInHub.token}"}
        for _ in range(120):
            assert server.poll() is None, log.read_text()
            try:
                if requests.get(f"{base}/api/status", headers=headers, timeout=5).ok:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        time.sleep(5)  # 5 of JupyterHub's intervals, 2.5 of dsportal's
        assert "Activity events disabled" in log.read_text()
        assert StandInHub.reports == []
        kept = requests.post(f"{base}/dsportal/api/idle", headers=headers, timeout=10)
        assert kept.ok, kept.text
        for _ in range(20):
            if StandInHub.reports:
                break
            time.sleep(0.5)
        [report] = StandInHub.reports
        assert report["path"] == "/hub/api/users/x/activity"
        assert set(report["servers"]) == {""} and report["servers"][""]["last_activity"] == report["last_activity"]
        assert report["last_activity"].endswith("Z")
        time.sleep(3)
        assert len(StandInHub.reports) == 1  # told once
    finally:
        server.terminate()
        server.wait(timeout=30)
        hub.shutdown()
