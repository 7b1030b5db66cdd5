"""The hub's patches of upstream internals (JupyterHub, batchspawner, ldapauthenticator, tornado,
ssl, configurable-http-proxy), in one place, with what each rests on.

Each function here replaces, wraps or reads something upstream keeps private; the hub's modules
call them (config.py, routeowner.py, origins.py, portreport.py, auth.py) and keep the portal's
policy, messages and logs. :data:`PATCHES` is the upgrade checklist: for each patch, the upstream
version it was written against, fingerprints of the upstream code it rests on, whether it guards
users (the hub does not start while such a patch is unchecked: config.configure) and the public hook
upstream would need to offer for it to go. tests/test_upstream.py fails, naming the patch, when the
installed upstream no longer matches.
The session's patches are in portal/upstream/session.py.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import ssl

import batchspawner.api  # noqa: F401  (registers its own port handler on import; replace_api_handler takes its place)
import jupyterhub.user
import ldap3
from jupyterhub.apihandlers import default_handlers
from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.app import JupyterHub
from ldap3.core.exceptions import LDAPStartTLSError
from ldapauthenticator import LDAPAuthenticator
from ldapauthenticator.ldapauthenticator import TlsStrategy

from portal.core import ldapconnect
from portal.upstream.patchcheck import CHP, Definition, Mentions, Patch

# ------------------------------------------------------------------ session certificate pinning
# The certificate the session being checked must present (DER): set around User._wait_up.
_EXPECTED_CERTIFICATE: contextvars.ContextVar[bytes | None] = contextvars.ContextVar(
    "dsportal_expected_session_certificate", default=None)


class _PinnedSessionSSLObject(ssl.SSLObject):
    """asyncio's TLS to a session the hub checks: after the usual checks (the CA, the node's
    name), the certificate must be the one in :data:`_EXPECTED_CERTIFICATE` when the connection
    was made; else the handshake fails and no request is written."""

    @classmethod
    def _create(cls, *args, **kwargs):
        sslobj = super()._create(*args, **kwargs)
        sslobj.expected_certificate = _EXPECTED_CERTIFICATE.get()
        return sslobj

    def do_handshake(self):
        super().do_handshake()
        if self.expected_certificate is None or self.getpeercert(binary_form=True) != self.expected_certificate:
            raise ssl.SSLCertVerificationError(
                "the session's certificate is not the one the hub issued to its user: another "
                "user's server on the session's address (dsportal: a route reaches its own user only)")


def _pinning(make_ssl_context):
    def pinned(*args, **kwargs):
        context = make_ssl_context(*args, **kwargs)
        if context is not None:
            context.sslobject_class = _PinnedSessionSSLObject
        return context

    pinned.original = make_ssl_context
    pinned.pins_session_certificates = True
    return pinned


def _pinned_wait_up(wait_up, issued_certificate):
    async def wait_up_pinned(self, spawner):
        expected = await issued_certificate(spawner.internal_certs_location, self.name, spawner.name)
        token = _EXPECTED_CERTIFICATE.set(expected or b"")  # none issued: nothing is accepted
        try:
            return await wait_up(self, spawner)
        finally:
            _EXPECTED_CERTIFICATE.reset(token)

    wait_up_pinned.pins_session_certificates = True
    return wait_up_pinned


def pin_session_certificates(issued_certificate) -> None:
    """The hub's checks of a session (``User._wait_up``; ``jupyterhub.user.make_ssl_context`` is used
    for nothing else) accept only the certificate ``await issued_certificate(internal_certs_location,
    user name, server name)`` returns (DER; None: none is accepted). Idempotent."""
    if not getattr(jupyterhub.user.make_ssl_context, "pins_session_certificates", False):
        jupyterhub.user.make_ssl_context = _pinning(jupyterhub.user.make_ssl_context)
    if not getattr(jupyterhub.user.User._wait_up, "pins_session_certificates", False):
        jupyterhub.user.User._wait_up = _pinned_wait_up(jupyterhub.user.User._wait_up, issued_certificate)


# ------------------------------------------------------------------ JupyterHub's tornado application
_AFTER_INIT = []  # what after_init_tornado_application was given, in order


def after_init_tornado_application(extend) -> None:
    """``extend(hub)`` runs right after ``JupyterHub.init_tornado_application`` (wrapped once), after
    those given before it."""
    if extend not in _AFTER_INIT:
        _AFTER_INIT.append(extend)
    if hasattr(JupyterHub.init_tornado_application, "original"):
        return
    init_tornado_application = JupyterHub.init_tornado_application

    def init(hub: JupyterHub):
        init_tornado_application(hub)
        for extension in list(_AFTER_INIT):
            extension(hub)

    init.original = init_tornado_application
    JupyterHub.init_tornado_application = init


async def check_proxy_routes(hub: JupyterHub) -> None:
    """JupyterHub's own check of the proxy's routes (Proxy.check_routes), with the services as the hub
    keeps them (JupyterHub._service_map: PATCHES proxy-restart-routes), as JupyterHub runs it at its start."""
    await hub.proxy.check_routes(hub.users, hub._service_map)


def replace_api_handler(pattern: str, handler) -> None:
    """The hub's API route ``pattern`` (batchspawner's /api/batchspawner, registered when
    batchspawner.api is imported) served by ``handler`` instead."""
    default_handlers[:] = [h for h in default_handlers if h[0] != pattern]
    default_handlers.append((pattern, handler))


# ------------------------------------------------------------------ the REST API's requests for a user's server
def judge_server_requests(judge) -> None:
    """``judge(handler, user_name, options)`` runs on the ``user_options`` of each REST API request for one
    of a user's servers (UserServerAPIHandler: POST starts it, PUT makes it, PATCH edits it) as the handler
    reads its body: after the request's scopes were checked and its user found, before anything of it is
    stored. It refuses the request by raising (an HTTPError: its status and message). Idempotent."""
    if getattr(UserServerAPIHandler.get_server_json_body, "judges_user_options", False):
        return
    read_server_body = UserServerAPIHandler.get_server_json_body

    def server_body(self):  # POST and PUT: {"user_options": ...} or the options alone
        body = read_server_body(self)
        if body.get("user_options") is not None:  # None: a start reuses the stored ones (start() judges them)
            judge(self, self.path_args[0], body["user_options"])
        return body

    def body(self):  # PATCH (DELETE reads its body here too)
        found = APIHandler.get_json_body(self)
        if self.request.method == "PATCH" and isinstance(found, dict) and isinstance(found.get("user_options"), dict):
            judge(self, self.path_args[0], found["user_options"])
        return found

    server_body.judges_user_options = body.judges_user_options = True
    UserServerAPIHandler.get_server_json_body = server_body
    UserServerAPIHandler.get_json_body = body


def _judges_server_requests() -> bool:
    return all(getattr(vars(UserServerAPIHandler).get(name), "judges_user_options", False)
               for name in ("get_server_json_body", "get_json_body"))


# ------------------------------------------------------------------ ldapauthenticator
def ldap_connection(authenticator, userdn, password, connect_timeout: float, receive_timeout: int,
                    servers: list[tuple[str, int]] | None = None):
    """ldapauthenticator's ``get_connection`` (2.0.2: a bound connection, or None where the bind is refused),
    with connect and receive timeouts, its server (or ``servers``, tried in order: ldapconnect.new_servers)
    as ldapconnect makes them (none of their schema read). Opened, StartTLS'd and bound step by step, as
    ldap3's auto_bind does, so that a refused bind's reason (Active Directory says why) reaches the log."""
    use_ssl = authenticator.tls_strategy == TlsStrategy.on_connect
    server = ldapconnect.new_servers(servers or [(authenticator.server_address, authenticator.server_port)], use_ssl,
                                     authenticator.tls_kwargs, connect_timeout)
    connection = ldap3.Connection(server, user=userdn, password=password, receive_timeout=receive_timeout,
                                  auto_referrals=False)  # no bind elsewhere with her password (ldapconnect)
    connection.open(read_server_info=False)  # raises where no server answers, or its certificate is refused
    if authenticator.tls_strategy == TlsStrategy.before_bind and not connection.start_tls(read_server_info=False):
        connection.unbind()
        raise LDAPStartTLSError(f"StartTLS refused: {connection.result}")
    if connection.bind(read_server_info=False):
        return connection
    # The user sees "Invalid username or password" whatever the reason; the admin reads it here.
    reason = ad_bind_reason(str((connection.result or {}).get("message", "")))
    authenticator.log.info("LDAP refused the bind of %s%s", userdn, f": {reason}" if reason else "")
    connection.unbind()
    return None


# Active Directory's reasons for a refused bind (the "data NNN" of its diagnostic message; Samba's too).
AD_BIND_REASONS = {"525": "no such user", "52e": "wrong password", "530": "not allowed to log in at this time",
                   "531": "not allowed to log in from this workstation", "532": "password expired",
                   "533": "account disabled", "701": "account expired", "773": "password must be changed",
                   "775": "account locked out"}


def ad_bind_reason(message: str) -> str:
    """Active Directory's reason for a refused bind, in words (``data 533`` -> account disabled), else ''."""
    found = re.search(r"\bdata ([0-9a-f]{3})\b", message or "")
    return f"{AD_BIND_REASONS.get(found.group(1), 'refused')} (AD data {found.group(1)})" if found else ""


def ldap_login(authenticator, data):
    """LDAPAuthenticator's own ``authenticate``, run to the end on this (worker) thread: its coroutine
    never awaits and does not use the request's handler."""
    return asyncio.run(LDAPAuthenticator.authenticate(authenticator, None, data))


# ------------------------------------------------------------------ tornado's connection of a request
def connection_address(request):
    """The address of the connection ``request`` came on (tornado's request context), or None."""
    return getattr(getattr(request.connection, "context", None), "address", None)


def answer_503_when_the_database_fails(words: str, counted) -> None:
    """JupyterHub's handlers answer 503 ``words`` (``counted()`` each time) where the database fails the look-up of
    the request's user, instead of going on as if nobody were logged in (PATCHES database-down-503)."""
    from jupyterhub.handlers.base import BaseHandler
    from sqlalchemy.exc import DBAPIError
    from tornado import web

    if _database_down_applied():
        return
    get_current_user, prepare = BaseHandler.get_current_user, BaseHandler.prepare

    async def get_current_user_or_remember(self):
        try:
            return await get_current_user(self)
        except DBAPIError as error:  # the database did not answer: not "nobody is logged in"
            self._dsportal_database_error = error
            raise

    async def prepare_or_503(self):
        try:
            await prepare(self)  # JupyterHub's: it logs the error and rolls its session back
        except web.HTTPError:  # e.g. the XSRF check of a user it could not look up
            if getattr(self, "_dsportal_database_error", None) is None:
                raise
        if getattr(self, "_dsportal_database_error", None) is not None:
            counted()
            raise web.HTTPError(503, words)

    get_current_user_or_remember.original = get_current_user
    prepare_or_503.original = prepare
    prepare_or_503.dsportal_database_down = True
    BaseHandler.get_current_user = get_current_user_or_remember
    BaseHandler.prepare = prepare_or_503


def _database_down_applied() -> bool:
    from jupyterhub.handlers.base import BaseHandler

    return getattr(BaseHandler.prepare, "dsportal_database_down", False)


# ------------------------------------------------------------------ the checklist
def _pins_session_certificates() -> bool:
    return getattr(jupyterhub.user.make_ssl_context, "pins_session_certificates", False)


JUPYTERHUB, LDAP, TORNADO = "jupyterhub", "jupyterhub-ldapauthenticator", "tornado"
PINNING = ("JupyterHub checking a session's certificate against the one issued to its user (a spawner's TLS "
           "context for the checks of its server)")
PATCHES = [
    Patch("session-certificate-context", "portal/hub/routeowner.py",
          "jupyterhub.user.make_ssl_context (wrapped: its contexts' sslobject_class)", JUPYTERHUB, "6.1.1",
          "the hub's checks of a session accept only the certificate issued to the session's user",
          (Definition("jupyterhub.utils", "make_ssl_context", "b4476da2f6254157"),
           Mentions("jupyterhub.user", "make_ssl_context", "d76d54aeedbaa44a")),
          _pins_session_certificates, guards=True, hook=PINNING),
    Patch("session-certificate-wait-up", "portal/hub/routeowner.py", "jupyterhub.user.User._wait_up (wrapped)",
          JUPYTERHUB, "6.1.1", "sets the certificate expected of the session being checked, around the check",
          (Definition("jupyterhub.user", "User._wait_up", "891931869bfd0f23"),
           Mentions("jupyterhub.user", "_wait_up", "807309172012753b")),
          lambda: getattr(jupyterhub.user.User._wait_up, "pins_session_certificates", False),
          guards=True, hook=PINNING),
    Patch("session-certificate-sslobject", "portal/hub/routeowner.py",
          "ssl.SSLObject._create (private classmethod, overridden) and do_handshake", "python", "3.11.2",
          "fails the handshake with a session whose certificate is not the expected one, before a request",
          # also: Debian's python3.11 3.11.2-6+deb12u9 (bookworm's security update; deb12u6 is the first), whose
          # _create first refuses a server_hostname or session on the server side and warns when check_hostname
          # comes without a server_hostname: the override still gets the object the original makes, and the hub's
          # checks of a session always name its host. Found by the deploy trial of 2026-12-06 on fresh systems.
          (Definition("ssl", "SSLObject._create", "419b38a162d353a9", also=("c08595365a54d213",)),
           Definition("ssl", "SSLObject.do_handshake", "a91ffb8fde2bcfbf"),
           Definition("ssl", "SSLContext.wrap_bio", "518c85ca731f0b14"),
           Mentions("asyncio.sslproto", "wrap_bio", "fb462d8e3fd88860")),
          _pins_session_certificates, guards=True, hook=PINNING),
    Patch("hub-pages-on-hub-host", "portal/hub/origins.py",
          "jupyterhub.app.JupyterHub.init_tornado_application (wrapped; a rule put first in its wildcard_router)",
          JUPYTERHUB, "6.1.1", "with subdomain_host, the hub's pages opened at another host redirect to the hub's",
          (Definition("jupyterhub.app", "JupyterHub.init_tornado_application", "93cddf630c1648bd"),
           Mentions("jupyterhub.app", "init_tornado_application", "792efb197480a68f")),
          lambda: hasattr(JupyterHub.init_tornado_application, "original"),
          guards=True, hook="a JupyterHub hook run once its tornado application is built (also what the load "
          "shedding and the garbage collector's freeze at start use)"),
    Patch("paced-new-work", "portal/hub/pacing.py",
          "the targets of JupyterHub's routes (its tornado application's wildcard_router) of the login, token and "
          "server handlers replaced by subclasses whose prepare awaits a turn (and whose spawn_single_user gives "
          "a start refused past concurrent_spawn_limit a jupyterhub_message in the portal's words)",
          JUPYTERHUB, "6.1.1", "a class's burst of logins, tokens and starts never stalls the hub's loop for the "
          "rest; a start past the spawn limit is not told that too many users log in",
          (Definition("jupyterhub.app", "JupyterHub.init_tornado_application", "93cddf630c1648bd"),
           Definition("jupyterhub.handlers.base", "BaseHandler.prepare", "76f2c75d18a69a15"),
           Definition("jupyterhub.handlers.base", "BaseHandler.spawn_single_user", "89ad7a1d6d9f3a0a")),
          lambda: any(getattr(extend, "paces_new_work", False) for extend in _AFTER_INIT),
          hook="a JupyterHub hook to admit requests (an awaitable run before a handler's prepare), or "
          "JupyterHub pacing new work itself"),
    Patch("unshareable-share-refused", "portal/hub/sharing.py",
          "the targets of JupyterHub's share routes (ServerShareAPIHandler, ServerShareCodeAPIHandler in its "
          "tornado application's wildcard_router) replaced by subclasses whose POST first refuses a session not "
          "started shareable", JUPYTERHUB, "6.1.1",
          "a share made at the hub's API of a session not started shareable was granted and listed under the "
          "guest's Shared with you, though the session refuses him; now refused in words (standing aside: the "
          "session still refuses him, and his home page does not list it)",
          (Definition("jupyterhub.app", "JupyterHub.init_tornado_application", "93cddf630c1648bd"),
           Definition("jupyterhub.apihandlers.shares", "ServerShareAPIHandler.post", "1f08a53790031b83"),
           Definition("jupyterhub.apihandlers.shares", "ServerShareCodeAPIHandler.post", "63b6c7c8ddbef7a8"),
           Definition("jupyterhub.apihandlers.shares", "_ShareAPIHandler._lookup_spawner", "2270c794c6e76ea1"),
           Mentions("jupyterhub.apihandlers.shares", "default_handlers", "e5fc20cf4ce0013d")),
          lambda: any(getattr(extend, "refuses_unshareable", False) for extend in _AFTER_INIT),
          hook="a Spawner (or Authenticator) hook asked before a share of its server is granted"),
    Patch("proxy-restart-routes", "portal/hub/proxywatch.py",
          "reads JupyterHub._service_map (private) to run Proxy.check_routes as JupyterHub does; a sentinel route in "
          "Proxy.extra_routes asked of configurable-http-proxy by ConfigurableHTTPProxy.api_request at the path its "
          "_routespec_to_chp_path makes", JUPYTERHUB, "6.1.1",
          "a proxy restarted by systemd held no route until the hub restarted (JupyterHub checks routes only at its "
          "start and with last_activity_interval, off where profiles have idle limits); standing aside: as before",
          (Mentions("jupyterhub.app", "_service_map", "69b738b4e8ca95f8"),
           Definition("jupyterhub.proxy", "Proxy.check_routes", "bc1f0d1b52b90391"),
           Definition("jupyterhub.proxy", "ConfigurableHTTPProxy.api_request", "754d6be01150f628"),
           Definition("jupyterhub.proxy", "ConfigurableHTTPProxy._routespec_to_chp_path", "e73a4a5a7e6210f8")),
          lambda: any(getattr(extend, "watches_proxy", False) for extend in _AFTER_INIT),
          hook="JupyterHub checking an external proxy's routes every few seconds (or when the proxy says it "
          "restarted), apart from last_activity_interval"),
    Patch("database-down-503", "portal/hub/databasedown.py",
          "jupyterhub.handlers.base.BaseHandler.get_current_user and BaseHandler.prepare (wrapped)", JUPYTERHUB,
          "6.1.1", "where the hub's database does not answer the look-up of a request's user, JupyterHub goes on as if "
          "nobody were logged in: browsers are sent to the login page, API clients told their token is invalid (403); "
          "the portal answers 503 in words instead. Standing aside: JupyterHub's own answer",
          (Definition("jupyterhub.handlers.base", "BaseHandler.prepare", "76f2c75d18a69a15"),
           Definition("jupyterhub.handlers.base", "BaseHandler.get_current_user", "29ae7ac5243a75fd")),
          lambda: _database_down_applied(),
          hook="JupyterHub answering 503 when its database fails the look-up of a request's user"),
    Patch("port-report-handler", "portal/hub/portreport.py",
          "jupyterhub.apihandlers.default_handlers: batchspawner's /api/batchspawner handler replaced",
          "batchspawner", "1.3.0", "batchspawner's handler sets any attribute a job sends on its spawner and "
          "takes any number of reports; the portal's takes one port, from the job it started",
          (Definition("batchspawner.api", "BatchSpawnerAPIHandler", "8462bdcbc9a5363c"),
           Mentions("batchspawner.api", "default_handlers", "a365078cd3cd6f43"),
           Mentions("jupyterhub.apihandlers", "default_handlers", "644df771c172c4ce"),
           Mentions("jupyterhub.app", "default_handlers", "41012f0f852be04c")),
          lambda: [h[1].__module__ for h in default_handlers if h[0] == r"/api/batchspawner"]
          == ["portal.hub.portreport"],
          guards=True, hook="batchspawner letting the spawner judge a job's report (or JupyterHub taking a "
          "started server's port itself)"),
    Patch("server-request-options-judged", "portal/hub/useroptions.py",
          "jupyterhub.apihandlers.users.UserServerAPIHandler.get_server_json_body (wrapped) and get_json_body "
          "(APIHandler's, wrapped on UserServerAPIHandler): the user_options of POST, PUT and PATCH judged as "
          "the body is read", JUPYTERHUB, "6.1.1",
          "a request's options are judged, each field's length bounded, before JupyterHub stores them: a start "
          "with a field of 1 MB was a 500 on MariaDB (its TEXT column) and kept whole on PostgreSQL and SQLite; "
          "PUT and PATCH stored options no spawner saw (the spawn form's are judged by options_from_form)",
          (Definition("jupyterhub.apihandlers.users", "UserServerAPIHandler.get_server_json_body", "cfe9e0a011e15563"),
           Definition("jupyterhub.apihandlers.users", "UserServerAPIHandler.post", "0c05aee71afb55f8"),
           Definition("jupyterhub.apihandlers.users", "UserServerAPIHandler.put", "4ba0a989a5fd8625"),
           Definition("jupyterhub.apihandlers.users", "UserServerAPIHandler.patch", "89120be4271cc7d5"),
           Definition("jupyterhub.apihandlers.base", "APIHandler.get_json_body", "25dc7e6f59a21fad"),
           Mentions("jupyterhub.apihandlers.users", "user_options", "df29f8eae1974705"),
           Mentions("jupyterhub.user", "user_options", "4c7aeee8b90636d3"),
           Definition("jupyterhub.handlers.pages", "SpawnHandler._post", "fec2de3bec67e2e6")),
          _judges_server_requests, guards=True, hook="a JupyterHub hook that judges a REST API request's "
          "user_options before they are stored (options_from_form covers the spawn form only)"),
    Patch("ldap-connection-timeouts", "portal/hub/auth.py",
          "ldapauthenticator LDAPAuthenticator.get_connection (overridden: its code, with timeouts, no schema read)",
          LDAP, "2.0.2", "blocking ldap3 calls without timeouts: a hung LDAP server stalled the hub's event loop; "
          "the server's schema was read and parsed on every login",
          (Definition("ldapauthenticator.ldapauthenticator", "LDAPAuthenticator.get_connection", "47dfcc9f6096c325"),
           Mentions("ldapauthenticator.ldapauthenticator", "tls_kwargs", "97b4a4179824018c")),
          None, guards=True, hook="ldapauthenticator settings for connect and receive timeouts (and for "
          "not reading the server's schema)"),
    Patch("ldap-login-in-thread", "portal/hub/auth.py",
          "ldapauthenticator LDAPAuthenticator.authenticate (its coroutine run on a worker thread)", LDAP,
          "2.0.2", "each login off the hub's event loop, with a deadline; relies on it never awaiting",
          (Definition("ldapauthenticator.ldapauthenticator", "LDAPAuthenticator.authenticate", "431a9f8eb7e737be"),),
          None, guards=True, hook="ldapauthenticator running ldap3's blocking calls off the event loop, with a "
          "deadline"),
    Patch("request-connection-address", "portal/hub/auth.py",
          "tornado: request.connection.context.address (the address the connection came from)", TORNADO,
          "6.6.1", "the login throttle counts the connection's address, not a client's own X-Real-Ip (JupyterHub "
          "serves with xheaders, so request.remote_ip is the header's)",
          (Definition("tornado.http1connection", "HTTP1Connection.__init__", "adb55c9859f13691"),
           Definition("tornado.httpserver", "_HTTPRequestContext.__init__", "6ba522c6e6575b90"),
           Definition("tornado.tcpserver", "TCPServer._handle_connection", "0cd39c682850f93e")),
          None, guards=True, hook="tornado's HTTPServerRequest telling the connection's own address beside "
          "remote_ip"),
    Patch("batchspawner-job-state", "spawner/gpuspawner.py",
          "batchspawner's BatchSpawnerBase: start(), poll() and stop() replaced, its job_id / job_status state, "
          "get_env() and startup_poll_interval kept; the spawner's own, listed here",
          "batchspawner", "1.3.0", "the session as a Slurm job read from one shared squeue snapshot, its port "
          "reported once by the running server",
          (Definition("batchspawner.batchspawner", "BatchSpawnerBase.start", "6ad1481cb08ae606"),
           Definition("batchspawner.batchspawner", "BatchSpawnerBase.poll", "86dde2053acb47ba"),
           Definition("batchspawner.batchspawner", "BatchSpawnerBase.stop", "2c30b45117678247"),
           Definition("batchspawner.batchspawner", "BatchSpawnerBase.get_state", "b81151e40d96b45b"),
           Definition("batchspawner.batchspawner", "BatchSpawnerBase.load_state", "4c43284fe8b179ae"),
           Definition("batchspawner.batchspawner", "BatchSpawnerBase.clear_state", "33de487db292d82d"),
           Definition("batchspawner.batchspawner", "UserEnvMixin.get_env", "0d3f48907ca126be")),
          None, guards=True, hook="batchspawner's start(), poll() and stop() in overridable steps (submit; read the job's "
          "state; cancel) rather than whole methods around squeue's text"),
    Patch("wrapspawner-child", "spawner/partitionspawner.py",
          "wrapspawner's WrapSpawner: child_config, child_spawner, its state and poll (start() replaced; "
          "construct_child replaced by a copy without Spawner.db, with the user's options); the spawner's own, "
          "listed here", "wrapspawner", "1.0.1",
          "the chosen profile's SlurmGPUSpawner as the child, validated before anything reaches Slurm",
          (Definition("wrapspawner.wrapspawner", "WrapSpawner.construct_child", "242b0121fb64996c"),
           Definition("wrapspawner.wrapspawner", "WrapSpawner.start", "9d36dfdecc9cffcd"),
           Definition("wrapspawner.wrapspawner", "WrapSpawner.poll", "7388f4ab923fdfd0"),
           Definition("wrapspawner.wrapspawner", "WrapSpawner.get_state", "53b69a1cfe2e16db"),
           Definition("wrapspawner.wrapspawner", "WrapSpawner.load_state", "f7e1eb7cc20c44c8"),
           Definition("wrapspawner.wrapspawner", "WrapSpawner.clear_state", "a73b18b0a10fab2c")),
          None, guards=True, hook="wrapspawner constructing its child with the user's options and without Spawner.db "
          "(a hook for the child's arguments)"),
    Patch("proxy-route-owner", "portal/hub/proxy.js",
          "configurable-http-proxy's ConfigurableProxy (subclassed: targetForReq, this._routes, this.proxy[kind] "
          "wrapped, options.agent === this.httpsAgent), loaded from lib/configproxy.js before its bin script",
          CHP, "4.6.3", "a user's route reaches only a session whose certificate names that user",
          (Mentions("chp:lib/configproxy.js", "targetForReq", "3bda90844d58cd74"),
           Mentions("chp:lib/configproxy.js", "_routes", "3f026d9edc3ffe2a"),
           Mentions("chp:lib/configproxy.js", "httpsAgent", "9ba62958dbac7146"),
           Mentions("chp:lib/configproxy.js", "proxy[kind]", "67970d6864395a08"),
           Mentions("chp:lib/configproxy.js", "exports.ConfigurableProxy", "78c1897469bf584a"),
           Mentions("chp:bin/configurable-http-proxy", "configproxy.js", "7b4ad4a36080edde")),
          _pins_session_certificates, guards=True, hook="configurable-http-proxy checking each route's target "
          "certificate (a TLS server name or fingerprint per route)"),
]
