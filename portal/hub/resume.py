"""Sessions whose start a hub restart cut short, started again as the hub comes back; and sessions whose job
Slurm preempted and put back in the queue, started again as they are found.

JupyterHub cannot go on with a start after its restart (it stores a spawner's state once start()
returns, and its startup check stops whatever has no server yet). A session job still queued when
the hub stopped, or just started and asking the hub to take its port, is kept, not cancelled: the
hub's startup check records it as the spawner's ``kept_job`` (spawner.partitionspawner), and here
dsportal's service starts that session again through the hub's REST API, with the options she last
chose (``{"user_options": null}``). That start takes the job over (SlurmGPUSpawner's
_take_over_queued_job): she keeps her place in the queue, and the job's server is let in with the
token it was submitted with (portal.hub.portreport).

The service asks at its start and again, with growing pauses, while any is left (for up to an hour):
JupyterHub's check of its sessions may still be going on when it serves (init_spawners_timeout), and a
start the hub refuses for now (a stop still pending, too many starts at once, load shed) is asked again.
Up to AT_ONCE starts are asked for at once. The hub's answer to each start is logged; a start refused
outright (her request no longer allowed) is told to her on her home page by the spawner, which lets
its job go. Until her session is started again, her home page says her job keeps its place and that
starting it herself takes it over.

A session whose job Slurm preempted and requeued (its partition's PreemptMode REQUEUE) is kept the same way by
the spawner's poll. Where a profile preempts by requeueing, the service looks every STEADY seconds, for as long
as it runs, at the session jobs Slurm restarted (:func:`keep_resuming`), and starts each kept one again: that
start takes the job over and waits, in her page's progress, until Slurm runs it again (as any session waiting
in the queue, it counts among the starts under way).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from urllib.parse import quote

log = logging.getLogger("dsportal.resume")

PAUSES = (5, 10, 20, 40)  # seconds between passes, then PAUSE_MOST each, while sessions are left to start
PAUSE_MOST = 60
RESUME_FOR = 3600  # seconds after the service starts: then what is left is logged (her page says so already)
AT_ONCE = 8  # starts asked for at once (each waits up to the hub's slow_spawn_timeout for its answer)
PAGE = 200  # users per request (JupyterHub's api_page_max_limit default)
STEADY = 20  # seconds between the passes that find sessions whose job Slurm requeued (keep_resuming)


def kept_in(users: list) -> list[tuple[str, str]]:
    """(user, session name) of every stopped session whose state holds a kept job, from the hub's
    /users answer (with include_stopped_servers and admin:server_state)."""
    found = []
    for user in users if isinstance(users, list) else []:
        servers = user.get("servers") if isinstance(user, dict) else None
        for name, server in (servers or {}).items() if isinstance(servers, dict) else ():
            state = server.get("state") if isinstance(server, dict) else None
            if isinstance(state, dict) and state.get("kept_job") and not server.get("pending") and server.get("stopped"):
                found.append((str(user.get("name", "")), str(name)))
    return found


async def kept_sessions(hub) -> list[tuple[str, str]] | None:
    """Every session with a kept job; None where the hub did not answer (asked again at the next pass)."""
    found, offset = [], 0
    while True:
        response = await hub.call("GET", f"/users?include_stopped_servers=1&offset={offset}&limit={PAGE}")
        if response.code != 200:
            log.warning("Could not list the sessions to start again (%s): asked again later", response.code)
            return None
        users = json.loads(response.body)
        found += kept_in(users)
        if len(users) < PAGE:
            return found
        offset += PAGE


async def resume(hub, user: str, name: str) -> bool:
    """Start ``user``'s session ``name`` again; whether the hub took the start (201, 202)."""
    path = f"/users/{quote(user, safe='')}/" + (f"servers/{quote(name, safe='')}" if name else "server")
    response = await hub.call("POST", path, {"user_options": None})
    said = response.body.decode(errors="replace")[:300] if response.body else response.reason
    if response.code in (201, 202):
        log.info("Session %s/%s, whose job was kept (a hub restart, or Slurm requeued it), started again: it "
                 "takes over its queued job", user, name)
        return True
    log.warning("Session %s/%s, whose job was kept (a hub restart, or Slurm requeued it), not started again yet "
                "(%s: %s)", user, name, response.code, said)
    return False


async def resume_all(hub, sessions: list[tuple[str, str]], at_once: asyncio.Semaphore) -> None:
    """Start each of ``sessions`` again (user, session name), at most ``at_once`` at a time."""
    async def one(user: str, name: str) -> bool:
        async with at_once:
            return await resume(hub, user, name)

    await asyncio.gather(*(one(user, name) for user, name in sessions))


async def resume_kept(hub, pauses=PAUSES, pause_most: float = PAUSE_MOST, resume_for: float = RESUME_FOR) -> None:
    """Start again every session cut short by the hub's restart: a pass at once, then after each pause
    (``pauses``, then ``pause_most``) while any is left, for ``resume_for`` seconds. A start the hub refuses
    for now (a stop still pending, too many starts at once, the hub shedding load) is asked again at the
    next pass; one refused for good is told on her page by the spawner, which lets its job go."""
    loop = asyncio.get_running_loop()
    until = loop.time() + resume_for
    at_once = asyncio.Semaphore(AT_ONCE)

    for attempt in itertools.count():
        try:
            left = await kept_sessions(hub)
            if left is not None and not left:
                return
            if left:
                await resume_all(hub, left, at_once)
        except Exception:  # the next pass asks again; the service's own work goes on
            log.exception("Resuming sessions cut short by the hub's restart failed; asked again later")
        pause = pauses[attempt] if attempt < len(pauses) else pause_most
        if loop.time() + pause > until:
            log.warning("Sessions cut short by the hub's restart are still not started again after %.0f s: "
                        "each user's page says to start it (that start takes the queued job over)", resume_for)
            return
        await asyncio.sleep(pause)


async def keep_resuming(hub, slurm, every: float = STEADY) -> None:
    """Every ``every`` seconds, for as long as the service runs: start again each session whose job Slurm
    requeued and the hub kept. Slurm names the candidates (a session job, queued or running, with a restart
    count: one shared squeue); the hub is asked only about their users. A pass that fails is logged; the next
    one asks again."""
    at_once = asyncio.Semaphore(AT_ONCE)
    while True:
        await asyncio.sleep(every)
        try:
            jobs = await slurm.jobs()
            users = sorted({job.user for job in jobs.values() if job.restarts and (job.pending or job.running)})
            left = []
            for user in users:
                response = await hub.call("GET", f"/users/{quote(user, safe='')}?include_stopped_servers=1")
                if response.code == 200:
                    left += kept_in([json.loads(response.body)])
            if left:
                await resume_all(hub, left, at_once)
        except Exception:  # the next pass asks again; the service's own work goes on
            log.exception("Looking for sessions whose job Slurm requeued failed; asked again later")
