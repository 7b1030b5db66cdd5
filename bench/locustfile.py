"""People of a department clicking through the hub while a class starts (bench/hub_load.py runs it).

Each simulated person logs in as an account of its own (DSPORTAL_LOAD_USERS: [[name, password], ...]),
then, every few seconds (DSPORTAL_LOAD_WAIT: "least,most"), opens the home page, asks the hub API who
she is, or opens her token page: what a browser tab of the portal does, without starting a session
(the same on both hubs: stock batchspawner's has no spawn form, its /hub/spawn starts a session). Every request's time and outcome
goes to DSPORTAL_LOAD_RECORD (JSON, written as locust quits); each login adds a line to
DSPORTAL_LOAD_LOGINS, so the bench knows when all are in.

Runs in locust's own environment (/opt/dsportal/bench-env, scripts/install-deps.sh), not the hub's.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from locust import HttpUser, between, events, task

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from browsercookies import BrowserCookies

ACCOUNTS = json.loads(os.environ.get("DSPORTAL_LOAD_USERS", "[]"))
LEAST, MOST = (float(s) for s in os.environ.get("DSPORTAL_LOAD_WAIT", "5,15").split(","))
_accounts = itertools.count()
_records: list[tuple[float, float, bool, str, int]] = []  # (end time, milliseconds, ok, request name, HTTP status)


def keep_cookies_as_a_browser(session) -> None:
    """The session's cookies by BrowserCookies, for every request: requests copies them into a jar
    of the default policy for a request's first hop (as tests/hubclient.py's _Browser undoes too)."""
    session.cookies.set_policy(BrowserCookies())
    prepare_request = session.prepare_request

    def prepare(request):
        prepared = prepare_request(request)
        prepared.headers.pop("Cookie", None)
        prepared.prepare_cookies(session.cookies)
        return prepared

    session.prepare_request = prepare


@events.request.add_listener
def _record(request_type, name, response_time, response_length, exception=None, response=None, **_):
    status = getattr(response, "status_code", 0) or 0
    _records.append((time.time(), float(response_time), exception is None, f"{request_type} {name}", int(status)))


@events.quitting.add_listener
def _write_records(**_):
    path = os.environ.get("DSPORTAL_LOAD_RECORD")
    if path:
        with open(path, "w") as out:
            json.dump(_records, out)


class Person(HttpUser):
    wait_time = between(LEAST, MOST)

    def on_start(self):
        self.account, password = ACCOUNTS[next(_accounts) % len(ACCOUNTS)]
        keep_cookies_as_a_browser(self.client)
        page = self.client.get("/hub/login", name="/hub/login")
        # The hub sends its pages to its own host (subdomain_host): log in there.
        self.origin = f"{urlparse(page.url).scheme}://{urlparse(page.url).netloc}"
        with self.client.post(f"{self.origin}/hub/login", name="/hub/login", allow_redirects=False,
                              data={"username": self.account, "password": password, "_xsrf": self.xsrf()},
                              catch_response=True) as response:
            if response.status_code != 302:
                response.failure(f"login of {self.account} refused: {response.status_code}")
                return
        path = os.environ.get("DSPORTAL_LOAD_LOGINS")
        if path:
            with open(path, "a") as out:
                out.write(f"{self.account}\n")

    def xsrf(self) -> str:
        host = urlparse(self.origin).hostname
        return next((c.value for c in self.client.cookies if c.name == "_xsrf" and c.path.startswith("/hub")
                     and c.domain.lstrip(".") in (host, f"{host}.local")), "")

    def open(self, path: str, **kwargs) -> None:
        """GET a hub page or API path as this person; sent back to the login page counts as a failure."""
        with self.client.get(f"{self.origin}{path}", name=path.replace(self.account, "NAME"), catch_response=True,
                             **kwargs) as response:
            if response.ok and "/hub/login" in response.url:
                response.failure("not logged in (sent to the login page)")

    @task(3)
    def home(self):
        self.open("/hub/home")

    @task(3)
    def who_am_i(self):
        self.open("/hub/api/user", headers={"X-XSRFToken": self.xsrf()})

    @task(1)
    def tokens(self):
        # Not the spawn form: stock batchspawner's hub has none, and its /hub/spawn would start a session.
        self.open("/hub/token")
