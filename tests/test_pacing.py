"""A burst of new work (logins, tokens, starts) is let through one request per turn of the hub's event
loop, so whatever else arrives meanwhile is served between two of them (portal/hub/pacing.py).

The pacer on a real asyncio loop, and the routes it takes over as JupyterHub builds them; the hub's
own logins, tokens and starts run through it in every cluster test."""

import asyncio
import json

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


def test_behind_one_address_each_login_gets_her_turn_in_round():
    flood = [(f"bob {n}", "login node", "") for n in range(30)]  # a script's token requests: the address's lane
    ran = order_of(Pacer(), flood + [("alice", "login node", "login a"), ("carol", "login node", "login c")])
    assert ran.index("alice") <= 2 and ran.index("carol") <= 4
    # Another address still gets every other turn, however many lanes the first one has.
    logins = [(f"login {n}", "login node", f"login {n}") for n in range(30)]
    ran = order_of(Pacer(), logins + [(f"student {n}", f"10.1.0.{n}", f"login s{n}") for n in range(3)])
    assert max(ran.index(f"student {n}") for n in range(3)) <= 6


def test_a_full_lane_is_told_to_retry_and_no_other_lane_is():
    async def main() -> tuple[list[str], list[str]]:
        pacer, ran, refused = Pacer(most_waiting_per_lane=3), [], []

        async def wait(name: str, address: str, credential: str = "") -> None:
            try:
                await pacer.turn(address, credential)
            except TooManyWaiting as error:
                assert error.status_code == 429 and error.headers["Retry-After"] == "5"
                assert "try again in 5 s" in error.jupyterhub_message
                refused.append(name)
                return
            ran.append(name)

        await asyncio.gather(*(wait(f"bob {n}", "10.0.0.2") for n in range(6)), wait("alice", "10.0.0.3"),
                             wait("carol", "10.0.0.2", "login c"))
        assert pacer.waiting == 0
        return ran, refused

    ran, refused = asyncio.run(main())
    # The first goes at once (nobody waiting), three wait, the next two in that lane are refused; alice (another
    # address) and carol (her own login behind bob's address) are served.
    assert refused == ["bob 4", "bob 5"] and {"alice", "carol"} <= set(ran) and len(ran) == 6


def handler_for(headers: dict[str, str], certificate: dict | None = None) -> web.RequestHandler:
    """A tornado handler as a hub's own, with the hub's cookie name and secret, for a request with these headers
    on a connection that showed this TLS client certificate (as ssl's getpeercert() tells it)."""
    application = web.Application(cookie_secret="s" * 32)

    class Hub:
        cookie_name = "jupyterhub-hub-login"

    class Handler(web.RequestHandler):
        hub, cookie_max_age_days = Hub(), 14

    request = HTTPServerRequest(start_line=RequestStartLine("POST", "/hub/api/users/bob/tokens", "HTTP/1.1"),
                                headers=HTTPHeaders({"Host": "127.0.0.1:8000", **headers}),
                                connection=mock_connection())
    request.get_ssl_certificate = lambda binary_form=False: certificate
    return Handler(application, request)


def mock_connection():
    class Connection:  # what tornado's handler asks of a connection it has not written to
        context = type("Context", (), {"remote_ip": "127.0.0.1", "protocol": "http", "address": ("127.0.0.1", 1)})()

        def set_close_callback(self, callback):
            pass

    return Connection()


def test_a_request_s_lane_is_an_address_and_a_login_nobody_can_make_up():
    cookie = web.create_signed_value("s" * 32, "jupyterhub-hub-login", "cookie-id-of-alice").decode()
    forged = web.create_signed_value("not the hub's", "jupyterhub-hub-login", "cookie-id-of-alice").decode()
    proxied = {"X-Forwarded-For": "203.0.113.9, 10.0.0.7"}  # the proxy appends the address it saw last
    # Through the proxy (its certificate): the address it appended; a login's own lane where the cookie is the hub's.
    assert lane(handler_for({**proxied, "Cookie": f"jupyterhub-hub-login={cookie}"}, PROXY)) == \
        ("10.0.0.7", "login cookie-id-of-alice")
    assert lane(handler_for({**proxied, "Cookie": f"jupyterhub-hub-login={forged}"}, PROXY)) == ("10.0.0.7", "")
    assert lane(handler_for({**proxied, "Authorization": "token made-up"}, PROXY)) == ("10.0.0.7", "")
    # Straight to the hub with a session's certificate: that user, whatever the header says.
    assert lane(handler_for(proxied, SESSION_OF_BOB)) == ("session of bob", "")
    # No certificate (internal_ssl off): the connection's own address; the header could say anything.
    assert lane(handler_for(proxied)) == ("127.0.0.1", "")
    assert lane(handler_for({})) == ("127.0.0.1", "")


PROXY = {"subject": ((("commonName", "proxy-client"),),),
         "subjectAltName": (("IP Address", "127.0.0.1"), ("DNS", "localhost"))}
SESSION_OF_BOB = {"subject": ((("commonName", "bob"),),), "subjectAltName": (("DNS", "bob.users.dsportal.invalid"),)}


def test_a_refused_request_is_answered_429_in_words_by_a_real_server():
    """A full lane's request gets 429, Retry-After and the sentence, as JSON under /api/ and as a page else,
    before the handler's own prepare (JupyterHub's error pages could not be written yet)."""
    from tornado.httpclient import AsyncHTTPClient
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    class Full(Pacer):
        async def turn(self, address: str = "", credential: str = "") -> None:
            raise TooManyWaiting()

    class Hub:
        cookie_name = "jupyterhub-hub-login"

    class Handler(web.RequestHandler):
        hub, cookie_max_age_days = Hub(), 14

        def post(self, *args):
            self.finish("served")

    async def main() -> list:
        app = web.Application([(r"/hub/api/users/bob/tokens", paced(Handler, Full())),
                               (r"/hub/login", paced(Handler, Full()))], cookie_secret="s" * 32)
        sockets = bind_sockets(0, "127.0.0.1")
        server = HTTPServer(app)
        server.add_sockets(sockets)
        port = sockets[0].getsockname()[1]
        client = AsyncHTTPClient()
        answers = [await client.fetch(f"http://127.0.0.1:{port}{path}", method="POST", body="", raise_error=False)
                   for path in ("/hub/api/users/bob/tokens", "/hub/login")]
        server.stop()
        return answers

    api, page = asyncio.run(main())
    for answer in (api, page):
        assert answer.code == 429 and answer.headers["Retry-After"] == "5", answer
    assert json.loads(api.body)["message"].startswith("Too many logins, token requests or session starts")
    assert b"Please try again in 5 s." in page.body and page.headers["Content-Type"].startswith("text/html")
