"""Issue 46: every field a user sends is judged, and its length bounded, before anything is stored or
submitted. A field of 64 KB or 1 MB in a spawn request (the spawn form; the REST API's start, and its
PUT and PATCH of a named session) is refused with HTTP 400 naming the field and how long it may be,
on the demo's hub (MariaDB) and on a hub on PostgreSQL: no Slurm job, the options in the hub's database
unchanged. So is one in a job request to the job launcher of a running session: no job."""

from __future__ import annotations

import html
import itertools
import json

import pytest
import requests
from sqlalchemy import text

from conftest import CONFIG, HUB, login, stop_and_wait
from hubclient import active_jobs
from portal.core import hubdatabase, settings as settings_module
from portal.core.rules import MAX_CODE, REQUEST_FIELDS
from test_database_postgres import hub_database, postgres  # noqa: F401 (fixtures: a database of the test's own)
from test_jobs import jobs_api
from test_profiles import only_job, scontrol
from test_walltime import at_service

SIZES = {"64 KB": 64 * 1024, "1 MB": 1024 * 1024}
# The spawn form's and the REST API's options, and a key that is neither (a partition is chosen by profile).
SPAWN_FIELDS = ("profile", "gpus", "walltime", "mail", "partition")
FORM_FIELDS = {"gpus": "gpus.cpu", "walltime": "walltime.cpu"}  # the cpu profile's own fields of the form
KEPT, NEW = "kept", "new"  # a stopped named session of hers, and one she has not made


def stored_options(db_url: str, password_file, user: str) -> dict[str, dict]:
    """The user_options the hub's database holds for each of the user's sessions."""
    engine = hubdatabase.connect(settings_module.database_url(db_url), password_file)
    try:
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT spawners.name, spawners.user_options FROM spawners JOIN users "
                                           "ON users.id = spawners.user_id WHERE users.name = :user"), {"user": user})
            return {name: json.loads(options or "null") for name, options in rows}
    finally:
        engine.dispose()


@pytest.fixture(params=["MariaDB", "PostgreSQL"])
def hub(request, portal, admin):
    """(the hub's URL, its database URL, the database's password file): the demo's hub on MariaDB, or a
    hub of the test's own on PostgreSQL."""
    if request.param == "MariaDB":
        demo = settings_module.load(CONFIG).hub
        yield HUB, demo.db_url, demo.db_password_file
        stop_and_wait(admin, "alice")  # should a refused start have started after all
        return
    url, secret = request.getfixturevalue("hub_database")
    start = request.getfixturevalue("second_hub")
    yield start(lambda config: config["hub"].update(db_url=url, db_password_file=str(secret))), url, secret


def spawn_requests(user, field: str, value) -> dict:
    """Each way a spawn request carries the field: name -> send it."""
    options = {"profile": "cpu", field: value}
    form = {"_xsrf": user.web.cookies.get("_xsrf"), "profile": "cpu", FORM_FIELDS.get(field, field): value}
    return {
        "start": lambda: user.start_server(options),
        "start of a named session": lambda: user.api("POST", user.server_api(NEW), json={"user_options": options}),
        "named session made": lambda: user.api("PUT", user.server_api(NEW), json={"user_options": options}),
        "stopped session's options": lambda: user.api("PATCH", user.server_api(KEPT), json={"user_options": options}),
        "spawn form": lambda: user.web.post(f"{user.base}/hub/spawn", data=form),
    }


def message_of(response) -> str:
    if response.headers.get("Content-Type", "").startswith("application/json"):
        return response.json()["message"]
    return html.unescape(response.text)  # the spawn form, back with the message


def test_an_oversized_spawn_field_is_refused_in_words_and_nothing_is_stored(hub):
    base, db_url, password_file = hub
    alice = login(base, "alice")
    made = alice.api("PUT", alice.server_api(KEPT), json={"user_options": {"profile": "cpu"}})
    assert made.status_code in (201, 409), made.text  # 409: kept from an earlier run
    try:
        before = stored_options(db_url, password_file, "alice")
        assert KEPT in before, before  # read from the hub's own database
        jobs_before = {job["job_id"] for job in active_jobs("alice")}
        for field, size in itertools.product(SPAWN_FIELDS, SIZES.values()):
            for way, send in spawn_requests(alice, field, "7" * size).items():
                response = send()
                assert response.status_code == 400, (field, size, way, response.status_code, response.text[:300])
                told = message_of(response)  # the field, and how long it may be (or that it is no option)
                assert field in told and ("at most 256 are allowed" in told or "unknown option(s)" in told), (
                    field, size, way, told[-500:])
        assert {job["job_id"] for job in active_jobs("alice")} == jobs_before, "a refused request reached Slurm"
        assert stored_options(db_url, password_file, "alice") == before
        assert alice.api("GET", alice.server_api(NEW)).status_code == 404
        # A request of the right size is still taken.
        edited = alice.api("PATCH", alice.server_api(KEPT), json={"user_options": {"profile": "cpu", "gpus": 0}})
        assert edited.status_code == 200, edited.text
    finally:
        alice.api("DELETE", alice.server_api(KEPT), json={"remove": True})


def oversized(field: str, size: int):
    """A value of the field's own shape, too long: args a list and env an object, holding the long text;
    code is Python source, and may be longer than the other fields (up to MAX_CODE characters)."""
    long = "7" * (max(size, MAX_CODE + 1) if field == "code" else size)
    return [long] if field == "args" else {"BIG": long} if field == "env" else long


def test_an_oversized_job_field_is_refused_in_words_and_submits_nothing(alice):
    alice.spawn({"profile": "cpu"})
    jobs_before = {job["job_id"] for job in active_jobs("alice")}
    for field, size in itertools.product(REQUEST_FIELDS, SIZES.values()):
        request = {"code": "print(1)", "nodes": 1, field: oversized(field, size)}
        if field == "script":
            request.pop("code")
        response = jobs_api(alice, "POST", json=request)
        assert response.status_code == 400, (field, size, response.status_code, response.text[:300])
        message = response.json()["message"]
        assert message.startswith("Your job request was refused: ") and field in message and "at most" in message, (
            field, size, message)
    # A number too long for Python to read is refused in words too, and a job id of as many digits is no job.
    response = jobs_api(alice, "POST", data='{"code": "print(1)", "nodes": ' + "7" * 5000 + "}")
    assert response.status_code == 400 and "more than 4,300 digits" in response.json()["message"], response.text
    assert jobs_api(alice, "GET", "/" + "7" * 5000).status_code == 404
    assert {job["job_id"] for job in active_jobs("alice")} == jobs_before, "a refused job request reached Slurm"


def test_an_oversized_request_for_more_walltime_is_refused_in_words_and_changes_nothing(alice):
    """Through her session's server (JupyterLab's and her scripts' way) and at dsportal's service (a
    session's way)."""
    alice.spawn({"profile": "cpu", "walltime": "01:00:00"})
    job_id = only_job("alice")["job_id"]
    for size in SIZES.values():
        long = "7" * size
        at_session = alice.api("POST", "/user/alice/dsportal/api/extend", json={"minutes": long})
        assert at_session.status_code == 400, at_session.text[:300]
        assert at_session.json()["message"] == "expected {'minutes': <1-1440>}, not text"
        try:  # past 64 KiB the service reads no more: tornado answers 400 or closes (a session never sends it)
            assert at_service(alice.token, json={"minutes": long}).status_code == 400
        except requests.exceptions.ConnectionError:
            pass
        named = at_service(alice.token, json={"minutes": 5, "server": long[:60000]})
        assert named.status_code == 400
        assert named.json()["message"] == "'server' is a session's name of at most 255 characters, not 60000"
    digits = at_service(alice.token, data='{"minutes": ' + "7" * 5000 + "}")
    assert digits.status_code == 400 and digits.json()["message"].startswith("expected a JSON body"), digits.text
    assert scontrol(job_id)["TimeLimit"] == "01:00:00"
