"""POST /hub/api/dsportal/extend: more walltime for the caller's own running session.

A user may not raise her job's time limit in Slurm (only operators may); the hub, a Slurm operator,
does it for her session, up to her profile's max_walltime, and Slurm still applies the partition's
and QoS's limits. The session's JupyterLab asks through its server (portal.session.jobs_api).
"""

from __future__ import annotations

import json

from jupyterhub.apihandlers import APIHandler
from tornado import web

from ..settings import json_kind

MOST_MINUTES = 24 * 60  # one request; the profile's max_walltime caps the total


class ExtendHandler(APIHandler):
    @web.authenticated
    async def post(self):
        user = self.current_user
        body = self.get_json_body()
        minutes = body.get("minutes") if isinstance(body, dict) else None
        if not isinstance(minutes, int) or isinstance(minutes, bool) or not 1 <= minutes <= MOST_MINUTES:
            raise web.HTTPError(400, f"expected {{'minutes': <1-{MOST_MINUTES}>}}, not {json_kind(body)}")
        spawner = getattr(user, "spawners", {}).get("")
        session = getattr(spawner, "child_spawner", None)
        if spawner is None or not spawner.active or session is None:
            raise web.HTTPError(400, "You have no running session to extend.")
        result = await session.extend(minutes)
        if not result.done:
            self.log.info("Extending the session of %s refused: %s", user.name, result.message)
            raise web.HTTPError(400, result.message)
        self.log.info("Session of %s extended: %s", user.name, result.message)
        self.finish(json.dumps({"message": result.message, "time_limit_s": result.time_limit_s}))
