"""A session shared with named colleagues, on purpose (portal.yaml's ``sharing``; the hub's side:
portal.hub.sharing).

The session's owner is JUPYTERHUB_USER; a guest is anyone else the hub lets in (JupyterHub's sharing:
``access:servers!server=<owner>/<session>``). A guest reads and changes the owner's files and runs code
as her, inside her job, until she takes the share back; that is what sharing means, and the Share
panel says so. The share itself reaches this session only, and in it not the owner's own pages; code
the guest runs as her can of course do what she can (the security model says so).

:class:`GuestGate` is the session's identity provider (JupyterHub's own, subclassed; put in place by
:func:`install_gate`), so it judges every request of every handler, websockets included, before the
handler runs. The owner passes, and a JupyterHub admin as
JupyterHub lets one. A guest passes only where:

- the session is shareable (the hub found its owner in a sharing group: the session spec's sharing_groups); a
  session that is not refuses a share made earlier;
- she is a Unix member of one of those groups (a share code or an old share does not widen them);
- the hub still says she has access, asked again every GUEST_RECHECK seconds (a share taken back at
  the hub ends within that time; one taken back in the Share panel at once);
- the page is not one of the owner's own: dsportal's (jobs, schedules, TensorBoards, walltime, this
  panel) and jupyter-server-proxy's (VS Code, any port).

Her websockets are kept track of and closed when the owner takes the share back; what she opens, runs
and saves goes to the owner's visits log, which the Share panel shows. :class:`SharingHandler`
(dsportal/api/sharing) grants, lists and takes back this session's shares through the hub's share
API with the owner's own token (the one her request came with), never the session's.

A session is shareable only when the hub says so; only then does it load live co-editing
(jupyter-collaboration: portal.session.tool.offer).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
import weakref
from datetime import UTC, datetime
from pathlib import Path

from jupyterhub.singleuser.extension import JupyterHubIdentityProvider
from tornado import web
from tornado.websocket import WebSocketHandler

from portal.core.userjson import unix_groups
from portal.session import hubapi
from portal.session.api import MessageAPIHandler
from portal.session.tool.offer import GUEST_RECHECK, sharing_groups
from portal.upstream import session as upstream

VISIT_REPEAT = 60  # seconds: the same visit (guest, what) is logged once in this time
CONNECTED_FOR = 60  # seconds: a guest whose last request is this recent counts as connected
VISITS_SHOWN = 50
NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
GUEST_REFUSED = ("This is {owner}'s own page: as a guest in this session you can use its notebooks, "
                 "files, kernels and terminal, not its Jobs panel, TensorBoards, VS Code, sharing or walltime pages.")
LOG_MOST = 1 << 20  # bytes: the visits log is rotated (one old copy, .1) past this
NOT_SHARED = "This session of {owner}'s is not shared with you."


def owner() -> str:
    return os.environ.get("JUPYTERHUB_USER", "")


def session_name() -> str:
    return os.environ.get("JUPYTERHUB_SERVER_NAME", "")


class Guests:
    """The session's guests as this server has seen them: when the hub last confirmed each one, who is
    connected, their websockets, and the visits log."""

    def __init__(self, log_path: Path):
        self.log_path = log_path
        self.checked: dict[str, float] = {}  # guest -> when the hub last confirmed her access
        self.generation: dict[str, int] = {}  # guest -> how often her access was taken back
        self.tokens: dict[str, str] = {}  # guest -> the token of her latest websocket, for its rechecks
        self.seen: dict[str, float] = {}
        self.sockets: dict[str, weakref.WeakSet] = {}
        self._logged: dict[tuple, float] = {}

    def visit(self, guest: str, what: str | None) -> None:
        now = time.monotonic()
        self.seen[guest] = now
        if what is None:
            return
        if len(self._logged) > 1000:  # what was logged long enough ago may be logged again
            self._logged = {k: t for k, t in self._logged.items() if now - t < VISIT_REPEAT}
        key = (guest, what)
        if now - self._logged.get(key, -VISIT_REPEAT) < VISIT_REPEAT:
            return
        self._logged[key] = now
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if self.log_path.exists() and self.log_path.stat().st_size > LOG_MOST:
                self.log_path.replace(self.log_path.with_name(self.log_path.name + ".1"))
            with open(self.log_path, "a", encoding="utf-8") as log:
                log.write(f"{stamp} {guest} {what[:200]}\n")
        except OSError:
            pass  # a full home: the visit is still judged, just not written down

    def visits(self) -> list[str]:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - 32 * 1024))
                return log.read().decode(errors="replace").splitlines()[-VISITS_SHOWN:]
        except OSError:
            return []

    def connected(self) -> list[str]:
        now = time.monotonic()
        return sorted(g for g in set(self.seen) | set(self.sockets)
                      if now - self.seen.get(g, -CONNECTED_FOR) < CONNECTED_FOR or len(self.sockets.get(g, ())) > 0)

    def opened(self, guest: str, socket: WebSocketHandler, token: str) -> None:
        self.sockets.setdefault(guest, weakref.WeakSet()).add(socket)
        self.tokens[guest] = token

    def take_back(self, guest: str) -> int:
        """The hub took ``guest``'s share back: her next request asks the hub again, and her websockets
        are closed now. How many were closed."""
        self.checked.pop(guest, None)
        self.seen.pop(guest, None)
        self.tokens.pop(guest, None)
        self.generation[guest] = self.generation.get(guest, 0) + 1
        sockets = list(self.sockets.pop(guest, ()))
        for socket in sockets:
            socket.close(4403, "Your access to this session was taken back by its owner.")
        return len(sockets)


_GUESTS: Guests | None = None


def guests() -> Guests:
    global _GUESTS
    if _GUESTS is None:
        folder = Path.home() / ".dsportal" / "sharing"
        _GUESTS = Guests(folder / f"{session_name() or 'default'}-visits.log")
    return _GUESTS


def _owners_page(handler) -> bool:
    """dsportal's own routes, and jupyter-server-proxy's (VS Code, /proxy/<port>): the owner's only."""
    module = type(handler).__module__ or ""
    if module.startswith(("portal.", "jupyter_server_proxy")):
        return True
    return any(c.__module__.startswith("jupyter_server_proxy") for c in type(handler).__mro__)


class GuestGate(JupyterHubIdentityProvider):
    """JupyterHub's identity provider, and for anyone but the owner (and an admin): the guest's rules."""

    async def get_user(self, handler):
        user = await super().get_user(handler)
        if user is None and await self._hub_may_have_changed_its_mind(handler):
            # What the refusal left on the handler (PATCHES: guest-gate): HubAuth's answer for this request,
            # the provider's, and the redirect it made raise 403.
            for asked in ("_cached_hub_user", "_jupyterhub_user", "redirect"):
                handler.__dict__.pop(asked, None)
            user = await super().get_user(handler)
        if user is None:
            return None
        name = user.username
        if name == owner() or (getattr(user, "hub_user", None) or {}).get("admin"):
            return user
        why = await self._refusal(handler, name)
        if why:
            handler.log.warning("dsportal: %s refused %s %s: %s", name, handler.request.method, handler.request.path, why)
            handler._jupyterhub_user = None
            # The error page asks who is logged in: nobody (as jupyter_server itself does before its own 403).
            handler.current_user = handler._jupyter_current_user = None
            raise web.HTTPError(403, why)
        book = guests()
        if isinstance(handler, WebSocketHandler):
            book.opened(name, handler, self.hub_auth.get_token(handler) or "")
            _recheck_sockets(self)
        book.visit(name, _visit_words(handler))  # None: nothing worth a line (JupyterLab's polling)
        return user

    async def _hub_may_have_changed_its_mind(self, handler) -> bool:
        """A token the hub knows but whose cached answer keeps it out (JupyterHub's HubAuth keeps an answer 5
        minutes) is asked again once that answer is REASK_AFTER seconds old: a share made again at the hub's
        own API, not through this session's Share panel (which forgets the cache itself), lets its guest in
        within that time. A token the hub does not know is never asked again (nothing for anyone to send
        endlessly), and the whole session asks at most REASKS_PER_SECOND times a second. True when the hub now
        lets the token in; its cached answer is then forgotten."""
        token = self.hub_auth.get_token(handler)
        if not token or not sharing_groups() or not handler.__dict__.get("_cached_hub_user"):
            return False  # no token, not shareable, or the hub knows no such token: nothing to ask again
        now, asked = time.monotonic(), _REASKED
        key = hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()
        if key not in asked:
            if len(asked) >= REASKED_MOST:  # bounded: only what is old enough to be asked again anyway goes
                for old in [k for k, t in asked.items() if now - t >= GUEST_RECHECK]:
                    del asked[old]
                if len(asked) >= REASKED_MOST:
                    return False
            asked[key] = now  # the hub's "no" is fresh: asked again once it is REASK_AFTER old
            return False
        if now - asked[key] < REASK_AFTER or not _REASK_BUDGET.take(now):
            return False
        asked[key] = now
        if not await _still_shared(self.hub_auth, token):
            return False
        del asked[key]
        _forget_token(self.hub_auth, handler, token)
        return True

    async def _refusal(self, handler, name: str) -> str | None:
        groups = sharing_groups()
        if not groups:
            return NOT_SHARED.format(owner=owner())
        book = guests()
        if time.monotonic() - book.checked.get(name, -GUEST_RECHECK) >= GUEST_RECHECK:
            generation = book.generation.get(name, 0)
            token = self.hub_auth.get_token(handler)
            why = await _still_allowed(self.hub_auth, name, groups, token)
            if why:
                book.take_back(name)
                if token:  # HubAuth's cached "yes" goes too: his next requests are refused without asking the hub
                    _forget_token(self.hub_auth, handler, token)
                return why
            if book.generation.get(name, 0) == generation:  # not taken back while the hub answered
                book.checked[name] = time.monotonic()
        if _owners_page(handler):
            where = handler.request.path.removeprefix(handler.base_url)
            if where != "server-proxy/servers-info":  # JupyterLab asks at each load
                book.visit(name, f"was refused the owner's page {'/'.join(where.split('/')[:2])[:60]}")
            return GUEST_REFUSED.format(owner=owner())
        return None


async def _still_allowed(hub_auth, name: str, groups: list[str], token: str | None) -> str | None:
    """None while the guest may be in: a Unix member of one of the owner's sharing groups, and the hub
    still says her token reaches this session; else why not."""
    mine = await asyncio.get_running_loop().run_in_executor(None, unix_groups, name)  # NSS: maybe LDAP
    if not mine & set(groups):
        return f"{owner()} may share this session only with members of {', '.join(groups)}; {name} is not one."
    if not await _still_shared(hub_auth, token):
        return NOT_SHARED.format(owner=owner())
    return None


_RECHECKING: list = []
_REASKED: dict[str, float] = {}  # sha256 of a token the hub knows but refused -> when it last said so
REASKED_MOST = 1000
REASK_AFTER = GUEST_RECHECK / 2  # seconds: a share made at the hub's API lets its guest in within this, not 5 min
REASKS_PER_SECOND = 5


class _Budget:
    """At most ``rate`` takes a second, the session's whole."""

    def __init__(self, rate: int):
        self.rate, self.second, self.taken = rate, -1, 0

    def take(self, now: float) -> bool:
        if int(now) != self.second:
            self.second, self.taken = int(now), 0
        self.taken += 1
        return self.taken <= self.rate


_REASK_BUDGET = _Budget(REASKS_PER_SECOND)


def _forget_token(hub_auth, handler, token: str) -> None:
    """HubAuth's cached answer for one token, as its user_for_token keys it ('token:<session id>:<sha256>';
    PATCHES: guest-gate), for the request's login session and for none."""
    digest = hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()
    for session_id in {hub_auth.get_session_id(handler) or "", ""}:
        hub_auth.cache.pop(f"token:{session_id}:{digest}", None)


def _recheck_sockets(gate) -> None:
    """While guests have websockets open, their access is asked again every GUEST_RECHECK seconds: a share
    taken back at the hub (or a guest who left the groups) closes them too, not only new requests."""
    if _RECHECKING:
        return
    from tornado.ioloop import PeriodicCallback

    async def recheck():
        book, groups = guests(), sharing_groups()
        for name in [n for n, s in book.sockets.items() if len(s)]:
            generation = book.generation.get(name, 0)
            why = await _still_allowed(gate.hub_auth, name, groups, book.tokens.get(name)) if groups else "not shareable"
            if why and book.generation.get(name, 0) == generation:
                gate.log.warning("dsportal: %s's open connections to this session closed: %s", name, why)
                book.take_back(name)

    callback = PeriodicCallback(recheck, GUEST_RECHECK * 1000)
    callback.start()
    _RECHECKING.append(callback)


async def _still_shared(hub_auth, token: str | None) -> bool:
    """The hub's word, now, on the guest's token: does it still reach this session? (Not answering:
    not this time; the next request asks again.)"""
    if not token:
        return False
    try:
        model = await hub_auth.user_for_token(token, use_cache=False, sync=False)
    except Exception:  # noqa: BLE001 - the hub did not answer: a guest is not let in on an old answer
        return False
    return bool(model) and bool(hub_auth.check_scopes(hub_auth.access_scopes, model))


def _visit_words(handler) -> str | None:
    path, method = handler.request.path, handler.request.method
    base = handler.base_url
    where = path[len(base):] if path.startswith(base) else path
    if isinstance(handler, WebSocketHandler):
        if "/channels" in where and where.startswith("api/kernels/"):
            return "connected to a kernel (runs code as the owner)"
        if where.startswith("api/collaboration/room/"):
            return "opened a document to edit live"
        if where.startswith("terminals/websocket/"):
            return "used a terminal (runs commands as the owner)"
        return None
    if where.startswith("api/contents/") and method in ("PUT", "PATCH", "POST", "DELETE"):
        return f"{'deleted' if method == 'DELETE' else 'changed'} {where.removeprefix('api/contents/')}"
    if where.startswith("lab"):
        return "opened JupyterLab"
    return None


def _share_path() -> str:
    return f"shares/{owner()}/{session_name()}"


class SharingHandler(MessageAPIHandler):
    """GET: who has access, who is connected, the visits; POST {"user": name} or {"group": name}: share;
    DELETE ?user=name or ?group=name: take it back."""

    @web.authenticated
    async def get(self):
        groups = sharing_groups()
        if self.get_query_argument("brief", ""):  # JupyterLab's question at each page load: no call to the hub
            self.finish(json.dumps({"shareable": bool(groups)}))
            return
        if not groups:
            self.finish(json.dumps({"shareable": False, "groups": [], "shares": [], "connected": [], "visits": [],
                                    "message": _NOT_SHAREABLE}))
            return
        response = await hubapi.request("GET", _share_path() + "?limit=200", token=self._owners_token())
        if response.code != 200:
            raise web.HTTPError(502, f"The hub did not list this session's shares: {hubapi.message_of(response)}")
        items = json.loads(response.body or b"{}").get("items", [])
        shares = [{"user": (i.get("user") or {}).get("name"), "group": (i.get("group") or {}).get("name"),
                   "created": i.get("created_at")} for i in items]
        book = guests()
        self.finish(json.dumps({"shareable": True, "groups": groups, "owner": owner(), "session": session_name(),
                                "shares": shares, "connected": book.connected(), "visits": book.visits()}))

    @web.authenticated
    async def post(self):
        kind, name = self._target(self.get_json_body())
        groups = sharing_groups()
        if not groups:
            raise web.HTTPError(400, _NOT_SHAREABLE)
        if kind == "user" and name == owner():
            raise web.HTTPError(400, "This session is yours already.")
        allowed = _within(kind, name, groups)
        if allowed is not None:
            raise web.HTTPError(403, allowed)
        token = self._owners_token()
        if kind == "user":
            await self._share_with(name, token)
            message = f"Shared with {name}. They find it on their home page, under Shared with you, until you take it back."
        else:
            # A group's members, each by name: JupyterHub 6.1 lets a group's members in with their browser's
            # token only through shares of their own (scopes.get_scopes_for reads a token's owner's shares,
            # not her groups'; proposed upstream).
            shared, absent = [], []
            for member in _members(name):
                try:
                    await self._share_with(member, token)
                    shared.append(member)
                except _NotSignedIn:
                    absent.append(member)
            if not shared:
                raise web.HTTPError(400, f"Nobody of {name} but you has signed in to the portal yet.")
            message = f"Shared with {', '.join(shared)} ({name})."
            if absent:
                message += f" Not yet with {', '.join(absent)}: share again once they have signed in."
        self.identity_provider.hub_auth.cache.clear()  # the hub's earlier "no" about a guest, forgotten now
        self.log.info("dsportal: %s shared this session with %s %s", owner(), kind, name)
        self.finish(json.dumps({"message": message}))

    async def _share_with(self, user: str, token: str) -> None:
        response = await hubapi.request("POST", _share_path(), {"user": user}, token=token)
        if response.code == 200:
            return
        message = hubapi.message_of(response)
        if response.code == 400 and message.startswith("No such user"):
            raise _NotSignedIn(400, f"{user} has not signed in to the portal yet: the portal knows people once "
                                    "they have signed in. Ask them to sign in once, then share again.")
        raise web.HTTPError(403 if response.code == 403 else 502, f"The hub refused the share: {message}")

    @web.authenticated
    async def delete(self):
        kind, name = self._target({k: self.get_query_argument(k) for k in ("user", "group")
                                   if self.get_query_argument(k, None) is not None})
        token = self._owners_token()
        if kind == "group":  # a share with the group itself (made through the hub's API), then its members'
            await hubapi.request("PATCH", _share_path(), {"group": name}, token=token)
        for user in [name] if kind == "user" else _members(name):
            response = await hubapi.request("PATCH", _share_path(), {"user": user}, token=token)
            if response.code != 200:
                raise web.HTTPError(502, f"The hub did not take {user}'s share back: {hubapi.message_of(response)}")
            self.identity_provider.hub_auth.cache.clear()  # the hub's earlier "yes" about the guest, forgotten now
            guests().take_back(user)
        self.log.info("dsportal: %s took back %s %s's access", owner(), kind, name)
        self.finish(json.dumps({"message": f"{name} no longer has access to this session."}))

    def _owners_token(self) -> str:
        """The token her request came with (her browser's, for this session; or her API token): the
        hub judges the share by her rights. The session's own token (in every kernel's environment,
        where a guest's code could read it) grants nothing."""
        token = self.identity_provider.hub_auth.get_token(self)
        if not token:
            raise web.HTTPError(403, "Sharing needs your own login to this session.")
        return token

    def _target(self, body) -> tuple[str, str]:
        if not isinstance(body, dict) or len(body) != 1 or next(iter(body)) not in ("user", "group"):
            raise web.HTTPError(400, 'Name one person or one group: {"user": "<name>"} or {"group": "<name>"}.')
        kind, name = next(iter(body.items()))
        if not isinstance(name, str) or not NAME.match(name):
            shown = name[:40] + "..." if isinstance(name, str) and len(name) > 40 else name
            raise web.HTTPError(400, f"{shown!r} is not a user or group name of this cluster.")
        return kind, name


class _NotSignedIn(web.HTTPError):
    """The hub knows no such user: she has never signed in."""


def _members(group: str) -> list[str]:
    """A Unix group's members, but the session's owner."""
    import grp

    try:
        members = grp.getgrnam(group).gr_mem
    except KeyError:
        return []
    return sorted(set(members) - {owner()})


_NOT_SHAREABLE = ("This session cannot be shared: it was not started with \"Let me share this session with a "
                  "colleague\" ticked (the form shows that box where your admin allows you to share).")


def _within(kind: str, name: str, groups: list[str]) -> str | None:
    """None where the admin's groups allow sharing with ``name``; else why not, in words (the hub checks too)."""
    if kind == "group":
        return None if name in groups else (f"You can share only within {', '.join(groups)}; "
                                            f"{name} is not one of these groups.")
    if unix_groups(name) & set(groups):
        return None
    return (f"You can share this session only with members of {', '.join(groups)} (your admin's rule); "
            f"{name} is not one.")


def routes() -> list[tuple]:
    return [("dsportal/api/sharing", SharingHandler)]


def install_gate(server_app) -> None:
    """The server's identity provider becomes the guest gate. jupyterhub-singleuser sets
    ``ServerApp.identity_provider_class`` itself, over the server's config, so the one it made (a
    JupyterHubIdentityProvider) takes :class:`GuestGate`, its subclass, as its class (upstream.py:
    patch guest-gate). Fail closed: a server whose provider is not the gate afterwards stops rather
    than serve a guest of an earlier share the owner's pages."""
    upstream.make_guest_gate(server_app, GuestGate)
    provider = getattr(server_app, "identity_provider", None)
    if isinstance(provider, JupyterHubIdentityProvider) and not isinstance(provider, GuestGate):
        server_app.log.critical("dsportal: this session's identity provider is %s, not dsportal's guest gate "
                                "(portal.session.sharing.GuestGate): it does not start", type(provider).__name__)
        raise SystemExit(1)
