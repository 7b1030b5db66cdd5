"""LDAP login -> JupyterLab inside a Slurm job, as the user, reachable only by them."""

import json
import pwd
import re
import subprocess
import time
from pathlib import Path

import requests

from conftest import HUB, wait_no_jobs
from hubclient import active_jobs


def test_session_runs_as_the_user_inside_a_slurm_job(alice):
    # The profile alone: its default slice. (A start with no options at all repeats the user's last
    # options, as JupyterHub does, so an earlier test's 2-GPU start would carry over.)
    alice.spawn({"profile": "gpu"})

    jobs = active_jobs("alice")
    assert len(jobs) == 1, jobs
    job = jobs[0]
    assert job["job_state"] == "RUNNING"
    assert job["name"] == "dsportal-alice"
    assert job["partition"] == "gpu"

    seen = json.loads(alice.run_code(
        "import os, json; print(json.dumps({'uid': os.getuid(), 'job': os.environ.get('SLURM_JOB_ID'),"
        " 'gpus': os.environ.get('CUDA_VISIBLE_DEVICES'), 'home': os.path.expanduser('~')}))"
    ))
    assert seen["uid"] == pwd.getpwnam("alice").pw_uid
    assert seen["job"] == str(job["job_id"])
    assert seen["gpus"] is not None and len(seen["gpus"].split(",")) == 1  # the default 1-GPU slice
    assert seen["home"] == "/home/alice"

    # The hub's proxy serves JupyterLab at /user/alice/ to alice's browser session.
    lab = alice.web.get(f"{HUB}/user/alice/lab")
    assert lab.status_code == 200
    assert "JupyterLab" in lab.text


def test_the_hub_the_server_and_its_kernel_collect_garbage_once_started(alice):
    """All three pause Python's cyclic garbage collector while they load (portal.cli's hub command,
    portal.session.singleuser, portal.session.kernelstart): once they serve, it runs again, over
    what they make from then on."""
    import democluster as demo

    hub_log = (demo.paths().log / "hub.log").read_text()
    hub_set_up = re.findall(r"dsportal: set up; garbage collection on, the (\d+) objects of the start left out", hub_log)
    assert hub_set_up and int(hub_set_up[-1]) > 10_000, hub_log[-3000:]
    alice.spawn({"profile": "gpu"})
    job = active_jobs("alice")[0]["job_id"]
    seen = json.loads(alice.run_code(
        "import gc, json, sys; print(json.dumps({'on': gc.isenabled(), 'frozen': gc.get_freeze_count(),"
        " 'launcher': sys.argv[0],"
        " 'later': sorted(set(sys.modules) & {'tensorboard.notebook', 'portal.upstream.patchcheck'})}))"))
    assert seen["on"] and seen["frozen"] > 10_000, seen
    assert seen["launcher"].endswith("portal/session/kernelstart.py"), seen
    # %tensorboard's module (and the patch checklist) load when the kernel asks for them, the magic's
    # start is the session's own from the moment it loads.
    assert seen["later"] == [], seen
    assert alice.run_code("import tensorboard.notebook as n; print(n.start.__module__)").strip() == "portal.session.job.magics"
    log = Path(pwd.getpwnam("alice").pw_dir, ".dsportal/logs", f"session-{job}.log").read_text()
    # (the count of what was frozen is not logged: counting walks every object, at every start)
    assert "dsportal: serving; garbage collection on, the objects of the start left out of it" in log, log[-3000:]


def test_stopping_the_server_ends_the_job(alice):
    alice.spawn()
    assert len(active_jobs("alice")) == 1
    alice.stop_server()
    assert wait_no_jobs("alice") == []


def test_other_users_and_anonymous_clients_cannot_reach_a_session(alice, bob):
    alice.spawn()

    # bob, logged in, is refused by alice's server (after the OAuth round trip through the hub).
    response = bob.web.get(f"{HUB}/user/alice/lab")
    assert response.status_code == 403, (response.status_code, response.url)
    assert bob.api("GET", "/user/alice/api/status").status_code == 403
    assert bob.api("POST", "/user/alice/api/kernels", json={"name": "python3"}).status_code == 403

    # Nobody logged in: sent to the login page (at the hub's own host), API refused (at alice's
    # server's own origin, where hub.subdomain_host puts it).
    anonymous = requests.get(f"{HUB}/user/alice/lab")
    assert anonymous.url.startswith(f"{alice.hub_origin}/hub/login"), anonymous.url
    assert requests.get(alice.url("/user/alice/api/status")).status_code == 403
    assert requests.get(alice.url("/user/alice/api/kernels")).status_code == 403


def _session_token(user: str) -> str:
    """The token the hub gave the user's session job (root may read the job's environment)."""
    out = subprocess.run(["pgrep", "-u", user, "-f", "jupyterhub-singleuser"], capture_output=True, text=True)
    for pid in out.stdout.split():
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"JUPYTERHUB_API_TOKEN="):
                return entry.split(b"=", 1)[1].decode()
    raise AssertionError(f"no session process of {user}")


def test_session_token_can_report_a_port_but_not_rewrite_the_spawner(alice):
    alice.spawn()
    token = _session_token("alice")
    headers = {"Authorization": f"token {token}"}
    url = f"{HUB}/hub/api/batchspawner"
    # batchspawner's stock handler would set these attributes on the spawner; ours refuses.
    for body in ({"batch_submit_cmd": "touch /tmp/pwned; sbatch"}, {"port": "22; rm -rf /"}, {"port": 0},
                 {"port": True}):
        response = requests.post(url, headers=headers, json=body)
        assert response.status_code == 400, (body, response.status_code)
    # The session still works after the attempts.
    assert alice.api("GET", "/user/alice/api/status").status_code == 200


def test_hub_api_token_of_another_user_cannot_start_or_stop_alices_server(alice, bob):
    # JupyterHub answers 404 for users one may not see, so as not to reveal who exists.
    assert bob.api("POST", "/hub/api/users/alice/server").status_code in (403, 404)
    alice.spawn()
    assert bob.api("DELETE", "/hub/api/users/alice/server").status_code in (403, 404)
    time.sleep(1)
    assert [j["job_state"] for j in active_jobs("alice")] == ["RUNNING"]


def test_hub_restart_keeps_running_sessions(alice, portal):
    import democluster as demo

    alice.spawn()
    before = active_jobs("alice")
    demo.stop_hub()
    demo.ensure_hub()
    after = active_jobs("alice")
    assert [j["job_id"] for j in after] == [j["job_id"] for j in before]
    # The same session answers again through the restarted hub and proxy.
    assert alice.api("GET", "/user/alice/api/status").status_code == 200
    assert "uid" in alice.run_code("print('uid')")


def test_a_session_queued_when_the_hub_restarts_is_resumed_and_starts_when_its_job_runs(alice, bob, portal):
    """JupyterHub stores a spawner's state once its start returns, and cannot go on with a start after a restart:
    the job's id is stored as sbatch returns, the restarted hub keeps the queued job, and dsportal's service starts
    the session again, taking that job over (portal.hub.resume): same job, her place in the queue kept, and it
    serves once it runs (before, the job stayed queued for nobody, and later it was cancelled)."""
    import democluster as demo
    from test_long_queue import every_gpu_held

    with every_gpu_held("bob"):
        assert alice.start_server({"profile": "gpu", "gpus": 1}).status_code == 202
        deadline = time.monotonic() + 60
        while not (queued := [j for j in active_jobs("alice") if j["job_state"] == "PENDING"]):
            assert time.monotonic() < deadline, active_jobs("alice")
            time.sleep(0.5)
        job_id = queued[0]["job_id"]
        demo.stop_hub()
        demo.ensure_hub()
        deadline = time.monotonic() + 60
        while (model := alice.model())["pending"] != "spawn" or not model["servers"]:
            assert time.monotonic() < deadline, model  # started again by the service within a minute
            time.sleep(0.5)
        assert [j["job_id"] for j in active_jobs("alice")] == [job_id]  # the same job, nothing submitted again
        # A stranger who knows her job's id reports a port for it with his own token, while her session is
        # started again and waits for that report: refused, and nothing of her start changes.
        bobs = requests.post(f"{HUB}/hub/api/batchspawner", json={"port": 8888, "job_id": job_id},
                             headers={"Authorization": f"token {bob.token}"}, timeout=30)
        assert bobs.status_code == 403, bobs.text
        assert alice.model()["pending"] == "spawn"
    # The GPUs are free: the kept job runs, and its server is let in with the token it was submitted with.
    alice.wait_ready(timeout=180)
    assert [(j["job_id"], j["job_state"]) for j in active_jobs("alice")] == [(job_id, "RUNNING")]
    assert "uid" in alice.run_code("print('uid')")
    # Her browser logs in to it (the session's OAuth client keeps its scopes through the token's re-use).
    lab = alice.web.get(f"{HUB}/user/alice/lab")
    assert lab.status_code == 200 and lab.url.endswith("/user/alice/lab"), (lab.status_code, lab.url)
    log = (demo.paths().log / "hub.log").read_text().split("JupyterHub is now running")[-1]
    assert f"Session job {job_id} of alice, kept through a hub restart, taken over (PENDING)" in log
    assert "server specified its own API token that's not in the database" not in log
    assert "was waiting in Slurm's queue when the portal restarted" not in alice.web.get(f"{HUB}/hub/home").text


def test_a_session_whose_job_starts_while_the_hub_is_down_is_taken_over_when_it_comes_back(alice, portal):
    """The job runs while the hub is down: its server asks the hub for its port again until the hub answers,
    is told to ask again (503) until the restarted hub has started the session again, and is then let in."""
    import democluster as demo
    from test_long_queue import every_gpu_held

    with every_gpu_held("bob") as holder:
        assert alice.start_server({"profile": "gpu", "gpus": 1}).status_code == 202
        deadline = time.monotonic() + 60
        while not (queued := [j for j in active_jobs("alice") if j["job_state"] == "PENDING"]):
            assert time.monotonic() < deadline, active_jobs("alice")
            time.sleep(0.5)
        job_id = queued[0]["job_id"]
        demo.stop_hub()
        subprocess.run(["scancel", str(holder)], check=True)  # the GPUs come free while the hub is down
        deadline = time.monotonic() + 60
        while [j["job_state"] for j in active_jobs("alice")] != ["RUNNING"]:
            assert time.monotonic() < deadline, active_jobs("alice")
            time.sleep(0.5)
        time.sleep(5)  # its server is up and asking the hub that is not there
        demo.ensure_hub()
    deadline = time.monotonic() + 60
    while "" not in alice.model()["servers"]:  # started again by the service within a minute
        assert time.monotonic() < deadline, alice.model()
        time.sleep(0.5)
    alice.wait_ready(timeout=180)
    assert [(j["job_id"], j["job_state"]) for j in active_jobs("alice")] == [(job_id, "RUNNING")]
    assert "uid" in alice.run_code("print('uid')")
    log = (demo.paths().log / "hub.log").read_text().split("JupyterHub is now running")[-1]
    assert f"Session job {job_id} of alice, kept through a hub restart, taken over (RUNNING)" in log, log[-3000:]


def test_session_that_ended_while_the_hub_was_down_is_seen_from_slurm_at_its_start(alice, portal):
    """JupyterHub alone would wait http_timeout (60 s) for the dead server; Slurm already knows."""
    import democluster as demo

    alice.spawn()
    job_id = active_jobs("alice")[0]["job_id"]
    demo.stop_hub()
    subprocess.run(["scancel", str(job_id)], check=True)
    demo.ensure_hub()
    deadline = time.monotonic() + 120
    while (model := alice.model())["pending"] == "check" and time.monotonic() < deadline:
        time.sleep(0.5)  # the hub checks recorded sessions after it starts listening
    assert not model["servers"] and model["pending"] is None
    log = (demo.paths().log / "hub.log").read_text()
    assert f"Session job {job_id} of alice ended outside the portal" in log
    assert "alice does not appear to be running" not in log.split("JupyterHub is now running")[-1]
    page = alice.web.get(f"{HUB}/hub/home").text
    assert f"Your session job {job_id} was cancelled" in page
