"""Issue 27, item 11: users see their own jobs only (Slurm's PrivateData), and the portal still
sees what it needs.

While alice has a session, bob asks Slurm as himself, from his shell on the login node, as any user
can: squeue, scontrol and sacct tell him nothing of her job (no id, name, node or user). alice still
sees hers, her session reads its own job and runs multi-node jobs, the spawn form still shows the
free resources, the hub (root) still follows every session and `dsportal usage` (root) reports
everyone.
"""

from __future__ import annotations

import re
import subprocess
import time

from conftest import DSPORTAL, HUB
from hubclient import SLURM_ENV, active_jobs


def as_user(user: str, *argv: str) -> str:
    done = subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, text=True, timeout=120,
                          env=SLURM_ENV)
    return done.stdout + done.stderr


def bobs_own_finished_job(since: str) -> str:
    """A job of bob's that has ended, once accounting (slurmdbd, written a moment later) has it."""
    out = as_user("bob", "sbatch", "--parsable", "--wait", "--partition=cpu", "--mem=100M", "--time=2",
                  "--output=/dev/null", "--chdir=/tmp", "--job-name=bobs-own", "--wrap", "true")
    job_id = out.strip().split(";")[0]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and f"{job_id}|bob|bobs-own" not in bobs_sacct(since):
        time.sleep(0.5)
    return job_id


def bobs_sacct(since: str) -> str:
    """What accounting shows bob of the jobs since ``since``: this test's, not his earlier ones (another
    test's job of his may be named after alice: test_accounting's forged one)."""
    return as_user("bob", "sacct", "-a", "-X", "-n", "-P", "-S", since, "-o", "JobID,User,JobName,NodeList")


def free_gpus_in_form(user) -> int:
    page = user.web.get(f"{HUB}/hub/spawn").text
    found = re.search(r"Free now:\s*<b>(\d+) of 8 GPUs</b>", page)
    assert found, page[-2000:]
    return int(found.group(1))


def test_bob_sees_none_of_alices_jobs_while_the_portal_sees_what_it_needs(alice, bob):
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 2))
    bobs_id = bobs_own_finished_job(since)
    assert bobs_id.isdigit(), bobs_id
    alice.spawn({"profile": "gpu", "gpus": 1})
    job = active_jobs("alice")[0]  # root's squeue: what the hub reads
    alices = {"id": str(job["job_id"]), "name": job["name"], "node": job["nodes"], "user": "alice"}
    print(f"alice's session: {alices}; bob's own job {bobs_id}")

    # bob: not one word of her job, whichever way he asks; his own job he does see.
    bob_sees = {
        "squeue": as_user("bob", "squeue", "-h", "-o", "%i %j %u %N"),
        "squeue all states": as_user("bob", "squeue", "-h", "-t", "all", "-o", "%i %j %u %N"),
        "squeue her id": as_user("bob", "squeue", "-h", "-j", alices["id"], "-o", "%i %j %u %N"),
        "scontrol all": as_user("bob", "scontrol", "show", "job", "-o"),
        "scontrol her id": as_user("bob", "scontrol", "show", "job", "-o", alices["id"]),
        "sacct": bobs_sacct(since),
        "sacct her id": as_user("bob", "sacct", "-a", "-X", "-n", "-P", "-j", alices["id"], "-o", "JobID,User,JobName"),
    }
    for command, out in bob_sees.items():
        words = set(re.split(r"[\s|=(),]+", out))
        assert not {alices["id"], alices["name"], "alice"} & words, (command, out)
        assert f"{alices['id']} " not in out and f"JobId={alices['id']}" not in out, (command, out)
    assert bob_sees["squeue"].strip() == "", bob_sees["squeue"]  # his only job has ended
    assert bobs_id in bob_sees["squeue all states"].split() and f"{bobs_id}|bob|bobs-own" in bob_sees["sacct"]

    # alice sees her own job.
    assert alices["id"] in as_user("alice", "squeue", "-h", "-o", "%i").split()
    assert f"JobId={alices['id']} JobName={alices['name']}" in as_user("alice", "scontrol", "show", "job", "-o",
                                                                       alices["id"])
    assert as_user("alice", "sacct", "-X", "-n", "-P", "-j", alices["id"], "-o", "User").split() == ["alice"]

    # Her session reads its own job as her (the status bar) and runs a job of hers (the Jobs panel).
    found = alice.api("GET", "/user/alice/dsportal/api/slice").json()
    assert found["job_id"] == job["job_id"] and found["node"] == alices["node"] and found["time_left_s"] > 0, found
    launched = alice.api("POST", "/user/alice/dsportal/api/jobs",
                         json={"code": "print('mine')", "nodes": 1, "gpus_per_node": 0, "profile": "cpu"})
    assert launched.status_code == 201, launched.text
    launched_id = launched.json()["job"]["job_id"]
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        state = alice.api("GET", f"/user/alice/dsportal/api/jobs/{launched_id}").json()["job"]["state"]
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            break
        time.sleep(1)
    assert state == "COMPLETED", state
    listed = alice.api("GET", "/user/alice/dsportal/api/jobs").json()["jobs"]
    assert any(j["job_id"] == launched_id and j["state"] == "COMPLETED" for j in listed), listed

    # The spawn form (rendered by the hub from sinfo) still counts her GPU as taken, for bob too.
    deadline = time.monotonic() + 20  # the hub reads sinfo at most every 10 s
    while free_gpus_in_form(bob) > 7 and time.monotonic() < deadline:
        time.sleep(1)
    assert free_gpus_in_form(bob) <= 7

    # The hub (root) follows her session; `dsportal usage` (root) reports every user.
    assert alice.model()["servers"][""]["ready"]
    report = subprocess.run([DSPORTAL, "usage", "--since", "1d"], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    users = {line.split()[0] for line in report.stdout.splitlines()[1:-1] if line.split()}
    assert {"alice", "bob"} <= users, report.stdout
