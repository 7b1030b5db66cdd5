"""A hub for a whole department (issue 33): starts beyond hub.concurrent_spawn_limit are refused in
words (HTTP 429: how many start, that nothing was submitted, when to retry), from the form and the
REST API alike, and go through once the hub has room: nothing is lost. Real hub, real Slurm; a
limit of one session starting at once, held by a session that waits in the queue for GPUs.

(The class of 100, 300 people clicking and 5,000 queued jobs are measured by `make bench`, not here.)"""

import html
import re

import pytest

from conftest import login, wait_no_jobs
from hubclient import active_jobs
from portal.slurm.slurmparse import SQUEUE_FIELDS, SlurmError, parse_squeue, queue_places
from test_long_queue import every_gpu_held

SEPARATOR = "\x1f0123456789abcdef\x1f"


def squeue_line(**fields) -> str:
    """One job as the hub's squeue prints it (SQUEUE_FORMAT2: every field followed by the separator)."""
    values = {"JobID": "1", "UserName": "alice", "State": "PENDING", "Reason": "Resources", "Partition": "cpu",
              "PriorityLong": "100", "SubmitTime": "1764150000", "StartTime": "N/A", "TimeLimit": "2:00:00",
              "BatchHost": "n/a", "NodeList": "", "exit_code": "0", "tres-per-node": "N/A", "RestartCnt": "0",
              "Name": "dsportal-alice", "Comment": "dsportal-profile=class", **fields}
    return "".join(values[name] + SEPARATOR for name in SQUEUE_FIELDS) + "\n"


@pytest.mark.quick
def test_the_hubs_squeue_reads_sessions_whole_and_other_jobs_only_for_their_place():
    stranger = ("x\n" + "".join(f"{v}|" for v in ("7", "alice", "RUNNING", "None", "gpu", "1", "1", "1", "8:00:00",
                                                    "evil", "evil", "0:0", "gres:gpu:4", "dsportal-alice", "")))
    out = (squeue_line(JobID="7", Name="dsportal-alice", Comment="dsportal-profile=class")
           + squeue_line(JobID="8", UserName="mallory", Name=stranger, Comment="a\nb", PriorityLong="200")
           + squeue_line(JobID="9", UserName="bob", Name="dsportal-bob:prep", State="RUNNING", Reason="None",
                         StartTime="1764150100", BatchHost="node2", NodeList="node2", TimeLimit="1-00:00:00",
                         exit_code="36608",  # squeue prints the wait status: exit code 143
                         **{"tres-per-node": "gres:gpu:2", "Partition": "gpu"})
           + squeue_line(JobID="10", UserName="member01", Name="held", Reason="JobHeldUser", PriorityLong="0"))
    sessions, others = parse_squeue(out, SEPARATOR)
    assert sorted(sessions) == [7, 9]
    alice, bob = sessions[7], sessions[9]
    assert (alice.user, alice.state, alice.pending, alice.batch_host, alice.profile) == ("alice", "PENDING", True, "",
                                                                                         "class")
    assert (bob.running, bob.batch_host, bob.gpus, bob.time_limit, bob.start_time, bob.exit_code) == (
        True, "node2", 2, 1440, 1764150100, 143)
    # mallory's job, named to look like a line of alice's session, stays one job of hers, not a session.
    assert [o[0] for o in others] == [8, 10]
    # alice's session waits behind mallory's job of higher priority, ahead of the held one.
    assert queue_places(sessions, others) == {7: (2, 3)}
    with pytest.raises(SlurmError):
        parse_squeue(out[:-5], SEPARATOR)  # cut short


def one_start_at_a_time(config):
    config["hub"].update(concurrent_spawn_limit=1, spawn_retry_seconds=[1, 2])


@pytest.mark.quick
def test_sacct_records_are_read_whole_whatever_a_name_or_comment_holds():
    """As sacct -p --delimiter prints them: a forged record in a name's line break stays in the name."""
    from portal.slurm.slurmparse import parse_sacct, sacct_records, sacct_separator

    fields = ("JobID", "User", "JobName", "Comment", "State")
    sep = sacct_separator()
    text = "".join(sep.join(values) + sep + "\n" for values in (
        ("41", "bob", "x\n999|alice|dsportal-alice|dsportal-profile=gpu|COMPLETED", "a|b\nc", "COMPLETED"),
        ("42", "alice", "dsportal-alice", "dsportal-profile=gpu", "CANCELLED by 0"),
        ("43_2", "alice", "nb-x", "", "FAILED")))
    assert [r["JobID"] for r in sacct_records(text, fields, sep)] == ["41", "42"]  # whole jobs only
    assert [r["JobID"] for r in sacct_records(text, fields, sep, whole_jobs=False)] == ["41", "42", "43_2"]
    jobs = parse_sacct(text, fields, sep)
    assert set(jobs) == {41, 42} and jobs[41]["JobName"].startswith("x\n999|alice") and jobs[41]["User"] == "bob"
    assert jobs[42]["State"] == "CANCELLED"
    with pytest.raises(SlurmError, match="sacct's answer could not be read"):
        sacct_records(text + "44" + sep, fields, sep)
    assert sacct_records("", fields, sep) == []


@pytest.mark.quick
def test_a_start_past_the_spawn_limit_speaks_of_sessions_starting_not_of_logins():
    from tornado import web

    from portal.hub.pacing import spawn_limit_words

    refused = web.HTTPError(429, "Too many users trying to log in right now. Try again in 2 minutes.")
    said = spawn_limit_words(100, refused)
    assert said.startswith("100 sessions are starting on the portal right now") and "log in" not in said, said
    assert said.endswith("nothing was submitted to the cluster: please try again in 2 minutes."), said
    refused = web.HTTPError(429, "something else")
    refused.headers = {"Retry-After": 42}
    assert spawn_limit_words(1, refused).endswith("please try again in 42 seconds."), spawn_limit_words(1, refused)


def test_a_start_past_the_spawn_limit_is_told_in_words_to_retry_and_nothing_is_lost(second_hub):
    base = second_hub(one_start_at_a_time)
    alice, bob = login(base, "alice"), login(base, "bob")
    with every_gpu_held("carol"):
        # alice's session waits in Slurm's queue for a GPU: it counts as starting.
        assert alice.start_server({"profile": "gpu", "gpus": 1}).status_code == 202
        assert alice.model()["pending"] == "spawn"

        refused = bob.start_server({"profile": "cpu"})
        assert refused.status_code == 429, refused.text
        assert refused.headers.get("Retry-After") in ("1", "2"), refused.headers
        # The REST API answers in the portal's words (a start, not a login), with JupyterHub's time to retry.
        said = refused.json()["message"]
        assert said == ("1 session is starting on the portal right now (sessions waiting in the cluster's queue "
                        "count too), the most it starts at once. Yours was not started and nothing was submitted "
                        "to the cluster: please try again in 10 seconds."), said

        page = bob.web.post(f"{base}/hub/spawn", data={"_xsrf": bob.web.cookies.get("_xsrf"), "profile": "cpu",
                                                       "gpus.cpu": "0", "walltime.cpu": "02:00:00"},
                            allow_redirects=False)
        assert page.status_code == 429, page.status_code
        text = html.unescape(page.text)
        # The form in the same words, and the form again to press Start once more.
        assert ("1 session is starting on the portal right now" in text and "the most it starts at once" in text
                and "nothing was submitted to the cluster: please try again in 10 seconds." in text), text[-2000:]
        assert page.headers.get("Retry-After") in ("1", "2"), page.headers
        assert 'name="profile"' in text  # the form again, to press Start once more

        # Nothing of bob's reached Slurm or stuck to the hub.
        assert active_jobs("bob") == []
        assert bob.model()["pending"] is None and not bob.model()["servers"]

        # alice gives up waiting: the hub has room again, and bob's retry starts his session.
        alice.stop_server()
    assert wait_no_jobs("alice") == []
    bob.spawn({"profile": "cpu"})
    job = active_jobs("bob")
    assert len(job) == 1 and re.fullmatch(r"dsportal-bob", job[0]["name"]), job
    bob.stop_server()


def test_a_slow_squeue_serves_everyone_who_waited_for_it(portal, tmp_path):
    """A class's port reports each ask for a snapshot taken after they arrived. While slurmctld is slow
    (each squeue longer than the snapshot's cache time), those who came during one squeue share the
    next: a burst costs two squeues, not one each, one after another (on which reports waited minutes)."""
    import asyncio
    import time

    from hubclient import DEMO_SLURM_CONF, SLURM_BIN
    from portal.slurm.slurmclient import Slurm

    slow = tmp_path / "bin"
    slow.mkdir()
    for tool in ("squeue", "sinfo", "scontrol"):
        (slow / tool).write_text(f"#!/bin/sh\nsleep 1.5\nexec {SLURM_BIN}/{tool} \"$@\"\n")
        (slow / tool).chmod(0o755)
    slurm = Slurm(DEMO_SLURM_CONF, slow, cache_seconds=1.0)

    async def burst():
        async def report(delay: float):
            await asyncio.sleep(delay)
            return await slurm.jobs(fresh_after=time.monotonic())

        # 30 reports arriving over 1.2 s, while the first squeue (1.5 s) runs
        return await asyncio.gather(*(report(i * 0.04) for i in range(30)))

    answers = asyncio.run(burst())
    assert all(isinstance(a, dict) for a in answers)
    assert slurm._squeue.calls == 2, slurm._squeue.calls
