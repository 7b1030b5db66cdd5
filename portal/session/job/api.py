"""The session's job launcher API: launch, list, cancel and follow multi-node jobs.

REST (under the session's base URL, e.g. /user/alice/):
  GET    dsportal/api/jobs               my jobs, newest first, with their state
  POST   dsportal/api/jobs               submit {script|code, nodes, gpus_per_node, image, ...}, or a notebook to
                                         run headless: {notebook, parameters | grid, max_running, gpus_per_node, ...}
  GET    dsportal/api/jobs/<id>          one job
  GET    dsportal/api/jobs/<id>/results  a notebook job's runs: parameters, state, results (?format=csv)
  GET    dsportal/api/jobs/<id>/files/<output.ipynb | output-N.ipynb | input.ipynb>
                                         a notebook job's notebook, as a read-only model of the contents API
  DELETE dsportal/api/jobs/<id>          cancel it
  GET    dsportal/api/jobs/<id>/stream   websocket: the log so far, then each rank's new lines
                                         live, then {"type": "state", ...} once the job ended
  GET    dsportal/api/schedules          my notebook schedules (Slurm's scrontab), each with its runs' job ids
  POST   dsportal/api/schedules          {notebook, schedule: '0 2 * * *', parameters, gpus_per_node, ...}: the
                                         notebook run as a job at those times (schedules.py)
  PATCH  dsportal/api/schedules/<id>     {"paused": true | false}
  DELETE dsportal/api/schedules/<id>     the schedule ends; its past runs stay jobs
  GET    dsportal/api/policy             what this user may ask for (profiles, images, limits)
  GET    dsportal/api/slice              this session's slice: GPUs, CPUs, memory, walltime left
  POST   dsportal/api/extend             {"minutes": N}: more walltime, up to the profile's maximum (the hub
                                         changes the job's time limit; its message says what happened)

The session's server answers its owner only (JupyterHub's token/cookie check), so another
user's token is refused before any of this runs; jobs are the ones in the owner's own
~/.dsportal/jobs, submitted as the owner.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from tornado import web, websocket

from portal.core import sessionspec
from portal.core.userjson import extension_minutes
from portal.session import hubapi
from portal.session.api import MessageAPIHandler
from portal.slurm.slurmclient import SlurmError, SlurmMissing, SlurmUnavailable, refusal_hint
from portal.upstream.onuse import module_on_use

# The launcher's model (settings, Slurm, containers: 50 ms of imports) loads with its first request,
# not with every session's start.
jobs = module_on_use("portal.session.job.launcher")
schedules = module_on_use("portal.session.job.schedules")

POLL_SECONDS = 0.25  # how often rank files are read while a job runs
STATE_SECONDS = 1.0  # how often Slurm is asked for the job's state while streaming


def _policy() -> jobs.LaunchPolicy:
    return jobs.with_cluster_limits(sessionspec.launch_policy())


class _JobsAPI(MessageAPIHandler):

    def _fail(self, error: Exception):
        if isinstance(error, LookupError):  # a job or schedule that is not the user's
            raise web.HTTPError(404, str(error))
        if isinstance(error, SlurmUnavailable):
            raise web.HTTPError(503, f"The cluster scheduler is not answering right now, please retry: {error}")
        if isinstance(error, SlurmMissing):
            raise web.HTTPError(400, f"Your job request was refused: {error}")
        if isinstance(error, SlurmError):
            raise web.HTTPError(400, f"Slurm refused the job: {error}{refusal_hint(str(error))}")
        if isinstance(error, jobs.RequestError):
            raise web.HTTPError(400, f"Your job request was refused: {error}")
        raise error


class JobsHandler(_JobsAPI):
    @web.authenticated
    async def get(self):
        try:
            found = await asyncio.to_thread(jobs.list_jobs)
        except Exception as error:  # noqa: BLE001 - mapped to an HTTP error or re-raised
            self._fail(error)
        self.finish(json.dumps({"jobs": [j.as_dict() for j in found]}))

    @web.authenticated
    async def post(self):
        body = _body(self, "Your job request")
        try:
            policy = await asyncio.to_thread(_policy)
            plan = jobs.plan(body, policy, self.settings.get("server_root_dir") or os.path.expanduser("~"))
            info = await asyncio.to_thread(jobs.submit, plan, policy)
        except Exception as error:  # noqa: BLE001
            self._fail(error)
        self.log.info("dsportal: submitted job %s (%s)", info.job_id, info.description)
        self.set_status(201)
        self.finish(json.dumps({"job": info.as_dict()}))


# A request's JSON body: a job or schedule request is a few kB (a notebook is sent by path). Below this each
# field's own bound refuses it, naming the field; above it the body is not even parsed.
MAX_BODY = 8 << 20


def _body(handler, what: str = "Your request") -> dict:
    if len(handler.request.body or b"") > MAX_BODY:
        raise web.HTTPError(400, f"{what} was refused: its body is over {MAX_BODY // 2**20} MB")
    try:
        return json.loads(handler.request.body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise web.HTTPError(400, f"{what} was refused: the body is not JSON") from None
    except ValueError:  # Python reads no number of more than 4,300 digits
        raise web.HTTPError(400, f"{what} was refused: it holds a number of more than 4,300 digits") from None
    except RecursionError:
        raise web.HTTPError(400, f"{what} was refused: its JSON is nested too deep") from None


class SchedulesHandler(_JobsAPI):
    @web.authenticated
    async def get(self):
        try:
            found = await asyncio.to_thread(schedules.listed)
        except Exception as error:  # noqa: BLE001
            self._fail(error)
        self.finish(json.dumps({"schedules": found}))

    @web.authenticated
    async def post(self):
        body = _body(self)
        try:
            policy = await asyncio.to_thread(_policy)
            base = self.settings.get("server_root_dir") or os.path.expanduser("~")
            made = await asyncio.to_thread(schedules.create, body, policy, base)
        except Exception as error:  # noqa: BLE001
            self._fail(error)
        self.log.info("dsportal: schedule %s made (%s, %s)", made["id"], made["words"], made["description"])
        self.set_status(201)
        self.finish(json.dumps({"schedule": made}))


class ScheduleHandler(_JobsAPI):
    @web.authenticated
    async def patch(self, schedule_id):
        body = _body(self)
        paused = body.get("paused") if isinstance(body, dict) else None
        if not isinstance(paused, bool):
            raise web.HTTPError(400, 'Your request was refused: give {"paused": true} or {"paused": false}')
        try:
            changed = await asyncio.to_thread(schedules.set_paused, schedule_id, paused)
        except Exception as error:  # noqa: BLE001
            self._fail(error)
        self.finish(json.dumps({"schedule": changed}))

    @web.authenticated
    async def delete(self, schedule_id):
        try:
            gone = await asyncio.to_thread(schedules.delete, schedule_id)
        except Exception as error:  # noqa: BLE001
            self._fail(error)
        self.finish(json.dumps({"schedule": gone}))


class JobHandler(_JobsAPI):
    @web.authenticated
    async def get(self, job_id):
        try:
            info = await asyncio.to_thread(jobs.load, int(job_id))
        except Exception as error:  # noqa: BLE001
            self._fail(error)
        self.finish(json.dumps({"job": info.as_dict()}))

    @web.authenticated
    async def delete(self, job_id):
        try:
            info = await asyncio.to_thread(jobs.cancel, int(job_id))
        except Exception as error:  # noqa: BLE001
            self._fail(error)
        self.set_status(202)
        self.finish(json.dumps({"job": info.as_dict()}))


class ResultsHandler(_JobsAPI):
    @web.authenticated
    async def get(self, job_id):
        try:
            table = await asyncio.to_thread(jobs.results, int(job_id))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise web.HTTPError(409, f"The results of job {int(job_id)} cannot be read from its folder: "
                                f"{type(error).__name__}: {error}") from None
        except Exception as error:  # noqa: BLE001
            self._fail(error)
        if self.get_query_argument("format", "json") == "csv":
            self.set_header("Content-Disposition", f'attachment; filename="job-{int(job_id)}-results.csv"')
            # jupyter_server's APIHandler.finish sets its own Content-Type unless told this one
            self.finish(jobs.results_csv(table), set_content_type="text/csv; charset=utf-8")
            return
        self.finish(json.dumps(table))


class JobNotebookHandler(_JobsAPI):
    @web.authenticated
    async def get(self, job_id, name):
        try:
            model = await asyncio.to_thread(jobs.job_notebook, int(job_id), name)
        except Exception as error:  # noqa: BLE001
            self._fail(error)
        self.set_header("Cache-Control", "no-store")
        if self.get_query_argument("download", ""):  # File > Download: the notebook file itself
            self.set_header("Content-Disposition", f'attachment; filename="job-{int(job_id)}-{name}"')
            self.finish(json.dumps(model["content"], indent=1), set_content_type="application/x-ipynb+json")
            return
        self.finish(json.dumps(model))


class PolicyHandler(_JobsAPI):
    @web.authenticated
    async def get(self):
        try:
            policy = await asyncio.to_thread(_policy)
        except jobs.RequestError as error:
            self._fail(error)
        self.finish(policy.to_env())


class SliceHandler(_JobsAPI):
    @web.authenticated
    async def get(self):
        try:
            found = await asyncio.to_thread(jobs.held_slice)
        except Exception as error:  # noqa: BLE001
            self._fail(error)
        self.finish(json.dumps(found))


class ExtendHandler(MessageAPIHandler):
    @web.authenticated
    async def post(self):
        try:
            minutes = extension_minutes(self.get_json_body())
        except ValueError as error:
            raise web.HTTPError(400, str(error)) from None
        # Its own name: after a hub restart the hub no longer knows which session a token belongs to.
        server = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        if not hubapi.has_service():
            raise web.HTTPError(409, "This session was started by an older version of the portal, which cannot extend "
                                "it; save your work and start a new session for a longer walltime.")
        response = await hubapi.service_post("extend", {"minutes": minutes, "server": server})
        if response.code == 599:
            raise web.HTTPError(503, f"The hub is not answering right now, please retry: {hubapi.message_of(response)}")
        if response.code != 200:
            raise web.HTTPError(response.code, hubapi.message_of(response))
        self.finish(response.body)


class JobStreamHandler(JupyterHandler, websocket.WebSocketHandler):
    """Each message is JSON: {"type": "line", "rank", "stream", "line"} or, last,
    {"type": "state", "state", "exit_code", "reason"}. A new connection replays the log so far."""

    job_id: int
    _task: asyncio.Task | None = None

    @ws_authenticated
    async def get(self, job_id):
        try:
            self.job_id = int(job_id)
            await asyncio.to_thread(jobs.load, self.job_id)
        except jobs.JobNotFound as error:
            raise web.HTTPError(404, str(error)) from None
        await super().get(job_id)

    def check_origin(self, origin):
        return JupyterHandler.check_origin(self, origin)

    def open(self, job_id):
        self._task = asyncio.ensure_future(self._pump())

    def on_close(self):
        if self._task is not None:
            self._task.cancel()

    async def _send(self, message: dict) -> bool:
        try:
            await self.write_message(json.dumps(message))
            return True
        except websocket.WebSocketClosedError:
            return False

    async def _pump(self):
        info = await asyncio.to_thread(jobs.load, self.job_id)
        follower = jobs.LogFollower(folder=Path(info.folder))
        await self._send({"type": "job", "job": info.as_dict()})
        checked = 0.0
        try:
            while True:
                if time.monotonic() - checked >= STATE_SECONDS:
                    checked = time.monotonic()
                    try:
                        info = await asyncio.to_thread(jobs.load, self.job_id)
                    except SlurmUnavailable:
                        pass  # keep streaming; ask again next second
                ended = info.finished
                # in a thread, a slice at a time: a large grid's logs never hold up the server
                for event in await asyncio.to_thread(follower.poll, ended):
                    if not await self._send({"type": "line", **event}):
                        return
                if follower.behind:
                    continue  # more written than one slice: the rest at once
                if ended:
                    await self._send({"type": "state", "state": info.state, "exit_code": info.exit_code,
                                      "reason": info.reason})
                    self.close()
                    return
                await asyncio.sleep(POLL_SECONDS)
        except asyncio.CancelledError:
            return
