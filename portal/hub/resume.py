"""Sessions whose start a hub restart cut short, started again as the hub comes back.

JupyterHub cannot go on with a start after its restart (it stores a spawner's state once start()
returns, and its startup check stops whatever has no server yet). A session job still queued when
the hub stopped, or just started and asking the hub to take its port, is kept, not cancelled: the
hub's startup check records it as the spawner's ``kept_job`` (spawner.partitionspawner), and here
dsportal's service starts that session again through the hub's REST API, with the options she last
chose (``{"user_options": null}``). That start takes the job over (SlurmGPUSpawner's
_take_over_queued_job): she keeps her place in the queue, and the job's server is let in with the
token it was submitted with (portal.hub.portreport).

The service asks at its start and a few more times in its first minutes (PASSES): JupyterHub's check
of its sessions may still be going on when it serves (init_spawners_timeout), and a start the hub
refuses for now (a stop still pending, too many starts at once) is asked again. The hub's answer to
each start is logged; a start refused outright (her request no longer allowed) is told to her on her
home page by the spawner, and its job is cancelled there.
"""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import quote

log = logging.getLogger("dsportal.resume")

PASSES = (0, 5, 15, 30, 60, 120)  # seconds after the service starts
PAGE = 200  # users per request (JupyterHub's api_page_max_limit default)


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


async def kept_sessions(hub) -> list[tuple[str, str]]:
    found, offset = [], 0
    while True:
        response = await hub.call("GET", f"/users?include_stopped_servers=1&offset={offset}&limit={PAGE}")
        if response.code != 200:
            log.warning("Could not list the sessions to resume (%s): asked again later", response.code)
            return found
        users = json.loads(response.body)
        found += kept_in(users)
        if len(users) < PAGE:
            return found
        offset += PAGE


async def resume(hub, user: str, name: str) -> None:
    path = f"/users/{quote(user, safe='')}/" + (f"servers/{quote(name, safe='')}" if name else "server")
    response = await hub.call("POST", path, {"user_options": None})
    said = response.body.decode(errors="replace")[:300] if response.body else response.reason
    if response.code in (201, 202):
        log.info("Session %s/%s, cut short by a hub restart, started again: it takes over its queued job",
                 user, name)
    else:
        log.warning("Session %s/%s, cut short by a hub restart, not started again yet (%s: %s)",
                    user, name, response.code, said)


async def resume_kept(hub, passes=PASSES) -> None:
    """Start again every session cut short by the hub's restart, at each of ``passes`` (seconds)."""
    started = asyncio.get_running_loop().time()
    for at in passes:
        await asyncio.sleep(max(0.0, started + at - asyncio.get_running_loop().time()))
        try:
            for user, name in await kept_sessions(hub):
                await resume(hub, user, name)
        except Exception:  # the next pass asks again; the service's own work goes on
            log.exception("Resuming sessions cut short by the hub's restart failed; asked again later")
