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
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from portal.hub.pacing import Pacer, TooManyWaiting, lane, pace_routes, paced

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


def order_of(pacer: Pacer, arrivals: list[tuple[str, str, str]]) -> list[str]:
    """Each (name, address, credential) waits for a turn, all at once in this order: the order they ran."""
    ran: list[str] = []

    async def wait(name: str, address: str, credential: str) -> None:
        await pacer.turn(address, credential)
        ran.append(name)

    async def main() -> None:
        await asyncio.gather(*(wait(*arrival) for arrival in arrivals))

    asyncio.run(main())
    return ran


def test_a_flood_from_one_address_holds_another_back_by_one_turn_not_by_the_flood():
    flood = [(f"bob {n}", "10.0.0.2", "token b") for n in range(50)]
    ran = order_of(Pacer(), flood + [("alice", "10.0.0.3", "cookie a"), ("carol", "10.0.0.4", "")])
    assert ran.index("alice") <= 2 and ran.index("carol") <= 4  # not after bob's fifty
    assert [r for r in ran if r.startswith("bob")] == [f"bob {n}" for n in range(50)]  # bob's in the order they came


def test_behind_one_address_each_user_gets_her_turn_in_round():
    flood = [(f"bob {n}", "login node", "token b") for n in range(30)]
    ran = order_of(Pacer(), flood + [("alice", "login node", "cookie a"), ("made up", "login node", "token x")])
    assert ran.index("alice") <= 2 and ran.index("made up") <= 3
    # Made-up credentials split their own address's share: another address still gets every other turn.
    sybil = [(f"fake {n}", "login node", f"token {n}") for n in range(30)]
    ran = order_of(Pacer(), sybil + [(f"student {n}", f"10.1.0.{n}", f"cookie {n}") for n in range(3)])
    assert max(ran.index(f"student {n}") for n in range(3)) <= 6


def test_an_address_with_too_many_waiting_is_told_to_retry_and_others_are_not():
    async def main() -> tuple[list[str], list[str]]:
        pacer, ran, refused = Pacer(most_waiting_per_address=3), [], []

        async def wait(name: str, address: str) -> None:
            try:
                await pacer.turn(address, "")
            except TooManyWaiting as error:
                assert error.status_code == 429 and error.headers["Retry-After"] == "5"
                assert "try again in 5 s" in error.jupyterhub_message
                refused.append(name)
                return
            ran.append(name)

        await asyncio.gather(*(wait(f"bob {n}", "10.0.0.2") for n in range(6)), wait("alice", "10.0.0.3"))
        assert pacer.waiting == 0
        return ran, refused

    ran, refused = asyncio.run(main())
    # The first goes at once (nobody waiting), three wait, the other two are refused; alice is served.
    assert refused == ["bob 4", "bob 5"] and "alice" in ran and len(ran) == 5


def handler_for(headers: dict[str, str]) -> web.RequestHandler:
    """A tornado handler as a hub's own, with the hub's cookie name and secret, for a request with these headers."""
    application = web.Application(cookie_secret="s" * 32)

    class Hub:
        cookie_name = "jupyterhub-hub-login"

    class Handler(web.RequestHandler):
        hub, cookie_max_age_days = Hub(), 14

    request = HTTPServerRequest(start_line=RequestStartLine("POST", "/hub/api/users/bob/tokens", "HTTP/1.1"),
                                headers=HTTPHeaders({"Host": "127.0.0.1:8000", **headers}),
                                connection=mock_connection())
    return Handler(application, request)


def mock_connection():
    class Connection:  # what tornado's handler asks of a connection it has not written to
        context = type("Context", (), {"remote_ip": "127.0.0.1", "protocol": "http", "address": ("127.0.0.1", 1)})()

        def set_close_callback(self, callback):
            pass

    return Connection()


def test_a_request_s_lane_is_its_address_and_a_credential_a_forger_cannot_take():
    cookie = web.create_signed_value("s" * 32, "jupyterhub-hub-login", "cookie-id-of-alice").decode()
    forged = web.create_signed_value("not the hub's", "jupyterhub-hub-login", "cookie-id-of-alice").decode()
    proxied = {"X-Forwarded-For": "203.0.113.9, 10.0.0.7"}  # the proxy appends the address it saw last
    assert lane(handler_for({**proxied, "Cookie": f"jupyterhub-hub-login={cookie}"})) == \
        ("10.0.0.7", "cookie cookie-id-of-alice")
    assert lane(handler_for({**proxied, "Cookie": f"jupyterhub-hub-login={forged}"})) == ("10.0.0.7", "")
    address, credential = lane(handler_for({**proxied, "Authorization": "token abc"}))
    assert address == "10.0.0.7" and credential.startswith("token ") and "abc" not in credential
    assert lane(handler_for({"Authorization": "bearer abc"})) == ("127.0.0.1", credential)  # the connection's own
    assert lane(handler_for({})) == ("127.0.0.1", "")
