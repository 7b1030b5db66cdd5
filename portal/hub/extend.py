"""POST /hub/api/dsportal/extend: more walltime for the caller's own running session.

A user may not raise her job's time limit in Slurm (only operators may); the hub, a Slurm operator,
does it for her session, up to her profile's max_walltime, and Slurm still applies the partition's
and QoS's limits. The session's JupyterLab asks through its server (portal.session.jobs_api), with
its own token: that token names the session. A user's own API token names none: ``{"server": NAME}``
picks one of her sessions ('' or left out: the default one).
"""

from __future__ import annotations

import json

from jupyterhub.apihandlers import APIHandler
from tornado import web

from ..settings import json_kind, shown

MOST_MINUTES = 24 * 60  # one request; the profile's max_walltime caps the total


class ExtendHandler(APIHandler):
    @web.authenticated
    async def post(self):
        user = self.current_user
        body = self.get_json_body()
        minutes = body.get("minutes") if isinstance(body, dict) else None
        if not isinstance(minutes, int) or isinstance(minutes, bool) or not 1 <= minutes <= MOST_MINUTES:
            raise web.HTTPError(400, f"expected {{'minutes': <1-{MOST_MINUTES}>}}, not {json_kind(body)}")
        server = body.get("server", "")
        if not isinstance(server, str):
            raise web.HTTPError(400, f"'server' is a session's name, not {json_kind(server)}")
        spawners = getattr(user, "spawners", {})
        token = self.get_auth_token()
        spawner = next((s for s in spawners.values() if token and s.api_token == token), None)  # a session's own
        if spawner is None:
            spawner = spawners[server] if server in getattr(user, "orm_spawners", {}) else None
        session = getattr(spawner, "child_spawner", None)
        named = f" named {shown(server)}" if server else ""
        if spawner is None or not spawner.active or session is None:
            raise web.HTTPError(400, f"You have no running session{named} to extend.")
        result = await session.extend(minutes)
        if not result.done:
            self.log.info("Extending the session of %s refused: %s", user.name, result.message)
            raise web.HTTPError(400, result.message)
        self.log.info("Session of %s extended: %s", user.name, result.message)
        self.finish(json.dumps({"message": result.message, "time_limit_s": result.time_limit_s}))
