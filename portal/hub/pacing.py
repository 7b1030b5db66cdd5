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
within an address round the users (by their signed login cookie or API token). A neighbour who sends
a thousand token requests delays a student's start by a turn, not by a thousand. Only an address with
:data:`MOST_WAITING_PER_ADDRESS` requests already waiting is told to retry (429, Retry-After, a
sentence; nothing started); nothing else is refused, and nothing is remembered once a lane is empty. A
request whose client went away gives its turn to the next.

Installed on the routes JupyterHub built, in place (each tornado ``Rule``'s target: its order, and so
every rule before it such as the redirect of hub pages to the hub's host, stays as it was): those
handlers' routes are served by subclasses whose ``prepare`` first waits for a turn (PATCHES:
paced-new-work).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque

from jupyterhub.apihandlers.users import UserServerAPIHandler, UserTokenListAPIHandler
from jupyterhub.handlers.login import LoginHandler
from jupyterhub.handlers.pages import SpawnHandler
from jupyterhub.utils import maybe_future
from tornado import web

from ..patchcheck import stands_aside
from . import upstream
from .auth import certificate_user, client_address

PACED = (UserServerAPIHandler, SpawnHandler, LoginHandler, UserTokenListAPIHandler)
PACED_METHODS = frozenset({"POST"})
MOST_WAITING_PER_ADDRESS = 1000  # beyond: 429 at once (a class behind one NAT is 100s, not 1000s)
RETRY_SECONDS = 5


class TooManyWaiting(web.HTTPError):
    """One client address already has ``MOST_WAITING_PER_ADDRESS`` requests waiting for a turn."""

    def __init__(self):
        message = (f"Too many logins, token requests or session starts are waiting from your address right now; "
                   f"this one was not served and nothing was started. Please try again in {RETRY_SECONDS} s.")
        super().__init__(429, "%s", message)
        self.jupyterhub_message = message  # what JupyterHub's pages and API answers show
        self.headers = {"Retry-After": str(RETRY_SECONDS)}  # written by JupyterHub's write_error


class Pacer:
    """Lets one waiter through per turn of the running event loop, fairly between who is waiting.

    Waiters queue by lane, ``(address, credential)``: turns go round the addresses that have someone
    waiting, and within an address round its credentials, each lane in the order its waiters came. One
    client that sends a thousand requests then holds back each other address (and each other user
    behind its address) by one turn per round, not by a thousand."""

    def __init__(self, most_waiting_per_address: int = MOST_WAITING_PER_ADDRESS):
        self.most_waiting_per_address = most_waiting_per_address
        # address -> credential -> waiters; dicts keep insertion order, so the first key is next in turn
        self._lanes: dict[str, dict[str, deque[asyncio.Future]]] = {}
        self._count: dict[str, int] = {}
        self._turn_taken = False

    async def turn(self, address: str = "", credential: str = "") -> None:
        if not self._turn_taken and not self._lanes:
            self._take_turn()
            return
        if self._count.get(address, 0) >= self.most_waiting_per_address:
            raise TooManyWaiting()
        future = asyncio.get_running_loop().create_future()
        self._lanes.setdefault(address, {}).setdefault(credential, deque()).append(future)
        self._count[address] = self._count.get(address, 0) + 1
        await future  # a cancelled waiter (its client gone) is skipped by _next

    def _take_turn(self) -> None:
        self._turn_taken = True
        # Callbacks scheduled now run on the loop's next turn, after it has read what arrived meanwhile.
        asyncio.get_running_loop().call_soon(self._next)

    def _pop(self) -> asyncio.Future | None:
        """The next waiter round the addresses and their credentials; each lane moved behind the others."""
        if not self._lanes:
            return None
        address = next(iter(self._lanes))
        credentials = self._lanes.pop(address)
        credential = next(iter(credentials))
        waiters = credentials.pop(credential)
        future = waiters.popleft()
        if waiters:
            credentials[credential] = waiters  # behind this address's other credentials
        if credentials:
            self._lanes[address] = credentials  # behind the other addresses
        self._count[address] -= 1
        if not self._count[address]:
            del self._count[address]
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
        return sum(self._count.values())


def lane(handler) -> tuple[str, str]:
    """A request's lane: (where it comes from, whose it says it is).

    The address is the user a session's TLS certificate names, where the request came straight to the
    hub with one (any user can read her own, and so could name any address in X-Forwarded-For), else
    the address the proxy appended to X-Forwarded-For, else the connection's. The credential is the
    hub's login cookie where its signature holds (a forged one counts as none), else the API token the
    request carries (not looked up: that is the work being paced; a client that makes up tokens only
    splits its own address's share)."""
    certified = certificate_user(handler)
    address = f"session of {certified}" if certified else client_address(handler)
    # tornado checks the signature (an HMAC of the hub's cookie secret): a forged or malformed one is None
    cookie = handler.get_secure_cookie(handler.hub.cookie_name, max_age_days=handler.cookie_max_age_days)
    if cookie:
        return address, "cookie " + cookie.decode("ascii", "replace")
    authorization = handler.request.headers.get("Authorization", "")
    kind, _, token = authorization.partition(" ")
    if kind.lower() in ("token", "bearer") and token.strip():
        return address, "token " + hashlib.sha256(token.strip().encode()).hexdigest()[:16]
    return address, ""


def paced(handler: type, pacer: Pacer) -> type:
    """``handler``'s subclass whose POSTs wait for ``pacer``'s turn before anything else."""

    class Paced(handler):
        async def prepare(self):
            if self.request.method in PACED_METHODS:
                await pacer.turn(*lane(self))
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
