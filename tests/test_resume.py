"""portal.hub.resume: which sessions dsportal's service starts again after a hub restart, and how it asks.

The hub's side (a queued job kept through the restart, taken over by the new start) is tested against a
Slurm in memory in test_spawner_life.py and on the real demo in test_spawn.py (queued when the hub restarts);
here, the service's reading of the hub's /users answer and its requests, against a recorder of them."""

from __future__ import annotations

import asyncio
import contextlib
import json
from types import SimpleNamespace

import pytest

from portal.hub import resume

pytestmark = pytest.mark.quick

KEPT = {"kept_job": {"job_id": "41", "slice": {"gpus": 1}}}


def users(*servers_by_user: tuple[str, dict]) -> list[dict]:
    return [{"name": name, "servers": servers} for name, servers in servers_by_user]


def test_only_stopped_sessions_with_a_kept_job_are_started_again():
    answer = users(
        ("alice", {"": {"stopped": True, "pending": None, "state": KEPT},  # cut short by the restart
                   "train": {"stopped": False, "pending": None, "state": {"child_state": {"job_id": "7"}}}}),
        ("bob", {"": {"stopped": True, "pending": None, "state": {}}}),  # stopped, nothing kept
        ("carol", {"x y": {"stopped": True, "pending": None, "state": KEPT},
                   "again": {"stopped": False, "pending": "spawn", "state": KEPT}}),  # already being started
    )
    assert resume.kept_in(answer) == [("alice", ""), ("carol", "x y")]
    for odd in (None, {}, [None], [{"name": "dave", "servers": []}], [{"servers": {"": None}}]):
        assert resume.kept_in(odd) == []


class Recorder:
    """The hub's API as the service calls it: /users pages, then the starts."""

    def __init__(self, pages: list[list[dict]], start_code: int = 202):
        self.pages, self.start_code, self.calls = pages, start_code, []

    async def call(self, method, path, body=None, token=""):
        self.calls.append((method, path, body))
        if method == "GET":
            page = self.pages.pop(0) if self.pages else []
            return SimpleNamespace(code=200, body=json.dumps(page).encode(), reason="OK")
        return SimpleNamespace(code=self.start_code, body=b"", reason="Accepted")


def test_the_service_starts_each_kept_session_with_her_stored_options_and_pages_through_the_users():
    first = users(*[(f"user{i:03}", {}) for i in range(resume.PAGE - 1)], ("alice", {"": {"stopped": True, "state": KEPT}}))
    second = users(("bob", {"a/b": {"stopped": True, "state": KEPT}}))
    hub = Recorder([first, second])
    asyncio.run(resume.resume_kept(hub, pauses=(0.01,), pause_most=0.01, resume_for=5))
    assert hub.calls[-1] == ("GET", f"/users?include_stopped_servers=1&offset=0&limit={resume.PAGE}", None)
    assert hub.calls[:-1] == [
        ("GET", f"/users?include_stopped_servers=1&offset=0&limit={resume.PAGE}", None),
        ("GET", f"/users?include_stopped_servers=1&offset={resume.PAGE}&limit={resume.PAGE}", None),
        ("POST", "/users/alice/server", {"user_options": None}),  # None: the options she last chose
        ("POST", "/users/bob/servers/a%2Fb", {"user_options": None}),
    ]


def test_a_start_the_hub_refuses_for_now_is_asked_again_at_the_next_pass_until_none_is_left():
    kept = users(("alice", {"": {"stopped": True, "state": KEPT}}))
    hub = Recorder([kept, kept, kept], start_code=400)  # then none left: the service stops asking
    asyncio.run(resume.resume_kept(hub, pauses=(0.01,), pause_most=0.01, resume_for=5))
    assert [c for c in hub.calls if c[0] == "POST"] == [("POST", "/users/alice/server", {"user_options": None})] * 3
    assert len([c for c in hub.calls if c[0] == "GET"]) == 4


def test_the_service_gives_up_after_its_time_and_says_so(caplog):
    kept = users(("alice", {"": {"stopped": True, "state": KEPT}}))
    hub = Recorder([kept] * 100, start_code=429)
    asyncio.run(resume.resume_kept(hub, pauses=(0.01,), pause_most=0.01, resume_for=0.05))
    assert 2 <= len([c for c in hub.calls if c[0] == "POST"]) < 100
    assert "still not started again after 0 s" in caplog.text


def test_sessions_whose_job_slurm_requeued_are_started_again_as_they_are_found():
    """Where a profile preempts by requeueing, the service keeps looking (every STEADY s, for as long as it runs)
    at the session jobs Slurm restarted, and asks the hub about their users alone: a session kept later (her job
    preempted and put back in the queue) is started again at the next pass."""
    kept = {"name": "alice", "servers": {"": {"stopped": True, "state": KEPT}}}

    class Hub(Recorder):
        async def call(self, method, path, body=None, token=""):
            self.calls.append((method, path, body))
            if method == "GET":
                return SimpleNamespace(code=200, body=json.dumps(kept).encode(), reason="OK")
            return SimpleNamespace(code=202, body=b"", reason="Accepted")

    class Slurm:
        passes = 0

        async def jobs(self):
            self.passes += 1
            requeued = SimpleNamespace(user="alice", restarts=1, pending=True, running=False)
            other = SimpleNamespace(user="bob", restarts=0, pending=False, running=True)
            return {1: other, 2: requeued} if self.passes == 3 else {1: other}

    hub, slurm = Hub([]), Slurm()

    async def for_a_while():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(resume.keep_resuming(hub, slurm, every=0.01), 0.3)

    asyncio.run(for_a_while())
    assert hub.calls == [("GET", "/users/alice?include_stopped_servers=1", None),
                         ("POST", "/users/alice/server", {"user_options": None})]
    assert slurm.passes > 4  # it went on looking
