"""Slurm accounting (the demo's slurmdbd + MariaDB): usage per user, and final states that outlive
slurmctld's memory (MinJobAge) for the Jobs panel and for the message about an ended session."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from hubclient import active_jobs
from portal.slurm import Slurm
from test_jobs import jobs_api

DSPORTAL = str(Path(sys.executable).parent / "dsportal")
SLURM_CONF = Path("/var/lib/dsportal-demo/slurm/slurm.conf")


def sacct(job_id: int, user: str = "alice") -> dict[str, str]:
    fields = ("JobID", "User", "JobName", "State", "AllocTRES")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # slurmctld hands records to slurmdbd asynchronously
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", str(job_id), "-u", user, "-o", ",".join(fields)],
                             capture_output=True, text=True, check=True).stdout
        record = dict(zip(fields, (out.strip().splitlines() or [""])[-1].split("|")))
        if record.get("State", "").split(" ")[0] not in ("", "RUNNING", "PENDING"):
            return record
        time.sleep(1)
    raise AssertionError(f"sacct has no final record of job {job_id}: {out!r}")


def test_sessions_are_accounted_with_their_gpus_and_reported_per_user(alice):
    alice.spawn({"profile": "gpu", "gpus": "2"})
    job_id = active_jobs("alice")[0]["job_id"]
    time.sleep(2)
    alice.stop_server()
    record = sacct(job_id)
    assert record["User"] == "alice" and record["JobName"] == "dsportal-alice"
    assert record["State"].startswith("CANCELLED"), record
    assert "gres/gpu=2" in record["AllocTRES"], record

    report = subprocess.run([DSPORTAL, "usage", "--days", "1", "--user", "alice"], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    lines = report.stdout.strip().splitlines()
    row = next(line for line in lines if line.split()[:2] == ["alice", "gpu"])
    assert int(row.split()[2]) >= 1, row  # sessions
    assert lines[-1].startswith("usage: ") and "GPU-hours by 1 user(s) in the last 1 day(s)" in lines[-1]
    # Somebody else's usage is not in alice's report.
    assert all(line.split()[0] == "alice" for line in lines[1:-1])


def test_final_states_come_from_accounting_once_slurmctld_forgot_them(alice):
    alice.spawn({"profile": "cpu"})
    job = jobs_api(alice, "POST", json={"code": "print('accounted')", "nodes": 1, "name": "acct"}).json()["job"]
    job_id = int(job["job_id"])
    deadline = time.monotonic() + 120
    while jobs_api(alice, "GET", f"/{job_id}").json()["job"]["state"] not in ("COMPLETED", "FAILED"):
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(1)
    sacct(job_id)
    # As the panel sees it once slurmctld has forgotten the job (MinJobAge) and nobody recorded
    # its end: from accounting, not "UNKNOWN".
    answer = alice.run_code(
        "import json, os\n"
        "from portal import jobs\n"
        f"folder = jobs.jobs_root() / '{job_id}'\n"
        "(folder / 'state.json').unlink(missing_ok=True)\n"
        f"info = jobs.load({job_id}, slurm={{}})\n"
        "print(json.dumps([info.state, info.reason]))")
    assert json.loads(answer) == ["COMPLETED", "from Slurm accounting"], answer

    # The hub's Slurm client, for a session that ended while slurmctld forgot it.
    record = asyncio.run(Slurm(conf=SLURM_CONF).accounting(job_id, "alice"))
    assert record is not None and record.state == "COMPLETED" and record.user == "alice", record
