"""New work is admitted one request per turn of the hub's event loop, so a burst never stalls the rest.

A class arriving at 9:00 sends the hub a hundred logins, token requests and session starts within a
second. Each is a few milliseconds of work the loop does in one go (the database look-ups of its
authentication, the OAuth client of a start), and requests read in one turn of the loop run back to
back: a page view or a port report read during the burst waited for all hundred, seconds at a time.

So the requests that begin new work (a POST of a login, of a token, of a start: :data:`PACED`) each
wait for a turn of their own (:class:`Pacer`): one is let through per turn of the loop, and between two
turns the loop reads and serves whatever else arrived. A burst of a hundred then costs each other
request at most one start's work, and the starts themselves lose only the turns in between.

Turns are shared fairly (:func:`lane`): round the client addresses that have requests waiting, and
within an address round the logins (signed login cookies). A neighbour who sends a thousand token
requests delays a student's start by a turn, not by a thousand. Only a lane with
:data:`MOST_WAITING_PER_LANE` requests already waiting is told to retry (429, Retry-After, a sentence;
nothing started), and only that lane; nothing else is refused, and nothing is remembered once a lane is
empty. (A request whose client went away still takes its turn, and is answered to nobody.)

The address is the one the proxy saw. Where another proxy terminates TLS in front of
configurable-http-proxy (nginx), that proxy's address is the one configurable-http-proxy appends for
everyone: fairness then goes by login cookie only, and requests without one share one lane.

Installed on the routes JupyterHub built, in place (each tornado ``Rule``'s target: its order, and so
every rule before it such as the redirect of hub pages to the hub's host, stays as it was): those
handlers' routes are served by subclasses whose ``prepare`` first waits for a turn (PATCHES:
paced-new-work).
"""

from __future__ import annotations

import asyncio
import re
from collections import deque

from jupyterhub.apihandlers.users import UserServerAPIHandler, UserTokenListAPIHandler
from jupyterhub.handlers.login import LoginHandler
from jupyterhub.handlers.pages import SpawnHandler
from jupyterhub.utils import maybe_future
from tornado import web

from portal.hub.auth import certificate_user, client_address, client_certificate
from portal.hub.loadshed import answer_busy
from portal.upstream import hub as upstream
from portal.upstream.hub import connection_address
from portal.upstream.patchcheck import stands_aside

PACED = (UserServerAPIHandler, SpawnHandler, LoginHandler, UserTokenListAPIHandler)
PACED_METHODS = frozenset({"POST"})
MOST_WAITING_PER_LANE = 1000  # beyond: 429 at once (a class behind one NAT is 100s, not 1000s)
RETRY_SECONDS = 5
PROXY_CERTIFICATE = "proxy-client"  # the common name of JupyterHub's internal_ssl certificate of its proxy


class TooManyWaiting(web.HTTPError):
    """One lane already has ``MOST_WAITING_PER_LANE`` requests waiting for a turn."""

    def __init__(self):
        message = (f"Too many logins, token requests or session starts are waiting from your address right now; "
                   f"this one was not served and nothing was started. Please try again in {RETRY_SECONDS} s.")
        super().__init__(429, "%s", message)
        self.jupyterhub_message = message  # what JupyterHub's pages and API answers show
        self.headers = {"Retry-After": str(RETRY_SECONDS)}  # written by JupyterHub's write_error


class Pacer:
    """Lets one waiter through per turn of the running event loop, fairly between who is waiting.

    Waiters queue by lane, ``(address, credential)``: turns go round the addresses that have someone
    waiting, and within an address round its lanes, each lane in the order its waiters came. One
    client that sends a thousand requests then holds back each other address (and each user with a
    login cookie of her own behind its address) by one turn per round, not by a thousand. A full lane
    refuses what comes next in it, and only that lane."""

    def __init__(self, most_waiting_per_lane: int = MOST_WAITING_PER_LANE):
        self.most_waiting_per_lane = most_waiting_per_lane
        # address -> credential -> waiters; dicts keep insertion order, so the first key is next in turn
        self._lanes: dict[str, dict[str, deque[asyncio.Future]]] = {}
        self._count = 0
        self._turn_taken = False

    async def turn(self, address: str = "", credential: str = "") -> None:
        if not self._turn_taken and not self._lanes:
            self._take_turn()
            return
        if len(self._lanes.get(address, {}).get(credential, ())) >= self.most_waiting_per_lane:
            raise TooManyWaiting()
        waiters = self._lanes.setdefault(address, {}).setdefault(credential, deque())
        future = asyncio.get_running_loop().create_future()
        waiters.append(future)
        self._count += 1
        await future  # a cancelled waiter (its client gone) is skipped by _next

    def _take_turn(self) -> None:
        self._turn_taken = True
        # Callbacks scheduled now run on the loop's next turn, after it has read what arrived meanwhile.
        asyncio.get_running_loop().call_soon(self._next)

    def _pop(self) -> asyncio.Future | None:
        """The next waiter round the addresses and their lanes; each lane moved behind the others."""
        if not self._lanes:
            return None
        address = next(iter(self._lanes))
        credentials = self._lanes.pop(address)
        credential = next(iter(credentials))
        waiters = credentials.pop(credential)
        future = waiters.popleft()
        if waiters:
            credentials[credential] = waiters  # behind this address's other lanes
        if credentials:
            self._lanes[address] = credentials  # behind the other addresses
        self._count -= 1
        return future

    def _next(self) -> None:
        self._turn_taken = False
        while (future := self._pop()) is not None:
            if not future.done():
                future.set_result(None)
                self._take_turn()
                return

    @property
    def waiting(self) -> int:
        return self._count


def lane(handler) -> tuple[str, str]:
    """A request's lane: (where it comes from, who it is, where that can be told without a look-up).

    The address is one nobody can make up: the user a session's TLS certificate names, where the request
    came straight to the hub with one (hub.internal_ssl: the hub takes no connection without a certificate
    of its CA, and any user can read her own); the address the proxy appended last to X-Forwarded-For,
    where the request came through the proxy (its certificate); else the connection's own, the header
    ignored (without internal_ssl anyone could name any address in it). Within an address, a request with
    the hub's login cookie whose signature holds has the lane of that login; every other one (an API
    token, which is not looked up: that is the work being paced; a login) shares the address's lane."""
    kind, name = certificate_of(handler)
    if kind == "session":
        address = f"session of {name}"
    elif kind == "proxy":
        address = client_address(handler)
    else:
        peer = connection_address(handler.request)
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
    # tornado checks the signature (an HMAC of the hub's cookie secret): a forged or malformed one is None
    cookie = handler.get_secure_cookie(handler.hub.cookie_name, max_age_days=handler.cookie_max_age_days)
    return address, ("login " + cookie.decode("ascii", "replace")) if cookie else ""


def certificate_of(handler) -> tuple[str, str]:
    """("session", user) for a session's certificate, ("proxy", "") for the proxy's, else ("", "")."""
    certificate = client_certificate(handler)  # read once, for both questions
    user = certificate_user(handler, certificate)
    if user:
        return "session", user
    names = [value for rdn in certificate.get("subject", ()) for key, value in rdn if key == "commonName"]
    return ("proxy", "") if names == [PROXY_CERTIFICATE] else ("", "")


_RETRY_IN = re.compile(r"Try again in ([0-9]+ (?:seconds|minutes))\.")


def spawn_limit_words(limit: int, refused: web.HTTPError) -> str:
    """A start refused past hub.concurrent_spawn_limit, in the portal's words: what is happening, that
    nothing was submitted, and JupyterHub's own time to retry (its Retry-After, rounded for people)."""
    found = _RETRY_IN.search(refused.log_message or "")
    retry = found.group(1) if found else f"{(getattr(refused, 'headers', None) or {}).get('Retry-After', 60)} seconds"
    starting = f"{limit} sessions are" if limit != 1 else "1 session is"
    return (f"{starting} starting on the portal right now (sessions waiting in the cluster's queue count too), the "
            f"most it starts at once. Yours was not started and nothing was submitted to the cluster: please try "
            f"again in {retry}.")


def paced(handler: type, pacer: Pacer) -> type:
    """``handler``'s subclass whose POSTs wait for ``pacer``'s turn before anything else, and whose start
    refused past the spawn limit says so in the portal's words (JupyterHub's speak of logging in)."""

    class Paced(handler):
        async def spawn_single_user(self, *args, **kwargs):
            try:
                return await super().spawn_single_user(*args, **kwargs)
            except web.HTTPError as refused:
                if refused.status_code == 429 and self.concurrent_spawn_limit and \
                        _RETRY_IN.search(refused.log_message or "") and not hasattr(refused, "jupyterhub_message"):
                    # what JupyterHub's API answer and spawn form show (its format_exception, write_error)
                    refused.jupyterhub_message = spawn_limit_words(self.concurrent_spawn_limit, refused)
                raise

        async def prepare(self):
            if self.request.method in PACED_METHODS:
                try:
                    await pacer.turn(*lane(self))
                except TooManyWaiting as refused:
                    # written here: JupyterHub's error pages need its prepare to have run
                    answer_busy(self, refused.jupyterhub_message, RETRY_SECONDS, "/api/" in self.request.path)
                    return None
            return await maybe_future(super().prepare())  # as BaseHandler.prepare awaits tornado's

    # Its name and module stay upstream's: the hub's logs and its metrics' handler labels do not change.
    Paced.__name__, Paced.__qualname__, Paced.__module__ = handler.__name__, handler.__qualname__, handler.__module__
    Paced.dsportal_paced = True
    return Paced


def pace_routes(router, pacer: Pacer, classes: tuple[type, ...] = PACED) -> int:
    """Each of ``router``'s rules (tornado's) served by one of ``classes`` or a subclass, served by its
    paced subclass instead, in place; how many."""
    count = 0
    for rule in router.rules:
        target = rule.target
        if isinstance(target, type) and issubclass(target, classes) and not getattr(target, "dsportal_paced", False):
            rule.target = paced(target, pacer)
            count += 1
    return count


def install(pacer: Pacer) -> None:
    """Pace new work (above) on the hub's application as JupyterHub builds it."""

    def pace_on(hub) -> None:
        if stands_aside("paced-new-work"):  # JupyterHub's code it rests on changed: served as upstream serves it
            return
        count = pace_routes(hub.tornado_application.wildcard_router, pacer)
        hub.log.info("dsportal: logins, token requests and starts go one per turn of the event loop (%d routes)", count)

    pace_on.paces_new_work = True  # PATCHES: paced-new-work is applied
    upstream.after_init_tornado_application(pace_on)
