"""The session's gauges: its use against its slice's limits, and kernels the memory limit killed.

GET dsportal/api/usage answers what JupyterLab's status bar and its Slice panel show: memory against
the job cgroup's limit, CPU against the slice's cores, each of the slice's GPUs (sliceusage.py, the
one measurement), the fraction of memory from which JupyterLab warns, and the kernels the memory
limit killed.

A kernel past the limit is killed by the Linux OOM killer (SIGKILL): to jupyter_client that is a
kernel that died, restarted empty, without a word. Each kernel's restarter tells this module when
its kernel died; when the limiting cgroup's OOM-kill count went up since the last look and the
kernel ended by SIGKILL, the death is the memory limit's. It is said in the server's log, emitted on
Jupyter's event bus (:data:`SCHEMA_ID`: open JupyterLabs say so at once) and kept for the usage API.

jupyter-resource-usage (its kernel usage panel, /api/metrics/v1, Prometheus gauges) is given the
slice's limits instead of the node's.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from dataclasses import asdict, dataclass

from tornado import web
from traitlets import Float, Int
from traitlets.config import LoggingConfigurable

from portal.session.api import MessageAPIHandler
from portal.session.usage.activity import on_kernel_restart
from portal.session.usage.sliceusage import SliceUsage, shared

SCHEMA_ID = "https://dsportal.invalid/events/kernel-out-of-memory/v1"
SCHEMA = {
    "$id": SCHEMA_ID,
    "version": "1",
    "title": "A kernel was killed by the session's memory limit",
    "personal-data": False,
    "description": "The slice's memory limit was reached: the Linux OOM killer ended a kernel.",
    "type": "object",
    "required": ["kernel_id", "message"],
    "properties": {"kernel_id": {"type": "string"}, "kernel_name": {"type": "string"},
                   "message": {"type": "string", "description": "What happened, for a person."}},
}
KEPT_DEATHS = 20


class SliceGauges(LoggingConfigurable):
    """What the session's gauges warn about and how often JupyterLab reads them."""

    memory_warning_percent = Float(
        90.0, min=0, max=100,
        help="JupyterLab warns once the session's memory use reaches this share of its slice's limit (0: never). "
             "Past the limit the kernel's OOM killer ends the process that asked for more, usually a kernel.",
    ).tag(config=True)
    refresh_seconds = Int(
        5, min=1,
        help="How often JupyterLab's status bar reads the session's use (GET dsportal/api/usage).",
    ).tag(config=True)


@dataclass
class KernelDeath:
    kernel_id: str
    kernel_name: str
    at: float
    by_memory_limit: bool
    message: str


class KernelWatch:
    """Kernel deaths of this server, each judged by the memory limit's OOM-kill count."""

    def __init__(self, usage: SliceUsage, log):
        self.usage, self.log = usage, log
        self.deaths: list[KernelDeath] = []
        self.oom_kills = usage.memory().oom_kills

    def died(self, kernel_manager, kernel_id: str) -> KernelDeath | None:
        try:
            kernel = kernel_manager.get_kernel(kernel_id)
        except KeyError:
            return None
        memory = self.usage.memory()
        killed = _killed_by_sigkill(kernel)
        new_kills, self.oom_kills = memory.oom_kills - self.oom_kills, memory.oom_kills
        name = kernel.kernel_spec.display_name if kernel.kernel_spec else kernel.kernel_name
        if new_kills > 0 and killed is not False:
            message = (f"The kernel {name} was stopped because your session ran out of memory: its slice holds "
                       f"{human_bytes(memory.limit_bytes)}, and the Linux out-of-memory killer ended the kernel when "
                       "that was used up. Its variables are lost and it restarts empty. Load less data at once, free "
                       "what you no longer need, or start a session with more memory.")
        else:
            message = f"The kernel {name} died (exit {_exit_text(kernel)}); it restarts empty."
        death = KernelDeath(kernel_id, name, time.time(), new_kills > 0 and killed is not False, message)
        self.deaths = (self.deaths + [death])[-KEPT_DEATHS:]
        self.log.warning("dsportal: %s", message)
        return death


def _process(kernel):
    return getattr(getattr(kernel, "provisioner", None), "process", None)


def _killed_by_sigkill(kernel) -> bool | None:
    """True/False from the kernel's exit status; None where it is not known (not a local process)."""
    process = _process(kernel)
    code = getattr(process, "returncode", None)
    return None if code is None else code == -signal.SIGKILL


def _exit_text(kernel) -> str:
    code = getattr(_process(kernel), "returncode", None)
    if code is None:
        return "status unknown"
    return f"signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"code {code}"


def human_bytes(count: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20)):
        if count >= size:
            return f"{count / size:.1f} {unit}".replace(".0 ", " ")
    return f"{count} bytes"


def feed_resource_usage(settings: dict, usage: SliceUsage) -> bool:
    """jupyter-resource-usage shows the node's memory and CPUs unless told the limits: give it the
    slice's (its traitlets mem_limit, a callable it calls at each reading, and cpu_limit). Its
    warning threshold follows the gauges'. False where it is not installed or not loaded."""
    display = settings.get("jupyter_resource_usage_display_config")
    if display is None:
        return False
    display.mem_limit = lambda rss=None, pss=None: usage.memory_limit()
    display.cpu_limit = float(usage.cores)
    display.track_cpu_percent = True
    return True


def setup(server_app) -> list:
    config = SliceGauges(parent=server_app)
    usage = shared()
    watch = KernelWatch(usage, server_app.log)
    settings = server_app.web_app.settings
    settings.update(dsportal_gauges=config, dsportal_kernel_watch=watch)
    server_app.event_logger.register_event_schema(SCHEMA)
    kernel_manager = server_app.kernel_manager

    def on_death(kernel_id: str) -> None:
        death = watch.died(kernel_manager, kernel_id)
        if death and death.by_memory_limit:
            server_app.event_logger.emit(schema_id=SCHEMA_ID, data={
                "kernel_id": death.kernel_id, "kernel_name": death.kernel_name, "message": death.message})

    on_kernel_restart(server_app, on_death)
    fed = feed_resource_usage(settings, usage)
    server_app.log.info("dsportal: gauges of the slice: memory limit %s (%s), %s cores (%s), GPUs %s%s",
                        human_bytes(usage.memory_limit()), usage.memory().limit_from, usage.cores, usage.cores_from,
                        sorted(usage.gpus) or "none", "; jupyter-resource-usage given the slice's limits" if fed else "")
    return [("dsportal/api/usage", UsageHandler)]


class UsageHandler(MessageAPIHandler):
    """GET: the slice's use against its limits (sliceusage.Usage), the warning threshold, and the
    kernels that died (``deaths``: newest last; ``by_memory_limit`` where the memory limit killed it)."""

    @web.authenticated
    async def get(self):
        usage = await asyncio.to_thread(shared().read)
        config: SliceGauges = self.settings["dsportal_gauges"]
        watch: KernelWatch = self.settings["dsportal_kernel_watch"]
        self.finish(json.dumps({
            **usage.to_json(),
            "memory_warning_fraction": config.memory_warning_percent / 100,
            "refresh_s": config.refresh_seconds,
            "kernel_deaths": [asdict(death) for death in watch.deaths],
        }))


if __name__ == "__main__":  # python -m portal.session.usage.gauges: what the gauges read here, once
    reading = shared()
    reading.cpu()
    time.sleep(1)
    json.dump(reading.read().to_json(), sys.stdout, indent=1)
    print()
