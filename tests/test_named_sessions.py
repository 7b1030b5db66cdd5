"""Several sessions per user (JupyterHub's named servers): a CPU session preparing data beside a GPU
session training, each its own Slurm job with its own slice, listed on the home page with its slice,
node and time left; each profile caps how many of its sessions one user runs at once; extending,
multi-node jobs, metrics and accounting go by the session. Real hub, real Slurm."""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path

from conftest import HUB
from hubclient import active_jobs
from portal.admin import usage
from test_accounting import sacct
from test_jobs import jobs_api, stream
from test_metrics import scrape
from test_profiles import probe_job_id, scontrol
from test_walltime import at_service

TRAIN = "train"  # alice's named GPU session


def jobs_by_name(user: str) -> dict[str, dict]:
    return {job["name"]: job for job in active_jobs(user)}


def stopped_job_leaves(user: str, job_id: int, timeout: float = 30) -> bool:
    """Once its session's stop returns, the job is at most COMPLETING (Slurm still ending its steps),
    never running; wait, bounded, until Slurm has let it go. (conftest.wait_no_jobs waits for all of
    a user's jobs; her other sessions run on here.)"""
    deadline = time.monotonic() + timeout
    while True:
        state = {job["job_id"]: job["job_state"] for job in active_jobs(user)}.get(job_id)
        assert state in (None, "COMPLETING"), f"job {job_id} still {state} after its session was stopped"
        if state is None or time.monotonic() > deadline:
            return state is None
        time.sleep(0.25)


def environment_of(user, server: str = "") -> dict:
    code = ("import json, os; print(json.dumps({k: os.environ.get(k, '') for k in "
            "('SLURM_JOB_ID', 'CUDA_VISIBLE_DEVICES', 'SLURM_CPUS_ON_NODE', 'JUPYTERHUB_SERVER_NAME')}))")
    return json.loads(alice_said(user.run_code(code, server=server)))


def alice_said(output: str) -> str:
    return output.strip().splitlines()[-1]


def session_rows(page: str) -> dict[str, dict[str, str]]:
    """The home page's sessions table: session name -> its cells (slice, state, node, time left)."""
    rows = {}
    for name, body in re.findall(r'<tr class="home-server-row dsportal-session" data-server-name="([^"]*)">(.*?)</tr>',
                                 page, re.S):
        cells = {key: html.unescape(re.sub(r"<[^>]+>", "", value)).strip()
                 for key, value in re.findall(r'<td class="dsportal-([a-z-]+)">(.*?)</td>', body, re.S)}
        rows[name] = cells
    return rows


def test_a_cpu_session_beside_a_gpu_session_each_its_own_job_and_slice(alice, bob, admin, portal):
    alice.spawn({"profile": "cpu"})
    alice.spawn({"profile": "gpu", "gpus": 1, "walltime": "01:00:00"}, server=TRAIN)

    jobs = jobs_by_name("alice")
    assert sorted(jobs) == ["dsportal-alice", f"dsportal-alice:{TRAIN}"], jobs
    cpu_job, gpu_job = jobs["dsportal-alice"], jobs[f"dsportal-alice:{TRAIN}"]
    assert cpu_job["partition"] == "cpu" and gpu_job["partition"] == "gpu"
    assert scontrol(gpu_job["job_id"])["Comment"] == f"dsportal-profile=gpu,dsportal-session={TRAIN}"
    assert "gres/gpu=1" in scontrol(gpu_job["job_id"])["TRES"]
    assert "gres/gpu" not in scontrol(cpu_job["job_id"])["TRES"]

    # Each session's kernel runs in its own job and sees its own slice only.
    in_cpu, in_gpu = environment_of(alice), environment_of(alice, TRAIN)
    assert in_cpu["SLURM_JOB_ID"] == str(cpu_job["job_id"]) and in_cpu["CUDA_VISIBLE_DEVICES"] in ("", "-1")
    assert in_gpu["SLURM_JOB_ID"] == str(gpu_job["job_id"]) and len(in_gpu["CUDA_VISIBLE_DEVICES"].split(",")) == 1
    assert in_gpu["JUPYTERHUB_SERVER_NAME"] == TRAIN and in_gpu["SLURM_CPUS_ON_NODE"] == "8"
    slice_of = {name: alice.api("GET", f"{alice.server_prefix(name)}/dsportal/api/slice").json() for name in ("", TRAIN)}
    assert (slice_of[""]["job_id"], slice_of[""]["gpus"]) == (cpu_job["job_id"], 0)
    assert (slice_of[TRAIN]["job_id"], slice_of[TRAIN]["gpus"]) == (gpu_job["job_id"], 1)

    # The home page lists both, each with its slice, node and time left.
    rows = session_rows(alice.web.get(f"{HUB}/hub/home").text)
    assert rows[""]["slice"] == "CPU partition: 4 CPUs, 16 GB, 02:00:00 on cpu", rows
    assert rows[TRAIN]["slice"] == "GPU partition: 1 GPU, 8 CPUs, 48 GB, 01:00:00 on gpu", rows
    assert rows[""]["state"] == f"running (job {cpu_job['job_id']})"
    assert rows[TRAIN]["node"] == scontrol(gpu_job["job_id"])["BatchHost"] and rows[TRAIN]["node"]
    assert re.fullmatch(r"(59|60) min|1 h", rows[TRAIN]["time-left"]), rows[TRAIN]
    assert re.fullmatch(r"1 h 5\d min|2 h", rows[""]["time-left"]), rows[""]

    # bob reaches neither of her sessions.
    for path in (f"/user/alice/{TRAIN}/api/status", f"/user/alice/{TRAIN}/dsportal/api/slice",
                 f"/user/alice/{TRAIN}/dsportal/api/usage", f"/user/alice/{TRAIN}/api/kernelspecs"):
        assert bob.api("GET", path, allow_redirects=False).status_code in (302, 403, 404)
    assert bob.api("DELETE", f"/hub/api/users/alice/servers/{TRAIN}").status_code in (403, 404)

    # The metrics count each session's job.
    metrics = scrape(admin)
    assert metrics['dsportal_session_jobs{partition="gpu",state="running"}'] >= 1
    assert metrics['dsportal_session_jobs{partition="cpu",state="running"}'] >= 1

    # A restart of the hub keeps both: each answers again, pinned to its own certificate.
    import democluster as demo

    demo.stop_hub()
    demo.ensure_hub()
    assert sorted(jobs_by_name("alice")) == ["dsportal-alice", f"dsportal-alice:{TRAIN}"]
    assert environment_of(alice, TRAIN)["SLURM_JOB_ID"] == str(gpu_job["job_id"])
    assert environment_of(alice)["SLURM_JOB_ID"] == str(cpu_job["job_id"])

    # Stopping one leaves the other running; the stopped one is accounted as a session of its own.
    alice.stop_server(server=TRAIN)
    assert stopped_job_leaves("alice", gpu_job["job_id"]) and list(jobs_by_name("alice")) == ["dsportal-alice"]
    assert environment_of(alice)["SLURM_JOB_ID"] == str(cpu_job["job_id"])
    record = sacct(gpu_job["job_id"])
    assert record["JobName"] == f"dsportal-alice:{TRAIN}", record
    fields = {name: record.get(name, "") for name in usage.FIELDS}
    fields.update(User="alice", Account="demo", Partition="gpu", ElapsedRaw="1", AllocTRES=record["AllocTRES"])
    counted = usage.summed([fields])[("alice", "demo", "gpu")]
    assert (counted.sessions, counted.jobs) == (1, 0), counted


def test_each_profile_caps_the_sessions_one_user_runs_at_once(alice):
    alice.spawn({"profile": "gpu", "gpus": 1}, server=TRAIN)
    before = probe_job_id()
    refused = alice.start_server({"profile": "gpu", "gpus": 1}, server="second")
    assert refused.status_code == 409, refused.text
    assert refused.json()["message"] == (
        f"You already have 1 session on GPU partition ('{TRAIN}'), the most it allows one user at once. Stop one "
        "of them on your home page, or choose another profile.")
    # Through the form too: it comes back with the message, and nothing reached Slurm.
    form = alice.web.post(f"{HUB}/hub/spawn/alice/second",
                          data={"_xsrf": alice.web.cookies.get("_xsrf"), "profile": "gpu", "gpus.gpu": "1"})
    assert "the most it allows one user at once" in html.unescape(form.text), form.text[-2000:]
    assert probe_job_id() == before + 1, "a session past the profile's limit reached Slurm"
    assert len(active_jobs("alice")) == 1
    # Another profile is still open to her: a CPU session beside it.
    alice.spawn({"profile": "cpu"}, server="prep")
    assert sorted(jobs_by_name("alice")) == ["dsportal-alice:prep", f"dsportal-alice:{TRAIN}"]


def test_extending_a_session_extends_that_session_only(alice):
    alice.spawn({"profile": "cpu", "walltime": "01:00:00"})
    alice.spawn({"profile": "gpu", "gpus": 1, "walltime": "01:00:00"}, server=TRAIN)
    jobs = jobs_by_name("alice")
    default_job, train_job = jobs["dsportal-alice"]["job_id"], jobs[f"dsportal-alice:{TRAIN}"]["job_id"]

    # From the session's JupyterLab (its server asks the hub with the session's own token).
    done = alice.api("POST", f"/user/alice/{TRAIN}/dsportal/api/extend", json={"minutes": 30})
    assert done.status_code == 200, done.text
    assert scontrol(train_job)["TimeLimit"] == "01:30:00" and scontrol(default_job)["TimeLimit"] == "01:00:00"
    # At dsportal's service with her own token, naming the session (as her session's server asks).
    done = at_service(alice.token, json={"minutes": 30, "server": TRAIN})
    assert done.status_code == 200, done.text
    assert scontrol(train_job)["TimeLimit"] == "02:00:00" and scontrol(default_job)["TimeLimit"] == "01:00:00"
    # After a hub restart too (the hub no longer knows which session a token belongs to): the session
    # names itself.
    import democluster as demo

    demo.stop_hub()
    demo.ensure_hub()
    done = alice.api("POST", f"/user/alice/{TRAIN}/dsportal/api/extend", json={"minutes": 30})
    assert done.status_code == 200, done.text
    assert scontrol(train_job)["TimeLimit"] == "02:30:00" and scontrol(default_job)["TimeLimit"] == "01:00:00"
    missing = at_service(alice.token, json={"minutes": 30, "server": "nowhere"})
    assert missing.status_code == 400 and missing.json()["message"] == (
        "You have no running session named 'nowhere' to extend.")
    assert at_service(alice.token, json={"minutes": 30, "server": 7}).status_code == 400


def test_a_multi_node_job_belongs_to_the_session_that_launched_it(alice):
    alice.spawn({"profile": "cpu"})
    alice.spawn({"profile": "gpu", "gpus": 1}, server=TRAIN)
    train_job = jobs_by_name("alice")[f"dsportal-alice:{TRAIN}"]["job_id"]
    launched = jobs_api(alice, "POST", owner=f"alice/{TRAIN}", json={"code": "print('hello from rank')", "nodes": 1})
    assert launched.status_code == 201, launched.text
    job = launched.json()["job"]
    assert (job["session"], job["session_job"]) == (TRAIN, train_job), job
    assert f"dsportal-session-job={train_job}" in scontrol(job["job_id"])["Comment"]
    stream(alice, job["job_id"], owner=f"alice/{TRAIN}")

    listed = {j["job_id"]: j for j in jobs_api(alice, "GET", owner=f"alice/{TRAIN}").json()["jobs"]}
    assert listed[job["job_id"]]["from_this_session"] is True
    elsewhere = {j["job_id"]: j for j in jobs_api(alice, "GET").json()["jobs"]}  # her default session
    assert elsewhere[job["job_id"]]["from_this_session"] is False
    assert elsewhere[job["job_id"]]["session"] == TRAIN


def test_in_the_browser_a_second_session_from_the_home_page(alice):
    """alice has a CPU session; on her home page she names a new one, picks the GPU profile on its
    form, lands in its JupyterLab, and the home page lists both with their slices."""
    from playwright.sync_api import sync_playwright

    from test_browser import ARGS, CHROMIUM, SHOTS, log_in

    alice.spawn({"profile": "cpu"})
    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        log_in(page, to_session=False)
        page.goto(f"{HUB}/hub/home")
        page.fill("#dsportal-new-session-name", TRAIN)
        page.click("#dsportal-new-session")
        page.wait_for_url(f"**/hub/spawn/alice/{TRAIN}", timeout=30_000)
        page.check("#profile-gpu")
        page.select_option("#gpus-gpu", "1")
        page.click("form input[type=submit], form button[type=submit]")
        page.wait_for_url(f"**/user/alice/{TRAIN}/**", timeout=120_000)
        page.wait_for_function("window.dsportalLab && window.dsportalLab.loaded", timeout=90_000)
        page.goto(f"{HUB}/hub/home")
        table = page.locator("#dsportal-sessions")
        table.locator(f'tr[data-server-name="{TRAIN}"] .dsportal-slice', has_text="1 GPU").wait_for(timeout=10_000)
        page.screenshot(path=str(SHOTS / "home-two-sessions.png"))
        text = table.inner_text()
        browser.close()
    assert "CPU partition: 4 CPUs, 16 GB, 02:00:00 on cpu" in text, text
    assert "GPU partition: 1 GPU, 8 CPUs, 48 GB, 08:00:00 on gpu" in text, text
    assert sorted(jobs_by_name("alice")) == ["dsportal-alice", f"dsportal-alice:{TRAIN}"]


def test_refused_linked_and_deleted_sessions_leave_nothing_behind(alice):
    """A refused named start makes no key in the hub's store; a link with options never starts a
    session (a stranger could send it); deleting a named session removes its key and certificate."""
    import yaml

    from conftest import CONFIG
    from spawner.certs import record_name, user_records, user_store_dir

    hub_store = str(Path(yaml.safe_load(CONFIG.read_text())["hub"]["data_dir"]) / "internal-ssl")
    store = Path(user_store_dir(hub_store, "alice"))  # alice's own

    def in_store(server: str) -> bool:
        return record_name("alice", server) in user_records(hub_store, "alice")

    before = probe_job_id()
    refused = alice.start_server({"profile": "gpu", "gpus": 3}, server="refused")
    assert refused.status_code == 400, refused.text
    assert not in_store("refused")
    linked = alice.web.get(f"{HUB}/hub/spawn/alice/linked?profile=cpu")
    assert "A link cannot start a session: check the choices below and press Start." in html.unescape(linked.text)
    assert probe_job_id() == before + 1 and not active_jobs("alice"), "a refused or linked start reached Slurm"
    alice.spawn({"profile": "cpu"}, server="gone")
    assert in_store("gone") and (store / record_name("alice", "gone")).is_dir()
    alice.stop_server(server="gone")
    deleted = alice.api("DELETE", "/hub/api/users/alice/servers/gone", json={"remove": True})
    assert deleted.status_code == 204, deleted.text
    assert not in_store("gone") and not (store / record_name("alice", "gone")).exists()
    assert "gone" not in alice.model()["servers"]
