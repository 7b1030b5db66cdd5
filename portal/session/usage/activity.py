"""In the session: tell the hub the session is in use while its kernels run code or its GPUs work.

jupyter_server's last activity counts requests that change something and kernel and terminal
messages. A cell that trains for hours without printing, or a GPU program started from a terminal,
makes neither, and the hub's idle limit (profiles' `idle_timeout`) would stop a session that is
working. So every half interval this looks at the kernels' execution state and at the job's GPUs,
and marks the session active when one is busy. jupyter_server's last_activity() takes every
`*_last_activity` setting into account.

The session reports that last activity to the hub itself (:class:`Reports`): JupyterHub's
single-user reporter is off (its own setting, ``JupyterHubSingleUser.hub_activity_interval = 0``, in
jupyter-config/jupyter_server_config.json, installed with this code), because it sends the same
timestamp again every interval, in use or not.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from jupyter_server.base.handlers import APIHandler
from jupyterhub.utils import isoformat
from tornado import web
from tornado.ioloop import PeriodicCallback

from portal.core import defaults, sessionspec
from portal.session import hubapi
from portal.session.usage import sliceusage
from portal.upstream import session as upstream

KEY = "dsportal_last_activity"


def read_gpus(usage: sliceusage.SliceUsage, threshold: int) -> list[int]:
    """The job's GPUs at or above ``threshold`` % utilisation, read as the gauges read them (NVML)."""
    return sliceusage.busy_gpus(usage.read_gpus(), threshold)


def busy_kernels(kernel_manager) -> list[str]:
    return [model["id"] for model in kernel_manager.list_kernels() if model.get("execution_state") == "busy"]


KERNEL_ACTIONS = "https://events.jupyter.org/jupyter_server/kernel_actions/v1"


def restarted_kernels_start_over(server_app) -> None:
    """A kernel that died running a cell (the memory limit, a crash) and that its restarter starts
    again would stay "busy" to jupyter_server (jupyter_server#1395: the state only changes on a
    status message, and the dead kernel sends none). Busy, it would hold the session in use past
    its idle limit for good, and a client that connects afresh would not be "nudged" (jupyter_server
    skips busy kernels), so the new kernel's first output could be lost. When the restarter finds it
    dead, its state becomes "starting", as an asked-for restart makes it: the new kernel's first
    status message makes it idle."""
    kernel_manager = server_app.kernel_manager

    def start_over(kernel_id: str) -> None:
        try:
            kernel = kernel_manager.get_kernel(kernel_id)
        except KeyError:
            return
        if getattr(kernel, "execution_state", None) == "busy":
            kernel.execution_state = "starting"

    on_kernel_restart(server_app, start_over)


def on_kernel_restart(server_app, callback: Callable[[str], None]) -> None:
    """``callback(kernel_id)`` whenever a kernel's restarter finds it dead, before it starts it again,
    for every kernel the server starts (jupyter_server's kernel_actions event tells of each start)."""
    kernel_manager = server_app.kernel_manager

    async def on_kernel_action(logger, schema_id: str, data: dict) -> None:
        if data.get("action") == "start" and data.get("status") == "success" and data.get("kernel_id"):
            kernel_id = data["kernel_id"]
            kernel_manager.add_restart_callback(kernel_id, lambda: callback(kernel_id), "restart")

    server_app.event_logger.add_listener(schema_id=KERNEL_ACTIONS, listener=on_kernel_action)


def count_only_changes_as_use() -> None:
    """An open JupyterLab tab polls the server (kernels, sessions, contents) and saves its layout
    (PUT lab/api/workspaces, every 10 s) for as long as it is open: that must not keep GPUs held
    over a weekend. Requests that change something else (save a file, start a kernel, rename)
    count; so do kernel and terminal traffic, tracked apart."""
    upstream.count_api_activity_only(_changes_something)


def _changes_something(handler) -> bool:
    request = handler.request
    return request.method not in ("GET", "HEAD", "OPTIONS") and "/lab/api/workspaces" not in request.path


def setup(server_app) -> None:
    count_only_changes_as_use()
    restarted_kernels_start_over(server_app)
    spec = sessionspec.current()
    interval, threshold = spec.activity_interval, spec.gpu_busy_percent
    settings = server_app.web_app.settings
    usage = sliceusage.shared()
    mine = usage.gpus

    async def look() -> None:
        kernels = busy_kernels(settings["kernel_manager"])
        gpus = await asyncio.to_thread(read_gpus, usage, threshold) if mine or usage.gpu_uuids else []
        if kernels or gpus:
            settings[KEY] = datetime.now(UTC)
            server_app.log.debug("dsportal: in use (busy kernels %s, busy GPUs %s)", kernels, gpus)

    PeriodicCallback(look, max(1.0, interval / 2) * 1000).start()
    server_app.log.info("dsportal: busy kernels and GPUs %s count as activity (every %.0f s)",
                        sorted(mine) or "none", max(1.0, interval / 2))


def start_reports(server_app) -> None:
    """Report this session's use to the hub (:class:`Reports`). This install's jupyter_server_config.json turns
    JupyterHub's own reporter off, so this is the only one: it starts first of all but the guest gate
    (portal.session.extension), and a session where it cannot start does not start (fail closed): unreported, a
    session in use would be stopped at its profile's idle limit."""
    url = os.environ.get("JUPYTERHUB_ACTIVITY_URL", "")
    if not url:  # not started by a hub (JupyterHub's reporter would have nothing to report to either)
        server_app.log.warning("dsportal: no JUPYTERHUB_ACTIVITY_URL: the hub is told of no use of this session")
        return
    try:
        interval = _report_interval(server_app.log)
        reports = Reports(server_app.web_app.last_activity, interval,
                          hub_sender(url, os.environ.get("JUPYTERHUB_SERVER_NAME", ""), server_app.log), log=server_app.log)
        PeriodicCallback(reports.tick, reports.look_every * 1000).start()
    except Exception as error:
        server_app.log.critical("dsportal: this session cannot report its use to the hub (%r), so its idle limit could "
                                "stop it while in use: it does not start", error)
        raise SystemExit(1) from error
    server_app.log.info("dsportal: use reported to the hub as it comes, at most every %d s", interval)


def _report_interval(log) -> int:
    """session.activity_interval from the session's spec; the default where the spec does not validate (that is said
    where it matters, by the launcher and the gauges: the reports go on)."""
    try:
        return sessionspec.current().activity_interval
    except sessionspec.SpecError as error:
        log.warning("dsportal: activity reports every %d s at most (the session's spec: %s)", defaults.ACTIVITY_INTERVAL, error)
        return defaults.ACTIVITY_INTERVAL


def look_every(interval: float) -> float:
    """How often a session looks for news to report (seconds): within this of a first use after a quiet spell."""
    return max(1.0, min(5.0, interval / 4))


class Reports:
    """When the session was last used, told to the hub: only when it changed since the hub last took it,
    at once (within ``look_every`` s) after a quiet spell, and at most once an ``interval`` while the
    session stays in use.

    JupyterHub's own reporter posts every interval whatever happened (its notify_activity skips only a
    timestamp older than the last one sent, not the same one): a class of 100 sessions left open cost
    the hub 100 authenticated requests and database commits a minute, all of them saying nothing new
    (bench/results/scale-2026-12-07.md, run C). Proposed upstream: skip a timestamp already sent.

    The hub stops a session once its last reported use is older than the idle limit, so news is never
    dropped: a report the hub did not take (restarting, overloaded) is tried again after ``look_every``,
    doubling up to half an interval, with jitter, so that a hub coming back is not met by every session at
    once. The last use is also told again every ``RESEND`` intervals without news, so a hub whose database was
    put back from a backup learns it anew.
    """

    RESEND = 10

    def __init__(self, last_activity, interval: float, send: Callable[[datetime], Awaitable[bool]],
                 clock: Callable[[], float] = time.monotonic, jitter: Callable[[], float] = random.random, log=None):
        self._last_activity = last_activity
        self._clock, self._jitter, self._log = clock, jitter, log
        self.interval = interval
        self._send = send
        self.look_every = look_every(interval)
        self.sent: datetime | None = last_activity()  # the server's start: the hub knows of it already
        self._sent_at = clock()
        self._next_at = 0.0  # no report before then (on ``clock``)
        self._failures = 0
        self._unreadable = False

    async def tick(self) -> None:
        try:
            last = self._last_activity()
        except Exception:  # noqa: BLE001 - e.g. another extension's naive timestamp: said once, not every tick
            if not self._unreadable and self._log is not None:
                self._log.exception("dsportal: this session's last activity cannot be read; the hub is not told of use")
            self._unreadable = True
            return
        now = self._clock()
        news = self.sent is None or last > self.sent
        if now < self._next_at or not (news or now - self._sent_at >= self.RESEND * self.interval):
            return
        if await self._send(last):
            self.sent, self._sent_at, self._failures = last, now, 0
            # 20 % jitter, as JupyterHub's reporter: sessions that started together do not report together
            self._next_at = now + self.interval * (0.9 + 0.2 * self._jitter())
        else:
            self._failures += 1
            wait = min(self.interval / 2, self.look_every * 2 ** (self._failures - 1))
            self._next_at = now + wait * (0.9 + 0.2 * self._jitter())


def hub_sender(url: str, server_name: str, log) -> Callable[[datetime], Awaitable[bool]]:
    """POST a last activity to the hub's activity API (``url``: JUPYTERHUB_ACTIVITY_URL), as JupyterHub's own
    reporter does: True once the hub took it."""

    async def send(last: datetime) -> bool:
        stamp = isoformat(last if last.tzinfo else last.replace(tzinfo=UTC))
        response = await hubapi.request("POST", "", {"servers": {server_name: {"last_activity": stamp}},
                                                     "last_activity": stamp}, timeout=30, base=url)
        if response.code >= 400:
            log.warning("dsportal: the hub did not take this session's use (%s %s): trying again soon",
                        response.code, hubapi.message_of(response)[:200])
            return False
        return True

    return send


def idle_state(web_app) -> dict:
    """What JupyterLab shows before the hub stops an unused session (GET dsportal/api/idle)."""
    spec = sessionspec.current()
    limit, interval = spec.idle_limit, spec.activity_interval
    idle = (datetime.now(UTC) - web_app.last_activity()).total_seconds()
    return {"limit_s": limit or None, "idle_s": int(idle),
            # the hub may hear of the latest use up to an interval (and its jitter) and a look late: stop-in counts
            # from its view
            "stop_in_s": max(0, int(limit - idle - 1.1 * interval - look_every(interval))) if limit else None}


class IdleHandler(APIHandler):
    """GET: how long the session has been unused and when it will be stopped. POST ("Keep my
    session"): counts as use, like any request that changes something."""

    @web.authenticated
    def get(self):
        self.finish(json.dumps(idle_state(self.application)))

    @web.authenticated
    def post(self):
        self.settings["api_last_activity"] = datetime.now(UTC)
        self.finish(json.dumps(idle_state(self.application)))
