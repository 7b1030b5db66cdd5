"""POST /hub/api/batchspawner: where a session job reports its port, in place of batchspawner's handler."""

from __future__ import annotations

import json

from jupyterhub.apihandlers import APIHandler
from jupyterhub.utils import utcnow
from tornado import web

from portal.core.userjson import json_kind
from portal.hub import metrics
from portal.slurm.slurmparse import SlurmError
from portal.upstream import hub as upstream


class SessionPortHandler(APIHandler):
    """POST /hub/api/batchspawner from a session job: its port, once.

    Replaces batchspawner's handler, which sets *any* attribute the job sends on the spawner
    (a user holding the session token could rewrite the spawner's commands) and takes any number
    of reports: any process of the user can read the session's token, so a later post could move
    the route to another port. Here the spawner accepts one port, while it waits for it, from the
    job it started (its Slurm job id); everything else is refused with 409 and logged.
    """

    @web.authenticated
    async def post(self):
        user = self.current_user
        token = self.get_auth_token()
        spawners = list(getattr(user, "spawners", {}).values())
        spawner = next((s for s in spawners if s.api_token == token), None)
        body = self.get_json_body()
        port, job_id = (body.get("port"), body.get("job_id", "")) if isinstance(body, dict) else (None, None)
        if (not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535
                or not isinstance(job_id, (str, int)) or isinstance(job_id, bool)):
            raise web.HTTPError(400, "expected {'port': <1-65535>, 'job_id': <the session's Slurm job id>}, not "
                                f"{json_kind(body)}" + (f" with port {json_kind(port)} and job_id {json_kind(job_id)}"
                                                       if isinstance(body, dict) else ""))
        taking_over = None
        if spawner is None:
            spawner = taking_over = self.resumed_start(user, spawners, str(job_id))
        if spawner is None and not any(s.active for s in spawners):
            raise web.HTTPError(403, "this token belongs to no session of yours")
        if spawner is None:
            # A running session whose spawner was rebuilt by a hub restart: it is not starting.
            refusal = "the session is running, not starting: port reports are accepted once"
        else:
            session = getattr(spawner, "child_spawner", None) or spawner
            accept = getattr(session, "accept_port", None)
            try:
                refusal = await accept(port, str(job_id)) if accept else "not a dsportal session"
            except SlurmError as error:  # the session asks again on a 503 (portal/session/portreport.py)
                self.log.warning("Port report %s of %s not judged yet: Slurm did not answer (%s)", port, user.name, error)
                raise web.HTTPError(503, "Slurm did not answer the hub about this job just now; ask again") from None
        if taking_over is not None and not refusal:
            # The job's own token, the one it was submitted with, is the session's again: JupyterHub drops
            # the start's new one once start() returns (Spawner.api_token re-use, jupyterhub/user.py).
            taking_over.api_token = token
            taking_over.child_spawner.token_adopted = True
        if refusal:
            self.log.warning("Refused port report %s from %s for %s: %s", port, self.request.remote_ip,
                             user.name, refusal)
            metrics.PORT_REPORTS_REFUSED.inc()
            raise web.HTTPError(409, refusal)
        self.log.info("Session of %s reported port %s (from %s)", user.name, port, self.request.remote_ip)
        self.record_first_activity(user, spawner)
        self.set_status(201)
        self.finish(json.dumps({"message": "port registered"}))

    def resumed_start(self, user, spawners, job_id: str):
        """The spawner whose start takes over job ``job_id`` (a start a hub restart cut short, started again
        by portal.hub.resume), when this report comes with the token that job was submitted with (its id,
        kept in the state; for a job submitted before ids were kept, a token of that session's, by the
        note JupyterHub gives them). Raises 503, for the job to ask again, while that start has not begun
        (the session is recorded with the job kept, in the hub's database: a stopped session's spawner may
        not be loaded). None: no such start."""
        if not job_id.isdigit():
            return None
        orm_token = self.get_token()
        for spawner in spawners:
            child = getattr(spawner, "child_spawner", None)
            if child is None or str(child.job_id) != job_id or not child.starting or child.taken_over_token < 0:
                continue
            if orm_token is None or orm_token.user is None or orm_token.user.name != user.name:
                return None
            if child.taken_over_token:
                return spawner if orm_token.id == child.taken_over_token else None
            server = spawner.orm_spawner.server if spawner.orm_spawner is not None else None
            return spawner if server is not None and orm_token.note == f"Server at {server.base_url}" else None
        for orm_spawner in user.orm_user.orm_spawners.values():
            if str(((orm_spawner.state or {}).get("kept_job") or {}).get("job_id", "")) == job_id:
                raise web.HTTPError(503, f"the hub is starting this session again (job {job_id}); ask again")
        return None

    def record_first_activity(self, user, spawner) -> None:
        """The session's server listens: its first activity. The idle clock
        (PartitionSpawner.idle_seconds) counts from here, not from the spawn request, which is what
        JupyterHub recorded before the job waited in Slurm's queue."""
        now = utcnow(with_tz=False)  # naive UTC, as JupyterHub's activity API stores it
        for record in (user, spawner.orm_spawner):
            if record.last_activity is None or record.last_activity < now:
                record.last_activity = now
        self.db.commit()


def install_port_handler() -> None:
    upstream.replace_api_handler(r"/api/batchspawner", SessionPortHandler)
