"""Slices and partition profiles: the form, server-side validation, exact Slurm slices, pending progress."""

import asyncio
import json
import re
import subprocess
import time

from conftest import HUB, wait_no_jobs
from hubclient import active_jobs, scontrol_in_22_05


def scontrol(job_id: int) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True, text=True,
                         check=True).stdout
    return scontrol_in_22_05(dict(re.findall(r"(\S+?)=(\S*)", out)))


def probe_job_id() -> int:
    """Submit a no-op job as root: the id Slurm hands out shows whether anything was submitted meanwhile."""
    out = subprocess.run(["sbatch", "--parsable", "-p", "cpu", "-c", "1", "--mem=10M", "-t", "1",
                          "-o", "/dev/null", "--wrap", "true"], capture_output=True, text=True, check=True).stdout
    return int(out.strip().split(";")[0])


def only_job(user: str) -> dict:
    jobs = active_jobs(user)
    assert len(jobs) == 1, jobs
    return jobs[0]


def test_spawn_form_lists_the_users_profiles_with_live_resources(alice, carol):
    page = alice.web.get(f"{HUB}/hub/spawn")
    assert page.status_code == 200
    assert 'name="profile" id="profile-gpu" value="gpu"' in page.text
    assert 'value="cpu"' in page.text
    assert 'value="staff"' not in page.text  # alice is not in instructors/portaladmins
    assert re.search(r"Free now:\s*<b>\d+ of 8 GPUs</b>", page.text)
    assert 'name="gpus.gpu"' in page.text and 'data-cpus-per-gpu="8"' in page.text
    # carol (instructors) sees the staff profile too
    assert 'value="staff"' in carol.web.get(f"{HUB}/hub/spawn").text


def test_two_gpu_session_from_the_form_gets_the_exact_slice(alice):
    response = alice.web.post(f"{HUB}/hub/spawn", data={
        "_xsrf": alice.web.cookies.get("_xsrf"), "profile": "gpu", "gpus.gpu": "2", "walltime.gpu": "08:00:00",
        "gpus.cpu": "0", "walltime.cpu": "02:00:00"}, allow_redirects=False)
    assert response.status_code == 302, response.text[-2000:]
    alice.wait_ready()
    job = scontrol(only_job("alice")["job_id"])
    assert job["TresPerNode"] == "gres:gpu:2"
    assert job["NumCPUs"] == "16"
    assert job["MinMemoryNode"] == "96G"
    assert job["TimeLimit"] == "08:00:00"
    assert job["Partition"] == "gpu" and job["NumNodes"] == "1"
    devices = alice.run_code("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").strip()
    assert len(devices.split(",")) == 2, devices


def test_gpu_less_session_on_the_cpu_partition(alice):
    alice.spawn({"profile": "cpu"})
    job = scontrol(only_job("alice")["job_id"])
    assert job["Partition"] == "cpu"
    assert job["NumCPUs"] == "4"
    assert job["MinMemoryNode"] == "16G"
    assert job["TimeLimit"] == "02:00:00"
    assert "gpu" not in job.get("TresPerNode", "")


def _read_progress_until(user, predicate, timeout=60):
    events = []
    deadline = time.monotonic() + timeout
    with user.api("GET", f"/hub/api/users/{user.name}/server/progress", stream=True) as response:
        for line in response.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                events.append(json.loads(line[5:]))
                if predicate(events[-1]) or events[-1].get("failed") or events[-1].get("ready"):
                    break
            if time.monotonic() > deadline:
                break
    return events


def test_full_nodes_then_a_third_request_waits_with_slurms_reason(alice, bob, carol):
    alice.spawn({"profile": "gpu", "gpus": 4})
    bob.spawn({"profile": "gpu", "gpus": 4})
    alice_job, bob_job = scontrol(only_job("alice")["job_id"]), scontrol(only_job("bob")["job_id"])
    assert {alice_job["NodeList"], bob_job["NodeList"]} == {"node1", "node2"}
    assert alice_job["NumCPUs"] == bob_job["NumCPUs"] == "32"
    assert alice_job["MinMemoryNode"] == "192G"

    response = carol.start_server({"profile": "gpu", "gpus": 4})
    assert response.status_code == 202, response.text
    events = _read_progress_until(carol, lambda e: "Resources" in e.get("message", ""))
    messages = [e.get("message", "") for e in events]
    assert any(re.search(r"Job \d+ queued on partition gpu, place 1 of 1 in its queue: waiting for Resources", m)
               for m in messages), messages
    assert only_job("carol")["job_state"] == "PENDING"

    # Cancelled while pending (by an operator here): the spawn fails at once, saying so.
    subprocess.run(["scancel", str(only_job("carol")["job_id"])], check=True)
    final = _read_progress_until(carol, lambda e: False)[-1]
    assert final.get("failed"), final
    assert "CANCELLED" in final["message"], final["message"]
    assert carol.model()["servers"] == {}

    # Asked again, then withdrawn by the user: stopping the pending spawn cancels the job.
    # (JupyterHub 6 answers 201 to a re-spawn after a failed one; the model says what it is.)
    assert carol.start_server({"profile": "gpu", "gpus": 4}).status_code in (201, 202)
    assert carol.model()["pending"] == "spawn"
    _read_progress_until(carol, lambda e: "Resources" in e.get("message", ""))
    carol.stop_server()
    assert wait_no_jobs("carol") == []


BAD_REQUESTS = [
    ({"profile": "nosuch"}, "unknown partition profile"),
    ({"profile": "staff"}, "reserved for members of instructors, portaladmins"),
    ({"gpus": 3}, "3 GPUs is not offered"),
    ({"gpus": 8}, "8 GPUs is not offered"),
    ({"gpus": -1}, "-1 GPUs is not offered"),
    ({"gpus": "two"}, "must be a whole number"),
    ({"gpus": 1.5}, "must be a whole number"),
    ({"walltime": "13:00:00"}, "longer than the 12:00:00 allowed"),
    ({"walltime": "8 hours"}, "is not a walltime"),
    ({"walltime": "-1:00:00"}, "is not a walltime"),
    ({"walltime": 3600}, "walltime must be text"),
    ({"profile": "gpu\n#SBATCH --uid=0"}, "unknown partition profile"),
    ({"walltime": "08:00:00\n#SBATCH --uid=0"}, "is not a walltime"),
    ({"gpus": "1; touch /var/tmp/dsportal-pwned"}, "must be a whole number"),
    ({"walltime": "$(touch /var/tmp/dsportal-pwned)"}, "is not a walltime"),
    ({"partition": "gpu", "extra_sbatch": "--uid=0"}, "unknown option(s)"),
]


def test_bad_requests_are_refused_and_submit_nothing(alice):
    alice.spawn({"profile": "gpu", "gpus": 2})  # her last accepted request: the default of a plain start
    alice.stop_server()
    assert wait_no_jobs("alice") == []
    before = probe_job_id()
    for options, expected in BAD_REQUESTS:
        response = alice.start_server(options)
        assert response.status_code == 400, (options, response.status_code, response.text)
        message = response.json()["message"]
        assert expected in message, (options, message)
        model = alice.model()
        assert model["servers"] == {} and model["pending"] is None, (options, model)

    # The form refuses the same way and shows the reason on the page.
    for form, expected in (({"profile": "gpu", "gpus.gpu": "3"}, "3 GPUs is not offered"),
                           ({"profile": "gpu", "walltime.gpu": "99:00:00"}, "longer than the 12:00:00"),
                           ({"profile": "staff", "gpus.staff": "1"}, "reserved for members"),
                           ({"profile": "gpu", "gpus.gpu": "1", "walltime.gpu": "1:00:00;id"}, "is not a walltime")):
        page = alice.web.post(f"{HUB}/hub/spawn", data={"_xsrf": alice.web.cookies.get("_xsrf"), **form},
                              allow_redirects=False)
        assert page.status_code == 400, (form, page.status_code)
        assert expected in page.text, form
        assert 'name="profile"' in page.text  # the form is shown again

    assert probe_job_id() == before + 1, "a refused request reached Slurm"
    assert active_jobs("alice") == []
    assert not __import__("os").path.exists("/var/tmp/dsportal-pwned")

    # A refused request does not become the default of the next start (JupyterHub keeps the last
    # options for a start without any, and is given a request only once it is judged): a plain start
    # gets her last accepted slice, 2 GPUs, not one of the refused ones.
    alice.spawn()
    job = scontrol(only_job("alice")["job_id"])
    assert (job["Partition"], job["TresPerNode"], job["NumCPUs"]) == ("gpu", "gres:gpu:2", "16")


def test_one_squeue_serves_every_session():
    from hubclient import demo_slurm

    async def many_sessions_polling():
        slurm = demo_slurm(cache_seconds=5)
        await asyncio.gather(*(slurm.job(n) for n in range(200)))
        return slurm.squeue_calls

    assert asyncio.run(many_sessions_polling()) == 1
