"""A burst of new work (logins, tokens, starts) is let through one request per turn of the hub's event
loop, so whatever else arrives meanwhile is served between two of them (portal/hub/pacing.py).

The pacer on a real asyncio loop, and the routes it takes over as JupyterHub builds them; the hub's
own logins, tokens and starts run through it in every cluster test."""

import asyncio

import pytest
from jupyterhub.apihandlers.users import UserAPIHandler, UserServerAPIHandler, UserTokenListAPIHandler
from jupyterhub.handlers.login import LoginHandler
from jupyterhub.handlers.pages import HomeHandler, SpawnHandler
from tornado import web

from portal.hub.pacing import Pacer, pace_routes, paced

pytestmark = pytest.mark.quick


def burst(pacer: Pacer, starts: int, others: int) -> list[str]:
    """``starts`` requests wait for their turns at once; each other request arrives while they do (a
    callback the loop runs on its next turn, as it would a request it read). The order things ran."""
    ran: list[str] = []

    async def start(number: int) -> None:
        await pacer.turn()
        ran.append(f"start {number}")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        tasks = [asyncio.ensure_future(start(n)) for n in range(starts)]
        for n in range(others):
            await asyncio.sleep(0)  # one turn of the loop
            loop.call_soon(ran.append, f"other {n}")
        await asyncio.gather(*tasks)

    asyncio.run(main())
    return ran


def test_a_burst_goes_through_one_per_turn_and_what_arrives_meanwhile_is_served_between():
    ran = burst(Pacer(), starts=20, others=3)
    assert sorted(ran) == sorted([f"start {n}" for n in range(20)] + [f"other {n}" for n in range(3)])
    assert [r for r in ran if r.startswith("start")] == [f"start {n}" for n in range(20)]  # in the order they came
    # Every other request was served long before the burst was through, not after all twenty.
    assert ran.index("other 2") < ran.index("start 10")


def test_a_waiter_whose_client_went_away_gives_its_turn_to_the_next():
    async def main() -> list[str]:
        pacer, ran = Pacer(), []

        async def start(name: str) -> None:
            await pacer.turn()
            ran.append(name)

        first = asyncio.ensure_future(start("first"))
        gone = asyncio.ensure_future(start("gone"))
        last = asyncio.ensure_future(start("last"))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.gather(first, last)
        assert pacer.waiting == 0
        return ran

    assert asyncio.run(main()) == ["first", "last"]


def test_the_routes_of_logins_tokens_and_starts_are_paced_in_place_and_keep_their_names():
    pacer = Pacer()
    kwargs = {"a": 1}
    handlers = [("/hub/login", LoginHandler), ("/hub/api/users/([^/]+)/tokens", UserTokenListAPIHandler),
                ("/hub/api/users/([^/]+)/server", UserServerAPIHandler, kwargs), ("/hub/spawn", SpawnHandler),
                ("/hub/home", HomeHandler), ("/hub/api/users/([^/]+)", UserAPIHandler)]
    router = web.Application(handlers).wildcard_router  # as JupyterHub builds its application
    before = [rule.matcher.regex.pattern for rule in router.rules]
    assert pace_routes(router, pacer) == 4
    assert pace_routes(router, pacer) == 0  # once
    assert [rule.matcher.regex.pattern for rule in router.rules] == before  # the order of every rule kept
    for (_, original, *rest), rule in zip(handlers, router.rules, strict=True):
        if original in (HomeHandler, UserAPIHandler):
            assert rule.target is original
            continue
        assert issubclass(rule.target, original) and rule.target.dsportal_paced
        assert rule.target_kwargs == (rest[0] if rest else {})  # the handler's own arguments
        # The hub's logs and metrics label a request by its handler's module and name: unchanged.
        assert (rule.target.__module__, rule.target.__name__) == (original.__module__, original.__name__)
    assert issubclass(paced(LoginHandler, pacer), LoginHandler)
