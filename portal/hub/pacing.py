"""New work is admitted one request per turn of the hub's event loop, so a burst never stalls the rest.

A class arriving at 9:00 sends the hub a hundred logins, token requests and session starts within a
second. Each is a few milliseconds of work the loop does in one go (the database look-ups of its
authentication, the OAuth client of a start), and requests read in one turn of the loop run back to
back: a page view or a port report read during the burst waited for all hundred, seconds at a time.

So the requests that begin new work (a POST of a login, of a token, of a start: :data:`PACED`) each
wait for a turn of their own (:class:`Pacer`): one is let through per turn of the loop, and between two
turns the loop reads and serves whatever else arrived. A burst of a hundred then costs each other
request at most one start's work, and the starts themselves lose only the turns in between. Nothing is
refused, dropped or remembered: a request whose client went away gives its turn to the next.

Installed on the routes JupyterHub built, in place (each tornado ``Rule``'s target: its order, and so
every rule before it such as the redirect of hub pages to the hub's host, stays as it was): those
handlers' routes are served by subclasses whose ``prepare`` first waits for a turn (PATCHES:
paced-new-work).
"""

from __future__ import annotations

import asyncio
from collections import deque

from jupyterhub.apihandlers.users import UserServerAPIHandler, UserTokenListAPIHandler
from jupyterhub.handlers.login import LoginHandler
from jupyterhub.handlers.pages import SpawnHandler
from jupyterhub.utils import maybe_future

from ..patchcheck import stands_aside
from . import upstream

PACED = (UserServerAPIHandler, SpawnHandler, LoginHandler, UserTokenListAPIHandler)
PACED_METHODS = frozenset({"POST"})


class Pacer:
    """Lets one waiter through per turn of the running event loop, in the order they came."""

    def __init__(self):
        self._waiting: deque[asyncio.Future] = deque()
        self._turn_taken = False

    async def turn(self) -> None:
        if not self._turn_taken and not self._waiting:
            self._take_turn()
            return
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        await future  # a cancelled waiter (its client gone) is skipped by _next

    def _take_turn(self) -> None:
        self._turn_taken = True
        # Callbacks scheduled now run on the loop's next turn, after it has read what arrived meanwhile.
        asyncio.get_running_loop().call_soon(self._next)

    def _next(self) -> None:
        self._turn_taken = False
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_result(None)
                self._take_turn()
                return

    @property
    def waiting(self) -> int:
        return len(self._waiting)


def paced(handler: type, pacer: Pacer) -> type:
    """``handler``'s subclass whose POSTs wait for ``pacer``'s turn before anything else."""

    class Paced(handler):
        async def prepare(self):
            if self.request.method in PACED_METHODS:
                await pacer.turn()
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
