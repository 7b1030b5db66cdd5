"""Issue 22: a field of the wrong JSON type is refused in words (400), never a 500, and nothing
is submitted: every field of a spawn request, of a job request and of the port report."""

from __future__ import annotations

import pytest

from hubclient import active_jobs

# Where text is expected: each other JSON type; where a number is expected: each non-number.
NOT_TEXT = [["gpu"], {"name": "gpu"}, True, None, 4]
NOT_A_NUMBER = [[1], {"n": 1}, True, None, "two"]

SPAWN_FIELDS = {"profile": NOT_TEXT, "walltime": NOT_TEXT, "gpus": NOT_A_NUMBER}


@pytest.mark.parametrize("field", sorted(SPAWN_FIELDS))
def test_spawn_request_fields_of_the_wrong_type_get_400_with_the_reason(alice, field):
    for value in SPAWN_FIELDS[field]:
        options = {"profile": "gpu", "gpus": 1, field: value}
        response = alice.start_server(options)
        assert response.status_code == 400, (field, value, response.status_code, response.text[:300])
        message = response.json()["message"]
        assert field.rstrip("s") in message.lower() and "must be" in message, (field, value, message)
    assert not active_jobs("alice")
    assert not alice.model()["servers"]


JOB_TEXT_FIELDS = ("script", "code", "image", "walltime", "profile", "name", "launcher")
JOB_NUMBER_FIELDS = ("nodes", "gpus_per_node", "tasks_per_node")


def job_cases():
    for field in JOB_TEXT_FIELDS:
        for value in NOT_TEXT:
            yield field, value
    for field in JOB_NUMBER_FIELDS:
        for value in NOT_A_NUMBER[:-1] + [2.5]:
            yield field, value
    for value in ("--lr 0.1", {"a": 1}, True, None, 3, [1, 2]):
        yield "args", value
    for value in (["A=1"], "A=1", True, None, 3, {"A": [1]}, {"A": True}):
        yield "env", value


def test_job_request_fields_of_the_wrong_type_get_400_with_the_reason(alice):
    alice.spawn({"profile": "cpu"})
    jobs_before = {j["job_id"] for j in active_jobs("alice")}
    for field, value in job_cases():
        request = {"code": "print(1)", "nodes": 1, field: value}
        if field == "script":
            request.pop("code")
        response = alice.api("POST", "/user/alice/dsportal/api/jobs", json=request)
        assert response.status_code == 400, (field, value, response.status_code, response.text[:300])
        message = response.json()["message"]
        assert "refused" in message and (field in message or field == "env"), (field, value, message)
    assert {j["job_id"] for j in active_jobs("alice")} == jobs_before, "a refused request submitted a job"


def test_port_reports_of_the_wrong_type_get_400(alice):
    alice.spawn({"profile": "cpu"})
    for body in ([1234], "1234", 1234, None, {"port": "1234"}, {"port": True}, {"port": None},
                 {"port": [1234]}, {"port": 1234, "job_id": [1]}, {"port": 1234, "job_id": {"id": 1}},
                 {"port": 1234, "job_id": True}):
        response = alice.api("POST", "/hub/api/batchspawner", json=body)
        assert response.status_code == 400, (body, response.status_code, response.text[:300])
        assert "expected {'port'" in response.json()["message"], (body, response.text)
    # A well-formed one from her (not from the job being started) is still refused, as before.
    assert alice.api("POST", "/hub/api/batchspawner", json={"port": 1234, "job_id": "1"}).status_code == 409
    assert alice.api("GET", "/user/alice/api/status").status_code == 200


# Issue 27: digits other than 0-9 pass str.isdigit() ('²', superscript two, then fails int(): a
# 500) or are read by int() ('٢', Arabic-Indic two, taken as 2). Refused in words, nothing submitted.
NOT_ASCII_DIGITS = ["²", "٢", "１", "2²"]


def test_spawn_requests_with_digits_other_than_0_to_9_get_400(alice):
    cases = [("gpus", value) for value in NOT_ASCII_DIGITS] + [("walltime", "٠١:٠٠:٠٠"), ("walltime", "01:٠٠:00")]
    for field, value in cases:
        response = alice.start_server({"profile": "gpu", "gpus": 1, field: value})
        assert response.status_code == 400, (field, value, response.status_code, response.text[:300])
        message = response.json()["message"]
        assert ("whole number (digits 0-9)" if field == "gpus" else "is not a walltime") in message, message
    assert not active_jobs("alice")
    assert not alice.model()["servers"]


def test_job_requests_with_digits_other_than_0_to_9_get_400(alice):
    alice.spawn({"profile": "cpu"})
    jobs_before = {j["job_id"] for j in active_jobs("alice")}
    cases = [(field, value) for field in JOB_NUMBER_FIELDS for value in NOT_ASCII_DIGITS]
    for field, value in cases + [("walltime", "٠٠:١٠:٠٠")]:
        response = alice.api("POST", "/user/alice/dsportal/api/jobs", json={"code": "print(1)", "nodes": 1, field: value})
        assert response.status_code == 400, (field, value, response.status_code, response.text[:300])
        message = response.json()["message"]
        assert "refused" in message and field in message, (field, value, message)
    assert {j["job_id"] for j in active_jobs("alice")} == jobs_before, "a refused request submitted a job"
