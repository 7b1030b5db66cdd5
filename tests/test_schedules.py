"""Issue 50: a notebook run on a schedule, through Slurm's own cron (scrontab).

The schedule's checks and its crontab lines need no cluster; the rest is alice's real session writing
her real Slurm crontab, Slurm firing it, and each firing a notebook job of its own with its executed
notebook, while bob is refused all of it."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import time

import pytest

from test_jobs import _policy
from test_notebook_jobs import TRAIN, notebook, put_notebook, wait_finished


def schedules_api(user, method: str, path: str = "", owner: str | None = None, **kwargs):
    return user.api(method, f"/user/{owner or user.name}/dsportal/api/schedules{path}", **kwargs)


# -- the schedule's checks (no cluster) ------------------------------------------------------------------
@pytest.mark.quick
@pytest.mark.parametrize("when,words,gap", [
    ("0 2 * * *", "every day at 02:00", 1440),
    ("0 2 * * 1", "every Monday at 02:00", 7 * 1440),
    ("0 2 * * 7", "every Sunday at 02:00", 7 * 1440),
    ("@daily", "every day at 00:00", 1440),
    ("15 * * * *", "every hour at :15", 60),
    ("0 6 1 * *", "on day 1 of every month at 06:00", 28 * 1440),
    ("0 9-17 * * 1-5", "at crontab time 0 9-17 * * 1-5", 60),
    ("0 */6 * * *", "at crontab time 0 */6 * * *", 360),
    ("*/20 * * * *", "at crontab time */20 * * * *", 20),
])
def test_a_crontab_time_is_read_in_words_and_its_shortest_gap(when, words, gap):
    from portal.session.job import schedules

    canonical, values = schedules.parse_cron(when)
    assert schedules.describe(canonical) == words
    assert schedules.shortest_gap_minutes(canonical, values) == gap


@pytest.mark.quick
@pytest.mark.parametrize("when,expected", [
    ("*/15 * * * *", "would run every 15 minute(s); this profile allows a run at most every 60 minutes"),
    ("* * * * *", "would run every 1 minute(s)"),
    ("0,30 2 * * *", "would run every 30 minute(s)"),
    ("0 0 30 2 *", "never runs"),
    ("60 * * * *", "outside 0-59"),
    ("0 2 * * 8", "outside 0-7"),
    ("5-1 * * * *", "not a range from low to high"),
    ("*/0 * * * *", "a step (/N) is allowed only as */N"),
    ("*/1 * * * *", "a step (/N) is allowed only as */N"),  # Slurm refuses it
    ("1-59/30 * * * *", "a step (/N) is allowed only as */N"),  # Slurm counts it from 0: {30}, not {1, 31}
    ("0 2 * * */2", "a step (/N) is allowed only as */N"),
    ("0 \u0662 * * *", "is not *, a number"),  # an Arabic-Indic 2: a digit to Python, not to Slurm
    ("0 2 * *", "needs five fields"),
    ("0 2 * * MON", "is not *, a number"),
    ("0 2 * * * ; id", "needs five fields"),
    ("0 2 * * *\n* * * * * id", "needs five fields"),
    ("0 " * 60, "at most 100 are allowed"),
    (7, "must be a crontab time"),
    (None, "must be a crontab time"),
])
def test_a_schedule_more_often_than_the_profile_allows_or_not_a_crontab_time_is_refused(when, expected):
    from portal.core.rules import RequestError
    from portal.session.job import schedules

    with pytest.raises(RequestError) as refused:
        schedules.check_schedule(when, 60)
    assert expected in str(refused.value), str(refused.value)


@pytest.mark.quick
def test_the_next_run_is_the_first_matching_minute_from_now():
    from portal.session.job import schedules

    canonical, values = schedules.parse_cron("0 2 * * 1")
    assert schedules.next_run(canonical, values, dt.datetime(2026, 11, 28, 20, 45)) == dt.datetime(2026, 11, 30, 2, 0)
    canonical, values = schedules.parse_cron("0 0 29 2 *")
    assert schedules.next_run(canonical, values, dt.datetime(2026, 11, 28)) == dt.datetime(2028, 2, 29)


@pytest.mark.quick
def test_only_dsportal_s_own_lines_of_her_crontab_change_and_a_value_cannot_add_a_line():
    from portal.session.job import schedules

    hers = "# my own\nMAILTO=me\n*/5 * * * * /home/alice/bin/check.sh\n"
    schedule = {"id": "0123abcd", "folder": "/home/alice/.dsportal/schedules/0123abcd", "home": "/home/alice",
                "cron": "0 2 * * *", "python": "/opt/dsportal/env/bin/python", "slurm_conf": "/etc/slurm/slurm.conf",
                "profile": {"name": "cpu", "partition": "cpu", "account": "proj1", "qos": None, "reservation": None}}
    outside, blocks = schedules._blocks(hers)
    blocks["0123abcd"] = schedules._block(schedule, paused=False)
    written = schedules._join(outside, blocks)
    assert written.startswith(hers), written
    assert "#SCRON --partition=cpu" in written and "#SCRON --account=proj1" in written
    assert "\n0 2 * * * /usr/bin/env SLURM_CONF=/etc/slurm/slurm.conf /opt/dsportal/env/bin/python -P -m " \
           "portal.session.job.schedules fire /home/alice/.dsportal/schedules/0123abcd\n" in written, written
    # A cluster's Slurm elsewhere than cron's PATH (configless: no slurm.conf): the line names it first.
    elsewhere = schedules._block({**schedule, "slurm_conf": "", "slurm_bin": "/opt/slurm/bin"}, paused=False)
    assert "0 2 * * * /usr/bin/env PATH=/opt/slurm/bin:/usr/local/bin:/usr/bin:/bin /opt/dsportal/env/bin/python -P " \
           "-m portal.session.job.schedules fire /home/alice/.dsportal/schedules/0123abcd" in elsewhere, elsewhere
    assert schedules._block({**schedule, "slurm_bin": "/usr/bin"}, paused=False) == blocks["0123abcd"]
    # Paused: its line commented out; resumed: back; deleted: her own lines as they were.
    outside, blocks = schedules._blocks(written)
    blocks["0123abcd"] = schedules._block(schedule, paused=True)
    paused = schedules._join(outside, blocks)
    assert "\n#dsportal-paused# 0 2 * * * /usr/bin/env" in paused and "\n0 2 * * * /usr" not in paused
    # ... and its options too: Slurm would carry #SCRON lines over comments to the next entry (hers, or another).
    assert "\n#SCRON" not in paused and "\n#dsportal-paused# #SCRON --account=proj1" in paused, paused
    outside, blocks = schedules._blocks(paused)
    assert set(blocks) == {"0123abcd"}
    # Slurm marks a cancelled entry's lines #DISABLED: (and a refused one's #BAD:): still the same block.
    marked = written.replace("\n#SCRON", "\n#DISABLED: #SCRON").replace("\n0 2 * * *", "\n#DISABLED: 0 2 * * *")
    marked = marked.replace("\n# dsportal-schedule 0123abcd end", "\n#DISABLED: # dsportal-schedule 0123abcd end")
    outside, blocks = schedules._blocks(marked)
    assert set(blocks) == {"0123abcd"} and schedules._join(outside, {}) == hers
    blocks.pop("0123abcd")
    assert schedules._join(outside, blocks) == hers
    # Values are quoted for the shell Slurm runs the line with, and a line break cannot pass.
    odd = {**schedule, "folder": "/home/alice/x y;id"}
    line = [entry for entry in schedules._block(odd, paused=False) if entry.startswith("0 2")][0]
    assert "'/home/alice/x y;id'" in line, line


@pytest.mark.quick
def test_a_schedule_request_is_judged_as_its_job_would_be_before_anything_is_written(tmp_path, monkeypatch):
    import nbformat

    from portal.core.rules import RequestError
    from portal.session.job import schedules

    nbformat.write(notebook(TRAIN), str(tmp_path / "train.ipynb"))
    written = []
    monkeypatch.setattr(schedules, "write_crontab", lambda text, home=None: written.append(text))
    monkeypatch.setattr(schedules, "read_crontab", lambda: "")
    policy = _policy(min_schedule_minutes=60, max_schedules=1)
    for request, expected in [
        ({"notebook": "train.ipynb", "schedule": "*/5 * * * *"}, "at most every 60 minutes"),
        ({"notebook": "train.ipynb"}, "must be a crontab time"),
        ({"notebook": "train.ipynb", "schedule": "0 2 * * *", "grid": {"lr": [1, 2]}}, "a grid of parameters cannot"),
        ({"script": "train.ipynb", "schedule": "0 2 * * *"}, "only a notebook runs on a schedule"),
        ({"notebook": "train.ipynb", "schedule": "0 2 * * *", "parameters": {"lr; id": 1}}, "is not a Python name"),
        ({"notebook": "train.ipynb", "schedule": "0 2 * * *", "gpus_per_node": 99}, "more than a node"),
        ("0 2 * * *", "a schedule is a notebook job request"),
    ]:
        with pytest.raises(RequestError) as refused:
            schedules.create(request, policy, str(tmp_path), home=str(tmp_path))
        assert expected in str(refused.value), (request, str(refused.value))
    assert written == [] and schedules.list_schedules(str(tmp_path)) == []
    made = schedules.create({"notebook": "train.ipynb", "schedule": "0 2 * * *", "profile": "gpu", "gpus_per_node": 1},
                            policy, str(tmp_path), home=str(tmp_path))
    assert made["words"] == "every day at 02:00" and (made["runs"], made["last_run"]) == (0, None) and len(written) == 1
    with pytest.raises(RequestError) as refused:  # the profile's max_schedules
        schedules.create({"notebook": "train.ipynb", "schedule": "0 3 * * *"}, policy, str(tmp_path), home=str(tmp_path))
    assert "the most it allows (1): delete one first" in str(refused.value)


@pytest.mark.quick
def test_a_firing_that_submits_nothing_says_why_on_the_schedule_and_the_next_one_clears_it(tmp_path, monkeypatch):
    import nbformat

    from portal.core.rules import RequestError
    from portal.session.job import launcher as jobs, schedules

    nbformat.write(notebook(TRAIN), str(tmp_path / "train.ipynb"))
    monkeypatch.setattr(schedules, "write_crontab", lambda text, home=None: None)
    monkeypatch.setattr(schedules, "read_crontab", lambda: "")
    made = schedules.create({"notebook": "train.ipynb", "schedule": "0 2 * * *", "profile": "gpu", "gpus_per_node": 1},
                            _policy(), str(tmp_path), home=str(tmp_path))
    folder = tmp_path / schedules.SCHEDULES_DIR / made["id"]

    def refused(*args, **kwargs):
        raise RequestError("image ngc is unavailable")
    monkeypatch.setattr(jobs, "submit", refused)
    assert schedules.fire(folder) == 1
    problem = schedules.list_schedules(str(tmp_path))[0]
    assert "the run was not submitted: image ngc is unavailable" in schedules._public(problem)["problem"]

    submitted = []
    monkeypatch.setattr(jobs, "submit", lambda plan, policy, home, shown_as, schedule: (
        submitted.append((plan.name, shown_as, schedule)) or type("Info", (), {"job_id": 42})()))
    assert schedules.fire(folder) == 0
    public = schedules._public(schedules.list_schedules(str(tmp_path))[0])
    assert public["problem"] == "" and (public["runs"], public["last_run"]) == (1, 42)
    assert submitted == [("nb-train", str(tmp_path / "train.ipynb"), made["id"])]  # named after her notebook
    schedules.delete(made["id"], home=str(tmp_path))
    assert not folder.exists() and schedules.fire(folder) == 0  # a run that starts after: nothing to do


@pytest.mark.quick
def test_an_entry_whose_record_is_gone_is_listed_and_deleted_and_hers_stay(tmp_path, monkeypatch):
    from portal.session.job import schedules

    schedule = {"id": "0123abcd", "folder": str(tmp_path / "gone"), "home": str(tmp_path), "cron": "0 2 * * *",
                "python": "/opt/dsportal/env/bin/python", "slurm_conf": "",
                "profile": {"name": "cpu", "partition": "cpu"}}
    crontab = ["# hers\n" + "\n".join(schedules._block(schedule, paused=False)) + "\n"]
    monkeypatch.setattr(schedules, "read_crontab", lambda: crontab[0])
    monkeypatch.setattr(schedules, "write_crontab", lambda text, home=None: crontab.__setitem__(0, text))
    monkeypatch.setattr(schedules, "_in_crontab", {"at": float("-inf"), "ids": set()})
    (tmp_path / schedules.SCHEDULES_DIR).mkdir(parents=True)
    [orphan] = schedules.listed(str(tmp_path))
    assert orphan["id"] == "0123abcd" and "its record in ~/.dsportal/schedules is gone" in orphan["problem"]
    assert schedules.delete("0123abcd", home=str(tmp_path))["deleted"] is True
    assert crontab[0] == "# hers\n"


# -- alice's real session and Slurm's cron ----------------------------------------------------------------
def crontab_of(user: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", "scrontab", "-l"], capture_output=True, text=True)


@pytest.fixture
def no_crontab_left():
    def clear():
        subprocess.run(["runuser", "-u", "alice", "--", "scrontab", "-r"], capture_output=True)
        subprocess.run(["rm", "-rf", "/home/alice/.dsportal/schedules"], check=True)
        # The runs the schedule submitted (one a minute) end here too: they must not hold the nodes for the next test.
        subprocess.run(["runuser", "-u", "alice", "--", "scancel", "--name=nb-train"], capture_output=True)
    clear()
    yield
    clear()  # even if the test failed


def test_a_notebook_runs_on_a_schedule_each_run_a_job_and_bob_touches_none_of_it(alice, bob, no_crontab_left):
    alice.spawn({"profile": "cpu"})
    put_notebook(alice, "nbsched/train.ipynb", TRAIN)
    mine = subprocess.run(["runuser", "-u", "alice", "--", "scrontab", "-"], input="# alice's own line\n",
                          capture_output=True, text=True)
    assert mine.returncode == 0, mine.stderr

    # Refused in words, nothing written: more often than the demo's minimum is impossible (every minute is
    # its minimum), so a grid and an odd time stand in.
    for body, expected in [({"schedule": "0 2 * * *", "grid": {"lr": [1, 2]}}, "a grid of parameters cannot"),
                           ({"schedule": "61 * * * *"}, "outside 0-59"),
                           ({"schedule": "0 2 * * *", "parameters": {"x": "y" * 2000}}, "at most 1,000")]:
        response = schedules_api(alice, "POST", json={"notebook": "nbsched/train.ipynb", "profile": "cpu", **body})
        assert response.status_code == 400 and expected in response.json()["message"], response.text

    # Every minute (the demo's profile allows it): Slurm's cron fires, each firing one notebook job.
    response = schedules_api(alice, "POST", json={"notebook": "nbsched/train.ipynb", "profile": "cpu",
                                                  "schedule": "* * * * *", "parameters": {"label": "nightly"}})
    assert response.status_code == 201, response.text
    made = response.json()["schedule"]
    assert made["words"] == "every minute" and made["next"], made
    crontab = crontab_of("alice").stdout
    assert crontab.startswith("# alice's own line\n") and f"dsportal-schedule {made['id']} begin" in crontab, crontab

    deadline, first = time.monotonic() + 240, None
    while time.monotonic() < deadline and first is None:
        time.sleep(3)
        first = schedules_api(alice, "GET").json()["schedules"][0]["last_run"]
    assert first, f"no run within 240 s; the crontab: {crontab}"
    job = wait_finished(alice, first)
    assert job["state"] == "COMPLETED" and job["schedule"] == made["id"], job
    assert job["notebook"].endswith("/nbsched/train.ipynb") and job["name"] == "nb-train", job  # hers, not the copy
    executed = alice.api("GET", f"/user/alice/dsportal/api/jobs/{job['job_id']}/files/output.ipynb").json()
    assert "score 0.9091 nightly" in json.dumps(executed["content"]), executed

    # bob: no schedule of hers through the API, her crontab and her schedule's folder closed to him.
    assert schedules_api(bob, "GET", owner="alice", allow_redirects=False).status_code in (302, 403)
    assert schedules_api(bob, "DELETE", f"/{made['id']}", owner="alice", allow_redirects=False).status_code in (302, 403)
    theirs = subprocess.run(["runuser", "-u", "bob", "--", "scrontab", "-l", "-u", "alice"], capture_output=True, text=True)
    assert theirs.returncode != 0 and "dsportal-schedule" not in theirs.stdout, theirs
    peek = subprocess.run(["runuser", "-u", "bob", "--", "ls", f"/home/alice/.dsportal/schedules/{made['id']}"],
                          capture_output=True, text=True)
    assert peek.returncode != 0, peek
    # His own schedule of her notebook: refused as his job would be (his session cannot read it).
    bob.spawn({"profile": "cpu"})
    response = schedules_api(bob, "POST", json={"notebook": "/home/alice/nbsched/train.ipynb", "profile": "cpu",
                                                "schedule": "0 2 * * *"})
    assert response.status_code == 400 and "cannot be read: Permission denied" in response.json()["message"], response.text
    response = bob.api("POST", "/user/bob/dsportal/api/jobs", json={"script": "/home/alice/nbsched/x.py"})
    assert response.status_code == 400 and "cannot be read: Permission denied" in response.json()["message"], response.text
    assert schedules_api(bob, "GET").json()["schedules"] == []

    # Changed outside the panel (scrontab in her terminal): the schedule says it no longer runs.
    made_too = schedules_api(alice, "POST", json={"notebook": "nbsched/train.ipynb", "profile": "cpu",
                                                  "schedule": "0 3 * * *"}).json()["schedule"]
    hers = crontab_of("alice").stdout
    kept = hers[:hers.index(f"# dsportal-schedule {made_too['id']} begin")]
    subprocess.run(["runuser", "-u", "alice", "--", "scrontab", "-"], input=kept, text=True, check=True, capture_output=True)
    time.sleep(16)  # the panel reads her crontab at most every 15 s
    lost = {s["id"]: s for s in schedules_api(alice, "GET").json()["schedules"]}[made_too["id"]]
    assert lost["next"] is None and "no longer in your Slurm crontab" in lost["problem"], lost
    assert schedules_api(alice, "DELETE", f"/{made_too['id']}").status_code == 200

    # Paused: its line commented out; deleted: her own line alone stays, and the runs stay jobs.
    paused = schedules_api(alice, "PATCH", f"/{made['id']}", json={"paused": True})
    assert paused.status_code == 200 and paused.json()["schedule"]["paused"] is True, paused.text
    assert "#dsportal-paused# * * * * *" in crontab_of("alice").stdout
    assert schedules_api(alice, "PATCH", f"/{made['id']}", json={"paused": "yes"}).status_code == 400
    gone = schedules_api(alice, "DELETE", f"/{made['id']}")
    assert gone.status_code == 200, gone.text
    assert crontab_of("alice").stdout == "# alice's own line\n"
    assert schedules_api(alice, "GET").json()["schedules"] == []
    assert alice.api("GET", f"/user/alice/dsportal/api/jobs/{job['job_id']}").status_code == 200
