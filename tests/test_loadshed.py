"""An overloaded hub sheds reads that can wait (polling, page views) with 429, Retry-After and a
sentence, never what keeps a session alive, and serves everything again once the load is gone.

Real hub, real proxy, real Slurm; the overload is dozens of clients asking for a user model as
fast as they can, as scripts and dashboards do."""

import asyncio
import json
import threading
import time
from typing import NamedTuple
from urllib.parse import urlparse

import pytest
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from conftest import login, wait_no_jobs
from portal.hub.loadshed import LoopLag, Sheddable

LIFELINES = [
    ("POST", "/hub/api/batchspawner"),  # a session's port report
    ("POST", "/hub/api/users/alice/activity"),
    ("POST", "/hub/api/users/alice/server"),  # a start ...
    ("POST", "/hub/api/users/alice/servers/prep"),
    ("DELETE", "/hub/api/users/alice/server"),  # ... a stop
    ("GET", "/hub/api/users/alice/server/progress"),  # ... and its progress
    ("GET", "/hub/api/users/alice/servers/prep/progress"),
    ("GET", "/hub/spawn-pending/alice"),
    ("POST", "/hub/spawn"),
    ("GET", "/hub/api/user"),  # a session checking a browser's token
    ("POST", "/hub/api/oauth2/token"),
    ("GET", "/hub/api/oauth2/authorize"),
    ("GET", "/hub/login"),
    ("POST", "/hub/login"),
    ("GET", "/hub/user/alice/lab"),
    ("GET", "/hub/static/css/style.min.css"),
    ("GET", "/hub/health"),
    ("GET", "/hub/api/"),
]
CAN_WAIT = [
    ("GET", "/hub/api/users/alice"), ("GET", "/hub/api/users"), ("HEAD", "/hub/api/users/alice/"),
    ("GET", "/hub/api/groups"), ("GET", "/hub/api/info"), ("GET", "/hub/home"), ("GET", "/hub/admin"),
    ("GET", "/hub/token"), ("GET", "/hub/spawn"), ("GET", "/hub/spawn/alice/prep"), ("GET", "/hub/metrics"),
]


class Overloaded(LoopLag):
    overloaded = True


def request(method: str, path: str) -> HTTPServerRequest:
    return HTTPServerRequest(headers=HTTPHeaders({"Host": "127.0.0.1:8000"}), start_line=RequestStartLine(method, path, "HTTP/1.1"))


@pytest.mark.parametrize("method,path", LIFELINES)
@pytest.mark.quick
def test_what_keeps_a_session_alive_is_never_shed(method, path):
    assert Sheddable(Overloaded(), "/hub/").match(request(method, path)) is None


@pytest.mark.parametrize("method,path", CAN_WAIT)
@pytest.mark.quick
def test_reads_that_can_wait_are_shed_only_while_the_hub_lags(method, path):
    assert Sheddable(Overloaded(), "/hub/").match(request(method, path)) == {}
    assert Sheddable(LoopLag(), "/hub/").match(request(method, path)) is None


@pytest.mark.quick
def test_one_long_step_of_the_loop_sheds_nothing_a_loop_that_keeps_lagging_does():
    """A single late timer is one long step (JupyterHub's sweep of every user's activity): the loop keeps time
    right after, and nothing is shed. Late timers in a row are an overload: shed until the loop has kept time
    for a second."""
    lag, now = LoopLag(threshold=0.2, hold=1.0), time.monotonic()
    lag.observe(0.6, now)  # one step of 0.6 s
    lag.observe(0.0, now + 0.05)
    assert not lag.overloaded
    lag.observe(0.3, now + 0.4)
    assert not lag.overloaded  # a late timer after one on time: a second step, not yet an overload
    lag.observe(0.3, now + 0.75)
    assert lag.overloaded and lag.retry_after() == 2
    assert Sheddable(lag, "/hub/").match(request("GET", "/hub/home")) == {}


def shed_early(config):
    config["hub"]["shed_after_lag"] = 0.05


class Answer(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes


async def _ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> Answer:
    writer.write(request)
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readuntil(b"\r\n")
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Answer(int(head[0].split()[1]), headers, body)


def flood(base: str, path: str, token: str, clients: int, stop: threading.Event, answers: list[Answer]) -> None:
    """``clients`` scripts asking for ``path`` as fast as the hub answers, over kept-alive connections, until
    ``stop`` (at most 90 s). Raw asyncio: the client costs a few microseconds a request, so on a 2-core machine
    the hub's loop is what runs out, not the load's own threads (threads of requests.Session, held back by the
    GIL, asked so slowly that a hub without long garbage-collection pauses served them without lagging)."""
    url = urlparse(base)
    request = (f"GET {path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: token {token}\r\n"
               f"Connection: keep-alive\r\n\r\n").encode()
    deadline = time.monotonic() + 90

    async def client() -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                reader, writer = await asyncio.open_connection(url.hostname, url.port)
            except OSError:
                await asyncio.sleep(0.1)
                continue
            try:
                while not stop.is_set() and time.monotonic() < deadline:
                    answers.append(await asyncio.wait_for(_ask(reader, writer, request), 60))
                    if answers[-1].headers.get("connection", "").lower() == "close":
                        break
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
                pass
            finally:
                writer.close()

    async def all_clients() -> None:
        await asyncio.gather(*(client() for _ in range(clients)))

    asyncio.run(all_clients())


def test_a_flood_of_polls_is_shed_in_words_while_a_session_starts_and_the_hub_recovers(second_hub):
    base = second_hub(shed_early)
    alice, bob = login(base, "alice"), login(base, "bob")
    answers: list[Answer] = []
    stop = threading.Event()
    load = threading.Thread(target=flood, args=(base, "/hub/api/users/bob", bob.token, 40, stop, answers))
    load.start()
    try:
        # alice's start, her session's port report and her progress stream go through the flood.
        assert alice.start_server({"profile": "cpu"}).status_code in (201, 202)
        events = alice.progress_events(timeout=120)
        page = bob.web.get(f"{base}/hub/home")  # a page view, shed too while the flood lasts
    finally:
        stop.set()
        load.join()
    assert events and events[-1].get("ready"), events[-3:]

    shed = [a for a in answers if a.status == 429]
    assert shed, f"none of {len(answers)} polls was shed"
    print(f"{len(shed)} of {len(answers)} polls shed")
    assert {a.status for a in answers} <= {200, 429}, {a.status for a in answers}
    said = json.loads(shed[0].body)["message"]
    assert said.startswith("The portal is very busy right now") and "Sessions starting or running are not " \
        "affected" in said, said
    assert 2 <= int(shed[0].headers["retry-after"]) <= 30, shed[0].headers
    if page.status_code == 429:
        assert "This page reloads by itself" in page.text and 'http-equiv="refresh"' in page.text, page.text

    # The flood is over: the hub serves polls again, and remembers nothing of it.
    for _ in range(40):
        again = bob.api("GET", "/hub/api/users/bob")
        if again.status_code == 200:
            break
        time.sleep(0.5)
    assert again.status_code == 200, again.text
    assert alice.run_code("print(6 * 7)").strip() == "42"  # her session came through the flood whole
    alice.stop_server()
    wait_no_jobs("alice")
