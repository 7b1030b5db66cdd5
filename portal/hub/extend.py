"""dsportal's JupyterHub service: more walltime for the caller's own running session.

``POST /services/dsportal/extend`` with ``{"minutes": N, "server": NAME}`` (``server`` '' or left
out: the default session). A user may not raise her job's time limit in Slurm (only operators may);
this service, run by the hub as the hub's account (a Slurm operator), does it for her session, up to
her profile's max_walltime, and Slurm still applies the partition's and QoS's limits.

JupyterHub starts and stops it with the hub (a hub-managed service, ``JupyterHub.services``: the way
JupyterHub asks extensions to add HTTP endpoints since 3.1). The session's JupyterLab asks through its
server (portal.session.jobs_api) with the session's own token; a user may ask with a token of hers
from anywhere the service is reached. Who asks is the hub's word (HubAuth): a token that may open
the named session of its own user (``access:servers``), nobody else's. The session's job and profile
are the hub's record of that session (its spawner's state, read with the service's own role).

The sessions reach it where they reach the hub (hub_bind_url's host, at ``hub.service_port``), with
internal_ssl over TLS with the hub's own certificate, which they already trust; the proxy routes
``/services/dsportal/`` to it for everyone else (:func:`configure`). It stops when the hub that
started it is gone, even killed outright, so a restarted hub's service finds its port free.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import ssl
import sys
from pathlib import Path
from urllib.parse import quote, urlparse

from jupyterhub.services.auth import HubAuth
from jupyterhub.utils import make_ssl_context, url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.httpserver import HTTPServer
from traitlets.config import Config

from spawner.gpuspawner import SlurmGPUSpawner, extend_walltime

from .. import settings as settings_module
from ..rules import RequestError, extension_minutes
from ..settings import json_kind, shown

NAME = "dsportal"  # the service's name: /services/dsportal/
ROLE = "dsportal-service"
# What it reads of the hub: a user's sessions with their spawners' state (the Slurm job, the profile).
SCOPES = ["read:servers", "admin:server_state"]
MOST_BODY = 64 * 1024  # bytes of a request ({"minutes": N, "server": NAME} is far less); past it 413 in words
log = logging.getLogger("dsportal.extend")
TLS_BIND = "DSPORTAL_SERVICE_TLS_BIND"  # host:port of the sessions' TLS listener (internal_ssl)


def configure(c, settings) -> str:
    """JupyterHub.services and its role; the URL the sessions ask (sessionvars.SERVICE_URL).

    Without internal_ssl the service listens at hub_bind_url's host, ``service_port``, and JupyterHub
    and its proxy reach it there. With internal_ssl the sessions reach it there over TLS with the
    hub's certificate, and JupyterHub and its proxy at 127.0.0.1, ``service_port`` + 1, over http:
    JupyterHub 6.1 checks a managed service's https address at start with its server-side TLS context,
    which cannot connect, and stops (proposed upstream: docs/explanation/architecture.md)."""
    hub = settings.hub
    host, port = urlparse(hub.hub_bind_url).hostname or "127.0.0.1", hub.service_port
    environment = {"DSPORTAL_CONFIG": str(Path(settings.source).resolve())}
    url, sessions = hub.service_urls()
    if hub.internal_ssl:
        environment[TLS_BIND] = f"{host}:{port}"
    c.JupyterHub.services = [*c.JupyterHub.get("services", []), {
        "name": NAME, "url": url, "display": False, "environment": environment,
        "command": [sys.executable, "-m", "portal.hub.extend"],
    }]
    c.JupyterHub.load_roles = [*c.JupyterHub.get("load_roles", []),
                               {"name": ROLE, "services": [NAME], "scopes": SCOPES}]
    return f"{sessions}/services/{NAME}/"


def may_open(model: dict, server: str) -> bool:
    """Whether the token behind ``model`` (the hub's /api/user answer) may open its own user's
    session ``server``: the session's own token, or a token of hers with access to her servers."""
    name, scopes = model.get("name", ""), set(model.get("scopes", []))
    return bool(scopes & {"access:servers", f"access:servers!user={name}", f"access:servers!server={name}/{server}"})


def job_and_profile(server_model: dict) -> tuple[int | None, str]:
    """(Slurm job id, profile name) from a session's spawner state (PartitionSpawner's: wrapspawner's
    child_state holds batchspawner's job_id)."""
    state = server_model.get("state") or {}
    job = (state.get("child_state") or {}).get("job_id")
    try:
        return (int(job) if job else None), str(state.get("profile") or "")
    except (TypeError, ValueError):
        return None, str(state.get("profile") or "")


def make_app(settings):
    """The service's tornado application (its handler resolves the hub's word per request)."""
    hub_auth = HubAuth()
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", f"/services/{NAME}/")
    slurm = SlurmGPUSpawner.shared_client(_spawner_config(settings))

    class ExtendHandler(web.RequestHandler):
        def check_xsrf_cookie(self):  # tokens only: no cookie is read
            pass

        def write_error(self, status_code, **kwargs):
            error = kwargs.get("exc_info", (None, None))[1]
            message = getattr(error, "log_message", None) or self._reason
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"status": status_code, "message": message}))

        async def post(self):
            kind, _, token = self.request.headers.get("Authorization", "").partition(" ")
            if kind.lower() not in ("token", "bearer") or not token.strip():
                raise web.HTTPError(403, "Send your session's or your own API token (Authorization: token ...).")
            if len(self.request.body) > MOST_BODY:
                raise web.HTTPError(413, f"A request for more walltime is at most {MOST_BODY // 1024} KiB: "
                                    "{'minutes': N, 'server': NAME}.")
            try:
                body = json.loads(self.request.body or b"{}")
            except ValueError:
                raise web.HTTPError(400, "expected a JSON body such as {'minutes': 60}") from None
            try:
                minutes = extension_minutes(body)
            except RequestError as error:
                raise web.HTTPError(400, str(error)) from None
            server = body.get("server", "")
            if not isinstance(server, str):
                raise web.HTTPError(400, f"'server' is a session's name, not {json_kind(server)}")
            if len(server) > 255:
                raise web.HTTPError(400, f"'server' is a session's name of at most 255 characters, not {len(server)}")
            try:
                model = await hub_auth.user_for_token(token.strip(), use_cache=False, sync=False)  # revoked: out at once
            except web.HTTPError:
                raise web.HTTPError(503, "The hub is not answering right now, please retry.") from None
            named = f" named {shown(server)}" if server else ""
            if not model or model.get("kind", "user") != "user":
                raise web.HTTPError(403, "The hub does not know this token (it may have expired).")
            if not may_open(model, server):
                raise web.HTTPError(403, f"This token may not act on your session{named}.")
            user = model["name"]
            answer = await AsyncHTTPClient().fetch(HTTPRequest(
                url_path_join(hub_auth.api_url, "users", quote(user, safe="")), request_timeout=30,
                headers={"Authorization": f"token {hub_auth.api_token}"},
                ssl_options=make_ssl_context(hub_auth.keyfile, hub_auth.certfile, cafile=hub_auth.client_ca)
                if hub_auth.certfile and hub_auth.keyfile else None), raise_error=False)
            if answer.code != 200:
                raise web.HTTPError(503, "The hub is not answering right now, please retry.")
            session = (json.loads(answer.body).get("servers") or {}).get(server)
            job_id, profile_name = job_and_profile(session or {})
            if not session or not session.get("ready") or job_id is None:
                raise web.HTTPError(400, f"You have no running session{named} to extend.")
            try:
                profile = settings.profile(profile_name)
            except KeyError:
                raise web.HTTPError(400, f"Your session's profile {shown(profile_name)} is no longer offered; "
                                    "it keeps its walltime.") from None
            result = await extend_walltime(slurm, job_id, profile, minutes)
            if not result.done:
                log.info("Extending the session of %s refused: %s", user, result.message)
                raise web.HTTPError(400, result.message)
            log.info("Session of %s extended: %s", user, result.message)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"message": result.message, "time_limit_s": result.time_limit_s}))

    class AboutHandler(web.RequestHandler):
        def get(self):  # JupyterHub's checks that its services answer
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"service": NAME, "post": url_path_join(prefix, "extend")}))

    return web.Application([(prefix, AboutHandler), (url_path_join(prefix, "extend"), ExtendHandler)])


def _spawner_config(settings):
    """The hub's Slurm client settings (portal.hub.config's SlurmGPUSpawner section)."""
    c = Config()
    c.SlurmGPUSpawner.slurm_conf = str(settings.slurm.conf or "")
    c.SlurmGPUSpawner.slurm_bin_dir = str(settings.slurm.bin_dir)
    c.SlurmGPUSpawner.submit_as = settings.slurm.submit_as
    c.SlurmGPUSpawner.mediator = str(settings.slurm.mediator)
    c.SlurmGPUSpawner.squeue_interval = settings.slurm.squeue_interval
    return c


def _server_ssl(settings):
    """The hub's own internal certificate (the sessions trust its CA and check its name); its
    clients need one of the internal CAs', as at the hub's API. None without internal_ssl."""
    hub = settings.hub
    if not hub.internal_ssl:
        return None
    store = os.path.join(hub.data_dir, "internal-ssl")
    return make_ssl_context(os.path.join(store, "hub-internal", "hub-internal.key"),
                            os.path.join(store, "hub-internal", "hub-internal.crt"),
                            cafile=os.path.join(store, "hub-ca_trust.crt"), purpose=ssl.Purpose.CLIENT_AUTH)


async def _listen(server: HTTPServer, port: int, host: str) -> None:
    """Bind, waiting up to 10 s for the port: the service of a hub killed a moment ago may still hold it."""
    for attempt in range(20):
        try:
            server.listen(port, host)
            return
        except OSError as error:
            if error.errno != errno.EADDRINUSE or attempt == 19:
                raise
            await asyncio.sleep(0.5)


async def serve() -> None:
    logging.basicConfig(level=logging.INFO, format="[%(levelname).1s %(asctime)s dsportal-service] %(message)s")
    settings = settings_module.load()
    app = make_app(settings)
    hub = os.getppid()  # JupyterHub, which started this service and stops it as it stops
    servers = [HTTPServer(app, max_body_size=256 * MOST_BODY)]  # up to 16 MiB: 413 in words
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])  # JupyterHub's and its proxy's way in
    await _listen(servers[-1], url.port, url.hostname)
    log.info("more walltime for sessions at %s", url.geturl())
    if tls := os.environ.get(TLS_BIND):  # the sessions' way in, across the node network
        host, _, port = tls.rpartition(":")
        servers.append(HTTPServer(app, ssl_options=_server_ssl(settings), max_body_size=256 * MOST_BODY))
        await _listen(servers[-1], int(port), host)
        log.info("... and at https://%s (the hub's certificate)", tls)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    while not stopped.is_set():  # a hub killed outright stops nothing: its service goes with it
        if os.getppid() != hub:
            log.warning("the hub that started this service is gone: stopping")
            break
        try:
            await asyncio.wait_for(stopped.wait(), 1)
        except TimeoutError:
            pass
    for server in servers:
        server.stop()


if __name__ == "__main__":
    asyncio.run(serve())
