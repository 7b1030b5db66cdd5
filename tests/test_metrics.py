"""/hub/metrics: the portal's own metrics beside JupyterHub's, read by an admin's token (Prometheus).

Session and capacity gauges come from the hub's shared Slurm snapshots; counters are counted where
things happen. Checked as differences, so earlier tests in the run do not matter.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from conftest import HUB, PASSWORDS
from democluster.base import SLURM_RELEASE
from hubclient import HubUser

SAMPLE = re.compile(r"^(\w+)(\{[^}]*\})? (\S+)$")


def scrape(admin) -> dict[str, float]:
    response = admin.api("GET", "/hub/metrics")
    assert response.status_code == 200, response.text[:300]
    values = {}
    for line in response.text.splitlines():
        match = SAMPLE.match(line)
        if match and match.group(1).startswith("dsportal_"):
            values[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return values


def test_metrics_count_logins_slurm_commands_and_show_sessions_and_capacity(admin, alice):
    before = scrape(admin)
    assert HubUser(HUB, "bob").login("wrong").status_code == 403
    bob = HubUser(HUB, "bob").must_login(PASSWORDS["bob"])
    alice.spawn({"profile": "gpu", "gpus": "2"})
    refused = bob.start_server({"profile": "gpu", "gpus": 3})  # not offered: refused before Slurm
    assert refused.status_code == 400, refused.text
    assert "Free now" in bob.web.get(f"{HUB}/hub/spawn").text  # the form reads the free resources (sinfo)
    after = scrape(admin)
    deadline = time.monotonic() + 15  # the hub's sinfo is at most slurm.resources_interval (10 s) old
    while after.get('dsportal_partition_gpus{kind="free",partition="gpu"}', 8) > 6 and time.monotonic() < deadline:
        time.sleep(1)
        bob.web.get(f"{HUB}/hub/spawn")  # the gauge is the last sinfo's, and a form asks for one once it is 10 s old
        after = scrape(admin)

    def grew(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert grew('dsportal_logins_total{outcome="refused"}') == 1
    assert grew('dsportal_logins_total{outcome="ok"}') >= 1
    assert grew('dsportal_slurm_commands_total{command="sbatch",outcome="ok"}') == 1
    # Her start's port report is judged by Slurm's word on her job alone (squeue --jobs=ID) on every release; her
    # start's checks list every job on 22.05, and look at her job's state on 23.02 on (Slurm.running_job).
    assert grew('dsportal_slurm_commands_total{command="squeue job",outcome="ok"}') >= 1, after
    assert grew('dsportal_slurm_commands_total{command="squeue job",outcome="error"}') == 0, after
    assert SLURM_RELEASE or grew('dsportal_slurm_commands_total{command="squeue",outcome="ok"}') >= 1
    assert after['dsportal_slurm_command_seconds_count{command="sbatch"}'] >= 1
    assert after['dsportal_session_jobs{partition="gpu",state="running"}'] >= 1
    assert after['dsportal_session_gpus{partition="gpu",state="running"}'] >= 2
    assert after['dsportal_partition_gpus{kind="total",partition="gpu"}'] == 8
    assert after['dsportal_partition_gpus{kind="free",partition="gpu"}'] <= 6
    # Per profile: sessions by state, the queue wait of each start, failed starts by reason.
    assert after['dsportal_sessions{profile="gpu",state="running"}'] >= 1
    assert grew('dsportal_spawn_pending_seconds_count{profile="gpu"}') == 1
    assert grew('dsportal_spawn_failures_total{profile="gpu",reason="invalid-request"}') == 1
    # Her running session is checked by a look at the sessions' job states alone where the release can tell them
    # (squeue --only-job-state, 23.02 on: Slurm.running_job), against the real squeue's answer.
    looks = 'dsportal_slurm_commands_total{command="squeue states",outcome="ok"}'
    deadline = time.monotonic() + 15  # the hub checks each session every hub.poll_interval (2 s)
    while SLURM_RELEASE and grew(looks) < 2 and time.monotonic() < deadline:
        time.sleep(1)
        after = scrape(admin)
    assert grew(looks) >= 2 if SLURM_RELEASE else grew(looks) == 0, after
    assert grew('dsportal_slurm_commands_total{command="squeue states",outcome="error"}') == 0
    text = admin.api("GET", "/hub/metrics").text
    assert "# HELP dsportal_gpus_held_idle GPUs of running sessions unused for at least 900 s" in text
    # The garbage collector's collections in the hub (a fresh hub may not have made one yet: test_gcwatch.py).
    assert "# HELP dsportal_gc_collections_total Collections of Python's garbage collector" in text


def test_metrics_need_a_token_with_the_metrics_scope(alice):
    assert alice.api("GET", "/hub/metrics").status_code == 403


@pytest.mark.quick
def test_the_hubs_slurm_client_counts_each_command_by_outcome():
    """ok; error: Slurm refused; unavailable: slurmctld did not answer (counted by the client's own words)."""
    from prometheus_client import REGISTRY

    from portal.hub import metrics
    from portal.slurm.slurmclient import Slurm
    from portal.slurm.slurmparse import SlurmError

    slurm = Slurm()
    metrics.register_slurm(slurm)

    def count(outcome: str) -> float:
        return REGISTRY.get_sample_value("dsportal_slurm_commands_total", {"command": "sh", "outcome": outcome}) or 0

    before = {outcome: count(outcome) for outcome in ("ok", "error", "unavailable")}

    async def commands():
        await slurm.run(["/bin/sh", "-c", "true"])
        for words in ("Invalid account", "Unable to contact slurm controller"):
            with pytest.raises(SlurmError):
                await slurm.run(["/bin/sh", "-c", f"echo '{words}' >&2; exit 1"])

    asyncio.run(commands())
    assert {outcome: count(outcome) - before[outcome] for outcome in before} == {"ok": 1, "error": 1, "unavailable": 1}
    assert REGISTRY.get_sample_value("dsportal_slurm_command_seconds_count", {"command": "sh"}) >= 3
