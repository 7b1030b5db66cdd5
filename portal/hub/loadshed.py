"""An overloaded hub sheds what can wait (page views, polling), never what keeps a session alive.

The hub serves everything on one event loop. When a hundred scripts poll their user model twice a
second while a class starts, each poll costs the loop a token look-up and a user model from the
database, and a session's port report waits behind hundreds of them: late enough, its start fails.

So the hub watches how late its loop runs a timer (:class:`LoopLag`). While it lags, a read that
can wait (a GET or HEAD of a hub page or of the REST API's users, groups and info) is answered at
once with 429, a Retry-After header and a sentence, as it is routed: before authentication and the
database, so a refused request costs the loop next to nothing. Everything else is served as
always: port reports, activity, starts and stops and their progress, logins, sessions' token and
OAuth checks, static files. Nothing is queued or remembered: once the loop keeps time again,
everything is served, and the next class meets the hub as the first did.

Installed through tornado's public routing API (``Application.add_handlers``: its rules are tried
before the hub's own handlers); the matcher answers None, passing the request on, unless it sheds.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import time
from collections import deque

from tornado import web
from tornado.routing import Matcher, Rule

from portal.hub import metrics
from portal.upstream import hub as upstream

# Reads that can wait, under the hub's base URL: its pages and the REST API's lists and models.
# The spawn form is one (a start begins with its POST); the pending page and progress stream are not.
SHEDDABLE = re.compile(
    r"(?:home|admin|token|spawn(?:/[^/]+(?:/[^/]+)?)?|metrics|"
    r"api/(?:users(?:/[^/]+)?|groups(?:/.*)?|info|proxy|services(?:/.*)?|shares(?:/.*)?))/?$")
SAFE_METHODS = frozenset({"GET", "HEAD"})


class LoopLag:
    """How late the event loop runs a timer due every ``interval`` seconds. ``overloaded`` once ``sustained``
    timers in a row within ``hold`` seconds ran ``threshold`` seconds late, until ``hold`` seconds after the last of
    them. One late timer alone is a single long step of the loop (JupyterHub's sweep of every user's activity,
    a few hundred milliseconds with a thousand users), after which the loop keeps time again: shedding the
    second after it sent 429s to people a loop with time to spare would have served (2.7 % of the clicks of
    1,000 people, make bench 2026-12-07)."""

    def __init__(self, interval: float = 0.05, threshold: float = 0.5, hold: float = 1.0, sustained: int = 2):
        self.interval, self.threshold, self.hold = interval, threshold, hold
        self.lag = 0.0
        self._until = 0.0
        self._due = 0.0
        self._late: deque[float] = deque(maxlen=sustained)  # when the last late timers ran

    def start(self) -> None:
        self._due = time.monotonic() + self.interval
        asyncio.get_running_loop().call_later(self.interval, self._tick)

    def _tick(self) -> None:
        now = time.monotonic()
        self.observe(now - self._due, now)
        self._due = now + self.interval
        asyncio.get_running_loop().call_later(self.interval, self._tick)

    def observe(self, lag: float, now: float) -> None:
        """A timer due at ``now - lag`` ran at ``now`` (time.monotonic())."""
        self.lag = max(0.0, lag)
        if self.lag < self.threshold:
            self._late.clear()
            return
        self._late.append(now)
        if len(self._late) == self._late.maxlen and now - self._late[0] <= self.hold:
            self._until = now + self.hold

    @property
    def overloaded(self) -> bool:
        return time.monotonic() < self._until

    def retry_after(self) -> int:
        """Seconds to suggest: the longer the loop lags, the longer to wait (2 to 30)."""
        return int(min(30, max(2, 4 * self.lag)))


class Sheddable(Matcher):
    """Matches (and so sheds) a request that can wait, while the loop is overloaded; else None."""

    def __init__(self, lag: LoopLag, base_url: str):
        self.lag = lag
        self.prefix = base_url if base_url.endswith("/") else base_url + "/"

    def match(self, request):
        if request.method not in SAFE_METHODS or not self.lag.overloaded:
            return None
        path = request.path
        if not path.startswith(self.prefix) or not SHEDDABLE.fullmatch(path[len(self.prefix):]):
            return None
        return {}


def message(retry_after: int) -> str:
    return (f"The portal is very busy right now and answers what keeps sessions running first; this page "
            f"or request can wait, so it was not served. Sessions starting or running are not affected. "
            f"Please try again in {retry_after} s.")


class ShedHandler(web.RequestHandler):
    """429 with Retry-After and a sentence: JSON for the REST API, a page that reloads itself else."""

    def initialize(self, lag: LoopLag, api_prefix: str):
        self.lag, self.api_prefix = lag, api_prefix

    def prepare(self):
        retry_after = self.lag.retry_after()
        metrics.REQUESTS_SHED.inc()
        answer_busy(self, message(retry_after), retry_after, self.request.path.startswith(self.api_prefix), reload=True)


def answer_busy(handler, text: str, retry_after: int, as_json: bool, reload: bool = False) -> None:
    """429 with Retry-After and ``text``: JSON for the REST API, else a short page (that reloads itself
    after ``retry_after`` where ``reload``: a GET may be asked again; a login's POST may not)."""
    handler.set_status(429)
    handler.set_header("Retry-After", str(retry_after))
    handler.set_header("Cache-Control", "no-store")
    if as_json:
        handler.set_header("Content-Type", "application/json")
        handler.finish(json.dumps({"status": 429, "message": text}))
        return
    refresh = f'<meta http-equiv="refresh" content="{retry_after}">' if reload else ""
    after = " This page reloads by itself." if reload else ""
    handler.set_header("Content-Type", "text/html; charset=utf-8")
    handler.finish(f"<!doctype html><html><head><title>The portal is busy</title>{refresh}</head>"
                   f"<body><p>{html.escape(text)}{after}</p></body></html>")


def install(lag: LoopLag) -> None:
    """Shed what can wait, judged by ``lag``, on the hub's application as JupyterHub builds it."""

    def shed_on(hub) -> None:
        application = hub.tornado_application
        if getattr(application, "dsportal_sheds", False):
            return
        base_url = hub.hub.base_url  # /hub/
        application.add_handlers(r".*$", [Rule(Sheddable(lag, base_url), ShedHandler,
                                               {"lag": lag, "api_prefix": base_url + "api/"})])
        application.dsportal_sheds = True
        asyncio.get_event_loop().call_soon(lag.start)

    upstream.after_init_tornado_application(shed_on)
