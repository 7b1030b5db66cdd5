"""dsportal's JupyterHub service: more walltime for a session, asked for by that session.

A user may not raise her job's time limit in Slurm (only operators may). This service, run by the
hub as the hub's account (a Slurm operator), does it for her running session, up to her profile's
max_walltime, and Slurm still applies the partition's and QoS's limits. JupyterLab asks its own
server (``POST /user/NAME[/SESSION]/dsportal/api/extend``, portal.session.job.api), which asks
here, ``POST /services/dsportal/extend`` ``{"minutes": N, "server": SESSION}``, with the session's
own token.

It is a JupyterHub service, as JupyterHub asks for endpoints of one's own since 3.1 (it deprecated
``JupyterHub.extra_handlers``): the hub starts it and stops it (a hub-managed service), gives it a
token with its role (``read:servers``, ``admin:server_state``: users' sessions and their spawners'
state; ``list:users`` and ``start:servers``, to start again the sessions a hub restart cut short:
portal.hub.resume, run here as the hub comes back), and it stops by itself when the hub that started it is gone, even killed outright.

- **Who asks** is the hub's word, asked per request (uncached: a revoked token is out at once), over
  TLS that trusts the hub's CA only: a token that may open that session of its own user
  (``access:servers``), nobody else's. The job and the profile are the hub's record of that session.
- **Where.** The sessions reach it where they reach the hub (hub_bind_url's host, at
  ``hub.service_port``); with internal_ssl over TLS with the hub's own certificate, which they
  already check, so a process of someone else's that took the port while the service was down gets
  no token. It has no route on the proxy: a user's scripts ask their session's API, as JupyterLab
  does (JupyterHub 6.1 would also check an https service at start with its server-side TLS context,
  which cannot connect, and stop; see docs/explanation/architecture.md).
- **Load.** A request is at most 64 KiB and 10 s in coming; one at a time per user, a few at once.
  At most MOST_CONNECTIONS connections are open at once, each for at most 10 s without a request;
  past that the oldest is closed as a new one comes. So whoever opens connections by the thousand
  never runs the service out of file descriptors (where tornado would retry its failing accept on
  every turn of the loop), nor shuts the sessions out: a session's request, sent as it connects,
  is long done before MOST_CONNECTIONS others have come after it.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import logging
import os
import re
import signal
import ssl
import sys
from pathlib import Path
from typing import NoReturn
from urllib.parse import quote, urlparse

from jupyterhub.services.auth import HubAuth
from jupyterhub.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest, HTTPResponse
from tornado.httpserver import HTTPServer

from portal.core import settings as settings_module
from portal.core.settings import shown
from portal.core.userjson import extension_minutes, json_kind
from portal.hub import resume
from portal.slurm.slurmclient import shared_client
from spawner.gpuspawner import extend_walltime

NAME = "dsportal"  # the service's name: /services/dsportal/
PREFIX = f"/services/{NAME}/"
ROLE = "dsportal-service"
# What it reads of the hub: a user's sessions with their spawners' state (the Slurm job, the profile);
# and, to start again the sessions a hub restart cut short (portal.hub.resume), users listed and sessions started.
SCOPES = ["read:servers", "admin:server_state", "list:users", "start:servers"]
MOST_BODY = 64 * 1024  # bytes of a request ({"minutes": N, "server": NAME} is far less)
AT_ONCE = 4  # requests being worked on at once (each asks the hub twice and Slurm up to four times)
MOST_CONNECTIONS = 256  # open at once (sessions ask rarely, AT_ONCE at a time); far below its file descriptors
IDLE = 10  # seconds a connection may stay open without a whole request (its TLS handshake included)
BIND = "DSPORTAL_SERVICE_BIND"  # scheme://host:port it listens at
HUB_PID = "DSPORTAL_HUB_PID"  # the hub that started it: gone, the service stops
log = logging.getLogger("dsportal.extend")


def configure(c, settings) -> str:
    """JupyterHub.services and its role; the URL the sessions ask (portal.core.sessionspec's service_url)."""
    hub = settings.hub
    bind, sessions = hub.service_urls()
    c.JupyterHub.services = [*c.JupyterHub.get("services", []), {
        "name": NAME, "display": False, "command": [sys.executable, "-m", "portal.hub.extend"],
        "environment": {settings_module.CONFIG_ENV: str(Path(settings.source).resolve()), BIND: bind,
                        HUB_PID: str(os.getpid())},
    }]
    c.JupyterHub.load_roles = [*c.JupyterHub.get("load_roles", []),
                               {"name": ROLE, "services": [NAME], "scopes": SCOPES}]
    return f"{sessions}{PREFIX}"


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


class Hub:
    """The service's calls to the hub's API, over TLS trusting the hub's internal CA only (as a
    session's, portal.upstream.session.hub_tls_context: JupyterHub's own contexts add the system's
    CAs, and the service sends a token that reads every session's state)."""

    def __init__(self):
        self.auth = HubAuth()  # the hub's address and the service's token and certificate, from JupyterHub
        self.ssl = None
        if self.auth.certfile and self.auth.keyfile and self.auth.client_ca:
            self.ssl = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.auth.client_ca)
            self.ssl.load_cert_chain(self.auth.certfile, self.auth.keyfile)

    async def get(self, path: str, token: str) -> HTTPResponse:
        """GET the hub's API at ``path`` with ``token``; 599 where the hub did not answer."""
        return await self.call("GET", path, token=token)

    async def call(self, method: str, path: str, body=None, token: str = "") -> HTTPResponse:
        """``method`` at the hub's API ``path`` (with a JSON ``body``), with ``token`` or the service's
        own; 599 where the hub did not answer."""
        request = HTTPRequest(url_path_join(self.auth.api_url, path), method=method,
                              headers={"Authorization": f"token {token or self.auth.api_token}"},
                              body=None if body is None and method == "GET" else json.dumps(body),
                              ssl_options=self.ssl, request_timeout=30)
        try:
            return await AsyncHTTPClient().fetch(request, raise_error=False)
        except Exception as error:  # noqa: BLE001 - refused, reset, timed out, TLS: the hub did not answer
            return HTTPResponse(request, 599, error=error)


def _refuse(code: int, message: str) -> NoReturn:
    raise web.HTTPError(code, message)


class ExtendHandler(web.RequestHandler):
    def initialize(self, hub: Hub, slurm, settings, busy: asyncio.Semaphore, users: dict):
        self.hub, self.slurm, self.portal, self.busy, self.users = hub, slurm, settings, busy, users

    def check_xsrf_cookie(self):  # tokens only: no cookie is read
        pass

    def write_error(self, status_code, **kwargs):
        error = kwargs.get("exc_info", (None, None))[1]
        message = getattr(error, "log_message", None) if isinstance(error, web.HTTPError) else None
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": message or self._reason}))

    async def post(self):
        kind, _, token = self.request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if kind.lower() not in ("token", "bearer") or not re.fullmatch(r"[!-~]{1,1024}", token):
            _refuse(403, "Send your session's API token (Authorization: token ...).")
        try:
            body = json.loads(self.request.body or b"{}")
        except (ValueError, RecursionError):
            _refuse(400, "expected a JSON body such as {'minutes': 60}")
        try:
            minutes = extension_minutes(body)
        except ValueError as error:
            _refuse(400, str(error))
        server = body.get("server", "")
        if not isinstance(server, str):
            _refuse(400, f"'server' is a session's name, not {json_kind(server)}")
        if len(server) > 255:
            _refuse(400, f"'server' is a session's name of at most 255 characters, not {len(server)}")
        async with self.busy:
            who = await self.hub.get("user", token)  # the hub's word, uncached: a revoked token is out
        if who.code == 599 or who.code >= 500:
            _refuse(503, "The hub is not answering right now, please retry.")
        model = json.loads(who.body) if who.code == 200 else None
        if not model or model.get("kind", "user") != "user":
            _refuse(403, "The hub does not know this token (it may have expired).")
        named = f" named {shown(server)}" if server else ""
        if not may_open(model, server):
            _refuse(403, f"This token may not act on your session{named}.")
        user = model["name"]
        lock = self.users.setdefault(user, asyncio.Lock())
        if lock.locked():  # two clicks do not both add their minutes, nor hold every turn
            _refuse(429, "Your session is being extended already; look at its walltime in a moment.")
        async with lock, self.busy:
            answer = await self._extend(user, server, named, minutes)
        self.set_header("Content-Type", "application/json")
        self.finish(answer)

    async def _extend(self, user: str, server: str, named: str, minutes: int) -> str:
        answer = await self.hub.get(f"users/{quote(user, safe='')}", self.hub.auth.api_token)
        if answer.code == 599 or answer.code >= 500:
            _refuse(503, "The hub is not answering right now, please retry.")
        sessions = (json.loads(answer.body).get("servers") or {}) if answer.code == 200 else {}
        session = sessions.get(server) or {}
        job_id, profile_name = job_and_profile(session)
        if not session.get("ready") or job_id is None or not profile_name:
            _refuse(400, f"You have no running session{named} to extend.")
        try:
            profile = self.portal.profile(profile_name)
        except KeyError:
            _refuse(400, f"Your session's profile {shown(profile_name)} is no longer offered; it keeps its walltime.")
        result = await extend_walltime(self.slurm, job_id, profile, minutes, user=user)
        if not result.done:
            log.info("Extending the session of %s refused: %s", user, result.message)
            _refuse(400, result.message)
        log.info("Session of %s extended: %s", user, result.message)
        return json.dumps({"message": result.message, "time_limit_s": result.time_limit_s})


def _slurm(settings):
    """The service's Slurm client, set as the hub's (config.py): one per process, its squeue shared."""
    return shared_client(settings.slurm.conf, str(settings.slurm.bin_dir), settings.slurm.submit_as,
                         settings.slurm.squeue_interval, str(settings.slurm.mediator))


def make_app(settings) -> web.Application:
    shared = {"hub": Hub(), "slurm": _slurm(settings), "settings": settings, "busy": asyncio.Semaphore(AT_ONCE),
              "users": {}}
    return web.Application([(url_path_join(PREFIX, "extend"), ExtendHandler, shared)])


def _server_ssl(settings) -> ssl.SSLContext:
    """The hub's own internal certificate (the sessions trust its CA and check its name). Clients show
    a certificate of one of the internal CAs, as at the hub's API (a session's does); the token is
    what names the user."""
    store = Path(settings.hub.data_dir) / "internal-ssl"
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(store / "hub-ca_trust.crt"))
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_cert_chain(str(store / "hub-internal" / "hub-internal.crt"), str(store / "hub-internal" / "hub-internal.key"))
    return context


class BoundedServer(HTTPServer):
    """tornado's HTTP server with at most ``most`` connections open: a new one past that closes the
    oldest (said in the log at most once a minute). Connections that ended are let go on each new one."""

    def initialize(self, *args, most: int = MOST_CONNECTIONS, **kwargs) -> None:
        super().initialize(*args, **kwargs)
        self.most, self.streams, self.said_full = most, {}, -60.0  # streams: open ones, oldest first

    def handle_stream(self, stream, address) -> None:
        self.streams = {open_: None for open_ in self.streams if not open_.closed()}
        if len(self.streams) >= self.most:
            oldest = next(iter(self.streams))
            del self.streams[oldest]
            oldest.close()
            now = asyncio.get_running_loop().time()
            if now - self.said_full >= 60:
                self.said_full = now
                log.warning("%d connections open, the most it keeps: each new one closes the oldest", self.most)
        self.streams[stream] = None
        super().handle_stream(stream, address)


async def _listen(server: HTTPServer, port: int, host: str, hub_pid: int) -> bool:
    """Bind, waiting as long as the port is taken: by the service of a hub killed a moment ago, or by
    someone else's process (who gets no token: the sessions check the hub's certificate). Said every 10 s.
    False where the hub is gone meanwhile."""
    for attempt in itertools.count():
        if _hub_gone(hub_pid):
            return False
        try:
            server.listen(port, host)
            return True
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            if attempt % 20 == 0:
                log.warning("%s:%s is taken; sessions cannot extend their walltime until it is free", host, port)
            await asyncio.sleep(0.5)


def _hub_gone(hub_pid: int) -> bool:
    return os.getppid() != hub_pid


async def serve() -> None:
    logging.basicConfig(level=logging.INFO, format="[%(levelname).1s %(asctime)s dsportal-service] %(message)s")
    hub_pid = int(os.environ.get(HUB_PID) or os.getppid())
    if _hub_gone(hub_pid):
        log.warning("the hub that started this service is gone: stopping")
        return
    settings = settings_module.load()
    url = urlparse(os.environ.get(BIND) or settings.hub.service_urls()[0])
    server = BoundedServer(make_app(settings), ssl_options=_server_ssl(settings) if url.scheme == "https" else None,
                           max_body_size=MOST_BODY, body_timeout=10, idle_connection_timeout=IDLE)
    if not await _listen(server, url.port, url.hostname, hub_pid):
        log.warning("the hub that started this service is gone: stopping")
        return
    log.info("more walltime for sessions at %s%s", url.geturl(), PREFIX)
    resuming = asyncio.ensure_future(_resume(Hub(), _slurm(settings), settings))  # noqa: F841 - held until it stops
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    while not stopped.is_set():  # a hub killed outright stops nothing: its service goes with it
        if _hub_gone(hub_pid):
            log.warning("the hub that started this service is gone: stopping")
            break
        try:
            await asyncio.wait_for(stopped.wait(), 1)
        except TimeoutError:
            pass
    server.stop()


async def _resume(hub, slurm, settings) -> None:
    """Sessions a hub restart cut short, started again; then, where a profile preempts by requeueing, those
    whose job Slurm requeued, as they are found (portal.hub.resume)."""
    await resume.resume_kept(hub)
    if any(profile.preemption == "requeue" for profile in settings.profiles):
        await resume.keep_resuming(hub, slurm)


if __name__ == "__main__":
    asyncio.run(serve())
