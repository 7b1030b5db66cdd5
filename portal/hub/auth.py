"""LDAP login through jupyterhub-ldapauthenticator (ldap3), wired from portal.yaml.

ldapauthenticator's ``authenticate`` is a coroutine that makes blocking ldap3 calls with no
timeouts: one login against a hung LDAP server stalls the hub's whole event loop (every other
user's page and proxy route with it) for as long as the TCP connection lives. Here each login
runs in a worker thread, every connect and answer has a timeout, and the login as a whole has
a deadline; past it the login page says the login service is not answering (HTTP 503) and
nothing is remembered as a success.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import pwd
import re
import threading
import time

from ldap3.core.exceptions import (
    LDAPCommunicationError,
    LDAPException,
    LDAPResponseTimeoutError,
    LDAPServerPoolExhaustedError,
    LDAPStartTLSError,
)
from ldapauthenticator import LDAPAuthenticator
from tornado import web
from traitlets import Integer, List, Unicode

from portal.core import defaults
from portal.core.settings import LdapSettings, human_duration, ldap_server
from portal.core.settingtraits import hand_down, setting
from portal.core.userjson import unix_groups
from portal.hub import metrics
from portal.hub.loginthrottle import LoginThrottle
from portal.upstream import hub as upstream
from spawner.certs import USERS_DOMAIN

NOT_ANSWERING = "The login service (LDAP) is not answering right now. Please try again in a minute."


class LoginServiceUnavailable(web.HTTPError):
    """LDAP did not answer in time: the login form shows the message, status 503."""

    def __init__(self):
        super().__init__(503, NOT_ANSWERING)


_search = threading.local()  # set while resolve_username binds as the search's service account
# Seconds a login thread keeps its connection bound as the search's service account between logins: a class
# logging in at once then costs one TLS handshake and one bind a login (hers), not two. Well under the idle limit
# of directories (Active Directory's MaxConnIdleTime: 900 s).
SEARCH_CONNECTION_IDLE = 60.0


def _dn(dn: str) -> str:
    """A DN compared as LDAP does for these: case and blanks around separators aside."""
    return ",".join(part.strip().lower() for part in str(dn).split(","))


class SearchAccountRefused(RuntimeError):
    """The directory refused the search's service account (ldap.search_bind_dn): no login can work."""


MISCONFIGURED = ("The login service is not working right now: the portal's own account at the directory (LDAP) "
                 "was refused. Your password was not checked; please tell your admin.")


class TooManyFailedLogins(web.HTTPError):
    """The account (from this address) failed too often: the login form says how long to wait, 429."""

    def __init__(self, username: str, seconds: int):
        super().__init__(429, f"Too many failed logins for {username}; try again in {human_duration(seconds)}.")


def client_address(handler) -> str:
    """Who is logging in: the address the proxy saw (it appends it last to X-Forwarded-For), else
    the connection's. Not tornado's remote_ip, which takes a client's own X-Real-Ip header as is."""
    if handler is None:
        return ""
    forwarded = handler.request.headers.get("X-Forwarded-For", "").split(",")[-1].strip()
    peer = upstream.connection_address(handler.request)
    return forwarded or (str(peer[0]) if isinstance(peer, tuple) and peer else handler.request.remote_ip or "")


def account_refusal(name: str, people_uids, *, must_exist: bool) -> str | None:
    """Why ``name`` may not log in, as the hub's log says it; None if it may. Sessions run as the account: never
    a system or package account (uid outside slurm.people_uids: root, daemons, the hub's own, slurm), and, where
    ``must_exist``, not a name with no account here. May be slow (NSS: LDAP, sssd): call it off the event loop."""
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        return "no Unix account of that name here" if must_exist else None
    low, high = people_uids
    return None if low <= uid <= high else f"a system account (uid {uid}, slurm.people_uids {low} to {high})"


def people_uids_trait() -> List:
    return List(Integer(), list(defaults.PEOPLE_UIDS), minlen=2, maxlen=2,
                help="portal.yaml's slurm.people_uids: only accounts of these uids log in.").tag(config=True)


class NotThroughTheProxy(web.HTTPError):
    """A login straight to the hub's own port with a session's certificate (every user can read
    her own): it could name any client address in X-Forwarded-For and so make the throttle lock
    another user out of her usual address. People log in through the proxy; sessions never do."""

    def __init__(self):
        super().__init__(403, "Log in through the portal's address, not from a session.")


def client_certificate(handler) -> dict:
    """The TLS client certificate the request's connection showed (hub.internal_ssl), as ssl tells it; {} without."""
    try:
        return handler.request.get_ssl_certificate() or {}  # None: no certificate
    except (AttributeError, ValueError):  # plain HTTP (a socket without certificates); the connection gone
        return {}


def certificate_user(handler, certificate: dict | None = None) -> str:
    """The user a session's TLS certificate names, where the request came with one; else ""."""
    certificate = client_certificate(handler) if certificate is None else certificate
    suffix = f".{USERS_DOMAIN}"
    for kind, value in certificate.get("subjectAltName", ()):
        if kind == "DNS" and value.endswith(suffix):
            return value[:-len(suffix)]
    return ""


def has_session_certificate(handler) -> bool:
    """The request came with a session's TLS certificate: one that names a user."""
    return bool(certificate_user(handler))


class PortalAuthenticator(LDAPAuthenticator):
    """LDAPAuthenticator with portal defaults: group members only, usernames Unix can hold,
    timeouts on every LDAP operation, logins off the event loop. Each trait that mirrors a portal.yaml
    key (ldap.X, ldap.throttle.X) is made from it (portal/core/settingtraits.py) and named after it."""

    connect_timeout = setting("ldap.connect_timeout")
    receive_timeout = setting("ldap.receive_timeout")
    login_timeout = setting("ldap.login_timeout")
    # 16, not 8: a class logging in through a search bind (bench/ad_logins.py; its figures: bench/results/README.md).
    login_threads = Integer(16, help="Logins checked against LDAP at the same time.").tag(config=True)
    free_failures = setting("ldap.throttle.free_failures")
    first_delay = setting("ldap.throttle.first_delay")
    max_delay = setting("ldap.throttle.max_delay")
    account_failures = setting("ldap.throttle.account_failures")
    account_window = setting("ldap.throttle.account_window")
    account_lock = setting("ldap.throttle.account_lock")

    failover_servers = List(Unicode(), help="portal.yaml's ldap.failover_servers: "
                            f"{LdapSettings.model_fields['failover_servers'].description} (host:port each)").tag(
        config=True)
    sharing_groups = List(Unicode(), help="portal.yaml's sharing.groups: the hub's groups, set from each "
                          "user's Unix groups at her login (Authenticator.manage_groups).").tag(config=True)
    people_uids = people_uids_trait()

    _pool: concurrent.futures.ThreadPoolExecutor | None = None
    _throttle: LoginThrottle | None = None

    @property
    def throttle(self) -> LoginThrottle:
        if self._throttle is None:
            self._throttle = LoginThrottle(self.free_failures, self.first_delay, self.max_delay,
                                           self.account_failures, self.account_window, self.account_lock)
        return self._throttle

    def normalize_username(self, username):
        return super().normalize_username(username.strip())

    def get_connection(self, userdn, password):
        """ldapauthenticator's connection, with connect and receive timeouts, to the first of the servers that
        answers. The search's service account refused (its bind in resolve_username, whatever the DN: a user who
        types its name never gets this answer) is the portal's fault, not the user's: said as such. The service
        account's connection is kept by this thread for its next login (SEARCH_CONNECTION_IDLE); hers never."""
        servers = [(self.server_address, self.server_port)]
        servers += [ldap_server(server, self.server_port) for server in self.failover_servers]
        searching = getattr(_search, "binding", False)
        key = (tuple(servers), self.tls_strategy, str(self.tls_kwargs), userdn, password)
        if searching:
            kept, used = getattr(_search, "kept", {}).get(key, (None, 0.0))
            if kept is not None and kept.bound and not kept.closed and time.monotonic() - used < SEARCH_CONNECTION_IDLE:
                _search.kept[key], _search.reused = (kept, time.monotonic()), True
                return kept
            self._forget_search_connections()
        connection = upstream.ldap_connection(self, userdn, password, self.connect_timeout,
                                              max(1, math.ceil(self.receive_timeout)), servers)  # ldap3: whole seconds
        if connection is None and searching:
            raise SearchAccountRefused(userdn or "anonymous")
        if searching:
            _search.kept, _search.reused = {key: (connection, time.monotonic())}, False
        return connection

    @staticmethod
    def _forget_search_connections() -> None:
        for connection, _ in getattr(_search, "kept", {}).values():
            try:
                connection.unbind()
            except LDAPException:
                pass
        _search.kept = {}

    def resolve_username(self, username_supplied_by_user):
        """ldapauthenticator's look-up of the user's DN as the service account, refusing (as a wrong password
        is) an entry whose name is not the one typed (a directory matching look-alikes or spaces would hand
        the login another person's account: her sessions run as that name) and the service account itself."""
        _search.binding = True
        try:
            try:
                username, userdn = super().resolve_username(username_supplied_by_user)
            except LDAPCommunicationError:
                if not getattr(_search, "reused", False):
                    raise
                # The kept connection went (the directory closed it, a replica restarted): once more, afresh.
                self._forget_search_connections()
                username, userdn = super().resolve_username(username_supplied_by_user)
        finally:
            _search.binding = False
        if userdn is None:
            return None, None
        if str(username).lower() != username_supplied_by_user.lower():
            self.log.warning("Login of %r refused: the directory's entry is %r (%s), not that name",
                             username_supplied_by_user, username, userdn)
            return None, None
        if self.lookup_dn_search_user and _dn(userdn) == _dn(self.lookup_dn_search_user):
            self.log.warning("Login of %r refused: that is the portal's own search account", username_supplied_by_user)
            return None, None
        return username, userdn

    def _check_in_thread(self, data):
        # The parent's coroutine never awaits: run it to the end on this worker thread.
        return upstream.ldap_login(self, data)

    def _throttled_name(self, data) -> str | None:
        """The account a password guess is for, as the throttle counts it; None where the attempt
        never reaches LDAP anyway (a name LDAP may not see, a blank password)."""
        name = self.normalize_username(str(data.get("username") or ""))
        password = data.get("password")
        if not re.match(self.valid_username_regex, name) or not isinstance(password, str) or not password.strip():
            return None
        return name

    async def authenticate(self, handler, data):
        if handler is not None and has_session_certificate(handler):
            self.log.warning("Login of %r refused: it came straight from a session, not through the proxy",
                             data.get("username"))
            raise NotThroughTheProxy()
        account, address = self._throttled_name(data), client_address(handler)
        wait = self.throttle.wait(account, address) if account else 0
        if wait:
            self.log.warning("Login of %s from %s refused without asking LDAP: too many failures (%d s left)",
                             account, address, wait)
            metrics.LOGINS.labels("throttled").inc()
            raise TooManyFailedLogins(account, wait)
        answer = await self._ldap_login(data)
        if account:
            (self.throttle.succeeded if answer else self.throttle.failed)(account, address)
        return answer

    async def _ldap_login(self, data):
        if self._pool is None:
            type(self)._pool = concurrent.futures.ThreadPoolExecutor(self.login_threads, "ldap-login")
        check = asyncio.get_running_loop().run_in_executor(self._pool, self._check_in_thread, data)
        try:
            answer = await asyncio.wait_for(check, self.login_timeout)
        except SearchAccountRefused as error:
            self.log.error("LDAP login of %r not checked: the directory refused the search account %s (its password, "
                           "ldap.search_bind_password_file?)", data.get("username"), error)
            metrics.LOGINS.labels("ldap_unavailable").inc()
            raise web.HTTPError(503, MISCONFIGURED) from None
        except (TimeoutError, LDAPCommunicationError, LDAPResponseTimeoutError, LDAPServerPoolExhaustedError,
                LDAPStartTLSError, OSError) as error:
            self.log.error("LDAP login of %r failed: the server did not answer (%s: %s)",
                           data.get("username"), type(error).__name__, error)
            metrics.LOGINS.labels("ldap_unavailable").inc()
            raise LoginServiceUnavailable() from None
        if answer:
            answer = answer if isinstance(answer, dict) else {"name": answer}
            name = self.normalize_username(answer["name"])
            refusal, mine = await asyncio.get_running_loop().run_in_executor(self._pool, self._account, name)
            if refusal:
                self.log.warning("Login of %r refused: %s", name, refusal)
                answer = None
            elif self.manage_groups:
                # JupyterHub sets her groups to this list (it must be there): the sharing groups she is in now.
                answer["groups"] = sorted(mine & set(self.sharing_groups))
        metrics.LOGINS.labels("ok" if answer else "refused").inc()
        return answer

    def _account(self, name: str) -> tuple[str | None, set[str]]:
        """Why her account may not log in (account_refusal), else her Unix groups where the hub keeps them: one trip
        to a worker thread for both (NSS may be slow: sssd, LDAP)."""
        refusal = account_refusal(name, self.people_uids, must_exist=False)
        return refusal, (unix_groups(name) if self.manage_groups and not refusal else set())


def configure_ldap(c, settings) -> None:
    ldap = settings.ldap
    c.JupyterHub.authenticator_class = PortalAuthenticator
    c.LDAPAuthenticator.server_address = ldap.server_address
    c.LDAPAuthenticator.server_port = ldap.server_port
    c.PortalAuthenticator.failover_servers = list(ldap.failover_servers)  # read by settings.ldap_server
    c.LDAPAuthenticator.tls_strategy = ldap.tls_strategy
    c.LDAPAuthenticator.tls_kwargs = ldap.tls_kwargs()  # ldap3's default checks no certificate at all
    c.LDAPAuthenticator.bind_dn_template = list(ldap.bind_dn_template)
    c.LDAPAuthenticator.allowed_groups = list(ldap.allowed_groups)
    if ldap.group_search_filter:
        c.LDAPAuthenticator.group_search_filter = ldap.group_search_filter
    if ldap.search_base:  # ldapauthenticator's look-up of the user's DN, as the service account
        c.LDAPAuthenticator.lookup_dn = True
        c.LDAPAuthenticator.user_search_base = ldap.search_base
        c.LDAPAuthenticator.user_attribute = ldap.user_attribute
        c.LDAPAuthenticator.lookup_dn_user_dn_attribute = ldap.user_attribute  # her account name: the login's
        c.LDAPAuthenticator.lookup_dn_search_user = ldap.search_bind_dn or None
        c.LDAPAuthenticator.lookup_dn_search_password = ldap.search_password()  # its file: the hub account's alone
    hand_down(c, settings, PortalAuthenticator)  # its timeouts, its throttle of failed logins
    c.PortalAuthenticator.people_uids = list(settings.slurm.people_uids)
    # Unix account names only: they become Slurm job owners.
    c.LDAPAuthenticator.valid_username_regex = r"^[a-z_][a-z0-9_-]{0,31}$"
    if not ldap.allowed_groups:
        c.Authenticator.allow_all = True
