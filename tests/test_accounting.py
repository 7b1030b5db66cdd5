"""Slurm accounting (the demo's slurmdbd + MariaDB): usage per user, and final states that outlive
slurmctld's memory (MinJobAge) for the Jobs panel and for the message about an ended session."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from hubclient import active_jobs, demo_slurm
from test_jobs import jobs_api

DSPORTAL = str(Path(sys.executable).parent / "dsportal")


def sacct(job_id: int, user: str = "alice") -> dict[str, str]:
    fields = ("JobID", "User", "JobName", "State", "AllocTRES", "Comment")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # slurmctld hands records to slurmdbd asynchronously
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", str(job_id), "-u", user, "-o", ",".join(fields)],
                             capture_output=True, text=True, check=True).stdout
        record = dict(zip(fields, (out.strip().splitlines() or [""])[-1].split("|"), strict=False))
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

    assert record["Comment"] == "dsportal-profile=gpu", record

    report = subprocess.run([DSPORTAL, "usage", "--since", "1d", "--user", "alice"], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    lines = report.stdout.strip().splitlines()
    print(report.stdout)
    assert lines[0].split()[:4] == ["user", "account", "profile", "sessions"], lines[0]
    row = next(line.split() for line in lines if line.split()[:3] == ["alice", "demo", "gpu"])
    # Checked against sacct itself: alice's gpu-profile sessions, GPU-hours and CPU-hours.
    expected = sacct_totals("alice", "demo", "gpu")
    assert int(row[3]) == expected["sessions"] >= 1, (row, expected)
    assert abs(float(row[4]) - expected["session_gpu_h"]) < 0.002, (row, expected)
    assert float(row[4]) > 0 and float(row[7]) > 0, row
    assert lines[-1].startswith("usage: ") and "CPU-hours by 1 user(s) since" in lines[-1], lines[-1]
    # Somebody else's usage is not in alice's report.
    assert all(line.split()[0] == "alice" for line in lines[1:-1])
    # Per profile and per account (course) alone.
    by_profile = subprocess.run([DSPORTAL, "usage", "--since", "1d", "--by", "profile"], capture_output=True, text=True)
    assert by_profile.returncode == 0 and by_profile.stdout.splitlines()[0].split()[:2] == ["profile", "sessions"]
    assert any(line.split()[0] == "gpu" for line in by_profile.stdout.splitlines()[1:-1]), by_profile.stdout
    bad = subprocess.run([DSPORTAL, "usage", "--since", "yesterday"], capture_output=True, text=True)
    assert bad.returncode == 2 and "is not a time like 7d" in bad.stderr, bad.stderr


def sacct_totals(user: str, account: str, profile: str) -> dict:
    fields = ("JobID", "JobName", "Account", "Comment", "ElapsedRaw", "AllocTRES")
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 86400))
    end = "\x1fend-of-field\x1f"  # each field ends with it: names and comments may hold line breaks
    out = subprocess.run(["sacct", "-X", "-n", "-p", f"--delimiter={end}", "-u", user, "-S", since, "-E", "now",
                          "-o", ",".join(fields)], capture_output=True, text=True, check=True).stdout
    values = out.split(end)[:-1]
    totals = {"sessions": 0, "session_gpu_h": 0.0}
    for start in range(0, len(values), len(fields)):
        record = dict(zip(fields, values[start:start + len(fields)], strict=True))
        if not record["JobID"].strip().isdigit():
            continue  # an array's tasks
        # A named session's comment adds ",dsportal-session=<name>" after its profile.
        named = re.match(r"dsportal-profile=([^,]+)", record["Comment"])
        if (record["Account"], named and named.group(1)) != (account, profile) or \
                not record["JobName"].startswith("dsportal-"):
            continue
        gpus = next((int(part.split("=")[1]) for part in record["AllocTRES"].split(",") if part.startswith("gres/gpu=")), 0)
        totals["sessions"] += 1
        totals["session_gpu_h"] += gpus * int(record["ElapsedRaw"]) / 3600
    return totals


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
        "from portal.session.job import launcher as jobs\n"
        f"folder = jobs.jobs_root() / '{job_id}'\n"
        "(folder / 'state.json').unlink(missing_ok=True)\n"
        f"info = jobs.load({job_id}, listed={{}})\n"
        "print(json.dumps([info.state, info.reason]))")
    assert json.loads(answer) == ["COMPLETED", "from Slurm accounting"], answer

    # The hub's Slurm client, for a session that ended while slurmctld forgot it.
    record = asyncio.run(demo_slurm().accounting(job_id, "alice"))
    assert record is not None and record.state == "COMPLETED" and record.user == "alice", record


def test_course_qos_allows_two_gpus_per_user_and_refuses_more_in_slurms_words(bob, alice):
    """bob is a student of carol's course: its profile charges the Slurm account intro-dl under the QoS
    course (2 GPUs per user, enforced by Slurm through slurmdbd). Slurm's refusal reaches the spawn page."""
    from conftest import HUB
    from test_profiles import scontrol

    qos = subprocess.run(["sacctmgr", "-n", "-P", "show", "qos", "course", "format=name,maxtrespu,flags"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert qos == ["course|gres/gpu=2|DenyOnLimit"], qos

    # Three GPUs at once: refused at submission; the form comes back with Slurm's words.
    page = bob.web.post(f"{HUB}/hub/spawn", data={"_xsrf": bob.web.cookies.get("_xsrf"), "profile": "course",
                                                  "gpus.course": "3"}, allow_redirects=False)
    assert page.status_code == 400, page.status_code
    text = page.text.replace("&#39;", "'")
    assert "Slurm refused the session job" in text and "Job violates accounting/QOS policy" in text, text[-3000:]
    assert "The limits of the Slurm QoS course do not allow this request" in text
    assert 'name="profile"' in text  # the form again, to ask for less
    assert active_jobs("bob") == []

    # Two GPUs are within the QoS: the session runs, charged to the course's account.
    bob.spawn({"profile": "course", "gpus": 2})
    job = scontrol(active_jobs("bob")[0]["job_id"])
    assert (job["Account"], job["QOS"], job["TresPerNode"]) == ("intro-dl", "course", "gres:gpu:2"), job
    # The course's usage, per account: bob's session is charged to intro-dl.
    time.sleep(2)
    report = subprocess.run([DSPORTAL, "usage", "--since", "1d", "--by", "account,user"], capture_output=True, text=True)
    row = next(line.split() for line in report.stdout.splitlines() if line.split()[:2] == ["intro-dl", "bob"])
    assert int(row[2]) >= 1 and float(row[3]) > 0, report.stdout

    # A third GPU from inside the session (a job under the same QoS) waits, with Slurm's reason.
    third = jobs_api(bob, "POST", json={"code": "print('third')", "nodes": 1, "gpus_per_node": 1, "profile": "course"})
    assert third.status_code == 201, third.text
    third_id = int(third.json()["job"]["job_id"])
    deadline = time.monotonic() + 30
    while (info := jobs_api(bob, "GET", f"/{third_id}").json()["job"])["reason"] != "QOSMaxGRESPerUser":
        assert time.monotonic() < deadline, info
        time.sleep(1)
    assert info["state"] == "PENDING", info
    assert jobs_api(bob, "DELETE", f"/{third_id}").status_code == 202
    # Four GPUs in one job: refused at submission, in Slurm's words plus what to do.
    four = jobs_api(bob, "POST", json={"code": "print(4)", "nodes": 2, "gpus_per_node": 2, "profile": "course"})
    assert four.status_code == 400, four.text
    assert "Job violates accounting/QOS policy" in four.json()["message"], four.text
    assert "ask for fewer GPUs" in four.json()["message"]

    # alice is not in the course: the portal does not offer its profile, and Slurm would refuse her too.
    refused = alice.start_server({"profile": "course", "gpus": 1})
    assert refused.status_code == 400 and "reserved for members" in refused.json()["message"], refused.text
    direct = subprocess.run(["runuser", "-u", "alice", "--", "sbatch", "-p", "gpu", "--account=intro-dl", "--wrap", "true"],
                            capture_output=True, text=True, cwd="/tmp")
    assert direct.returncode != 0 and "Invalid account" in direct.stderr, direct


def test_a_job_named_like_an_accounting_line_adds_no_usage_to_anyone_else(bob):
    """sacct prints a job's name as its user gave it, line breaks included: bob's job named
    "x\\n<id>|dave|dsportal-dave" read, in lines split at '|', as a session of dave's with bob's
    GPUs and time. The admin's report (everyone's jobs) must count it as bob's job alone. (dave, not
    alice: test_visibility checks that bob's jobs never name alice.)"""
    forged = subprocess.run(["runuser", "-u", "bob", "--", "sbatch", "--parsable", "--wait", "-p", "gpu",
                             "--gres=gpu:1", "-t", "1", "-J", "x\n999999|dave|dsportal-dave",
                             "--comment", "dsportal-profile=gpu", "--chdir=/tmp", "--output=/dev/null",
                             "--wrap", "sleep 2"],
                            capture_output=True, text=True, timeout=180)
    assert forged.returncode == 0, forged.stderr
    sacct(int(forged.stdout.strip().split(";")[0]), user="bob")  # in accounting

    def daves_rows(*args: str) -> list[str]:
        report = subprocess.run([DSPORTAL, "usage", "--since", "1d", *args], capture_output=True, text=True)
        assert report.returncode == 0, report.stderr
        return [line for line in report.stdout.splitlines()[1:-1] if line.split()[0] == "dave"]

    assert daves_rows() == daves_rows("--user", "dave")  # everyone's report vs his alone
    everyone = subprocess.run([DSPORTAL, "usage", "--since", "1d"], capture_output=True, text=True).stdout
    assert any(line.split()[0] == "bob" and line.split()[2] == "gpu" for line in everyone.splitlines()), everyone
