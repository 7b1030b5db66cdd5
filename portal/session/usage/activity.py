"""In the session: tell the hub the session is in use while its kernels run code or its GPUs work.

JupyterHub's single-user server reports its last activity to the hub every
JUPYTERHUB_ACTIVITY_INTERVAL seconds: browser requests and kernel messages count. A cell that
trains for hours without printing, or a GPU program started from a terminal, makes neither, and
the hub's idle limit (profiles' `idle_timeout`) would stop a session that is working. So every
half interval this looks at the kernels' execution state and at the job's GPUs, and marks the
session active when one is busy. jupyter_server's last_activity() takes every `*_last_activity`
setting into account.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime

from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.ioloop import PeriodicCallback

from portal.core import sessionspec
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


def idle_state(web_app) -> dict:
    """What JupyterLab shows before the hub stops an unused session (GET dsportal/api/idle)."""
    spec = sessionspec.current()
    limit, interval = spec.idle_limit, spec.activity_interval
    idle = (datetime.now(UTC) - web_app.last_activity()).total_seconds()
    return {"limit_s": limit or None, "idle_s": int(idle),
            # the hub hears of use once per activity interval: stop-in counts from its view
            "stop_in_s": max(0, int(limit - idle - interval)) if limit else None}


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
