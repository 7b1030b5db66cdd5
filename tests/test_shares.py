"""Issue 52: a share of a GPU (Slurm's shard GRES) for each student. The form offers "¼ GPU" on a profile
with gpu_shares; the session job asks Slurm for one shard, Slurm names the GPU that holds it, the status
bar shows the share, an unused share goes back to the queue as a GPU does, and usage counts a share as
its part of a GPU-hour."""

from __future__ import annotations

import json
import re

import pytest

from conftest import CONFIG, stop_and_wait
from hubclient import HubUser, active_jobs
from portal.admin import usage
from portal.core.rules import RequestError, judge_request, slice_for
from portal.core.settings import Profile, load
from portal.core.templating import render
from portal.session.usage.sliceusage import share_per_gpu

# -------------------------------------------------------------------------------- quick: no cluster


def _class_gpu() -> Profile:
    return load(CONFIG).profile("class-gpu")


@pytest.mark.quick
def test_a_share_is_a_gpus_part_of_its_cpus_and_memory_and_the_profiles_default():
    profile = _class_gpu()
    chosen = slice_for(profile, None)  # default_share: the form starts from it
    assert (chosen.shares, chosen.gpus, chosen.cpus, chosen.mem_mb) == (1, 0, 2, 12288)
    assert chosen.describe().startswith("¼ GPU, 2 CPUs, 12 GB")
    assert chosen.idle_limit == 30 * 60  # the GPU idle limit: a share goes back to the queue
    # On the share node, a share or no GPU: never a whole one, which Slurm 22.05 would put beside shares.
    without = slice_for(profile, 0)
    assert (without.shares, without.gpus, without.cpus, without.mem_mb) == (0, 0, 2, 12288)
    with pytest.raises(RequestError, match=re.escape('choose one of 0, or a share: "1/4" (¼ GPU)')):
        slice_for(profile, 1)
    asked = judge_request({"profile": "class-gpu", "gpus": "1/4"}, load(CONFIG).profiles, {"class101"}, "gpu", [])
    assert asked.slice.shares == 1


@pytest.mark.quick
@pytest.mark.parametrize("gpus, says", [
    ("1/3", 'a share there is "1/4"'),
    ("2/4", 'a share there is "1/4"'),
    ("1/4 ", None),
    ("1/04x", "GPU count must be a whole number"),
    ("1/04", None),
])
def test_only_the_profiles_own_share_is_taken(gpus, says):
    if says is None:
        assert slice_for(_class_gpu(), gpus).shares == 1
        return
    with pytest.raises(RequestError, match=re.escape(says)):
        slice_for(_class_gpu(), gpus)


@pytest.mark.quick
def test_the_form_counts_a_partitions_free_shares_from_sinfo():
    from portal.slurm.slurmparse import Node, partition_resources

    node = Node.from_json({"name": "node3", "state": "mixed", "partitions": ["share"], "cpus": 224, "alloc_cpus": 6,
                           "real_memory": 1000, "alloc_memory": 36, "gres": "gpu:28,shard:112",
                           "gres_used": "gpu:0,shard:(null):3(IDX:0-1)"})
    assert (node.gpus, node.alloc_gpus, node.shards, node.alloc_shards) == (28, 0, 112, 3)
    share = partition_resources([node])["share"]
    assert (share.shards, share.free_shards) == (112, 109)


@pytest.mark.quick
def test_a_profile_without_shares_refuses_one_in_words():
    with pytest.raises(RequestError, match="offers whole GPUs only"):
        slice_for(load(CONFIG).profile("gpu"), "1/4")
    with pytest.raises(ValueError, match="default_share needs gpu_shares"):
        Profile(name="p", partition="p", display_name="P", default_share=True)


@pytest.mark.quick
def test_the_job_asks_slurm_for_one_shard_and_tells_the_session():
    profile = _class_gpu()
    chosen = slice_for(profile, None)
    text = render("session.sbatch.j2", job_name="dsportal-student01", partition=profile.partition, gpus=chosen.gpus,
                  shares=chosen.shares, cpus=chosen.cpus, mem_mb=chosen.mem_mb, walltime=chosen.walltime,
                  log_path="/home/s/.dsportal/logs/session-%j.log", workdir="/home/s", profile=profile.model_dump(),
                  environment="/opt/dsportal/env", command=["true"], catalog="", umask="077")
    lines = text.splitlines()
    assert "#SBATCH --gres=shard:1" in lines and not any(line.startswith("#SBATCH --gres=gpu") for line in lines)
    assert "export DSPORTAL_GPU_SHARE=1/4" in lines
    assert share_per_gpu({"DSPORTAL_GPU_SHARE": "1/4"}) == 4
    assert share_per_gpu({"DSPORTAL_GPU_SHARE": "1/1"}) == share_per_gpu({}) == share_per_gpu({"DSPORTAL_GPU_SHARE": "x"}) == 0


@pytest.mark.quick
def test_a_share_is_busy_by_its_own_processes_not_its_neighbours():
    from portal.session.usage.sliceusage import Gpu, busy_gpus

    neighbours_work = Gpu(index=0, utilization_percent=100, share=4, own_utilization_percent=0)
    own_work = Gpu(index=1, utilization_percent=100, share=4, own_utilization_percent=60)
    whole = Gpu(index=2, utilization_percent=40)
    assert busy_gpus([neighbours_work, own_work, whole], 5) == [1, 2]


@pytest.mark.quick
def test_usage_counts_a_share_as_its_part_of_a_gpu_hour():
    record = {"JobID": "7", "User": "student01", "JobName": "dsportal-student01", "Partition": "gpu",
              "Account": "class101", "Comment": "dsportal-profile=class-gpu", "State": "COMPLETED",
              "ElapsedRaw": "3600", "AllocTRES": "billing=2,cpu=2,gres/shard=1,mem=12G,node=1"}
    whole = {**record, "JobID": "8", "Comment": "dsportal-profile=gpu", "AllocTRES": "cpu=8,gres/gpu=1,mem=48G,node=1"}
    # her own sbatch of shards, saying nothing of itself: counted by what its partition's shards are
    own = {**record, "JobID": "9", "JobName": "mine", "Comment": "", "AllocTRES": "cpu=1,gres/shard=2,mem=1G,node=1"}
    rows = usage.summed([record, whole, own], {"gpu": 4})
    assert rows[("student01", "class101", "class-gpu")].gpu_hours == pytest.approx(0.25)
    assert rows[("student01", "class101", "gpu")].gpu_hours == pytest.approx(1.0)
    assert rows[("student01", "class101", "(gpu)")].gpu_hours == pytest.approx(0.5)


# ----------------------------------------------------------------------------- on the demo cluster

def test_a_whole_gpu_is_refused_on_the_share_partition_even_from_a_users_own_shell(portal):
    """Slurm 22.05 would place a whole-GPU job on a GPU whose shares are in use: the share partition's QoS
    refuses one to anybody's own sbatch, while a share is taken."""
    import subprocess

    def sbatch(gres: str) -> subprocess.CompletedProcess:
        return subprocess.run(["runuser", "-u", "bob", "--", "sbatch", "--parsable", "--partition=share", f"--gres={gres}",
                               "--time=1", "--mem=100M", "--output=/dev/null", "--wrap", "true"],
                              capture_output=True, text=True, timeout=60)

    whole = sbatch("gpu:1")
    assert whole.returncode != 0 and "QOSMaxGRESPerJob" in whole.stderr, whole
    share = sbatch("shard:1")
    assert share.returncode == 0, share.stderr
    subprocess.run(["scancel", share.stdout.strip().split(";")[0]], capture_output=True)


def test_four_students_share_one_gpu_each_told_its_share(portal, admin):
    students = [HubUser(portal, f"student{n:02d}").must_login(f"student{n:02d}-demo") for n in range(21, 26)]
    try:
        for student in students:
            student.start_server({"profile": "class-gpu"})
        for student in students:
            student.wait_ready(timeout=180)
        seen = {}
        for student in students:
            held = student.api("GET", f"/user/{student.name}/dsportal/api/slice").json()
            env = student.run_code("import os; print(os.environ.get('SLURM_JOB_GPUS'), os.environ.get('SLURM_JOB_ID'))")
            gpu, job = env.split()
            assert held["share"] == "¼ GPU" and held["gpus"] == 0 and held["cpus"] == 2, held
            job_of = active_jobs(student.name)[0]
            assert str(job_of["job_id"]) == job and re.fullmatch(r"[0-9]+", gpu), (held, env)
            assert job_of["nodes"] == "node3", job_of  # the share node, the partition of shares
            seen[student.name] = (job_of["nodes"], gpu)
        # Slurm puts shares together: 5 shares of 4 per GPU use at least 2 GPUs, and some GPU holds more than one.
        assert len(set(seen.values())) < len(students), seen
    finally:
        for student in students:
            stop_and_wait(admin, student.name)


def test_the_form_offers_the_share_in_words(portal):
    student = HubUser(portal, "student26").must_login("student26-demo")
    form = student.web.get("/hub/spawn").text
    assert 'value="1/4"' in form and "¼ GPU" in form, form[:2000]
    assert "one GPU\n        shared with up to 3 other sessions" in form or "shared with up to 3 other sessions" in form
    assert "out-of-memory" in form
    assert re.search(r"<b>\d+ of 112 GPU shares</b>", form), form  # the share node's, live from sinfo


@pytest.mark.parametrize("field", ["gpus"])
def test_a_forged_share_is_refused_in_words_and_nothing_is_submitted(portal, admin, field):
    student = HubUser(portal, "student27").must_login("student27-demo")
    try:
        for forged in ("1/3", "1/0", "1/4/4", "¼", "1/٤"):
            answer = student.start_server({"profile": "class-gpu", field: forged})
            assert answer.status_code == 400, (forged, answer.status_code, answer.text)
            assert json.loads(answer.text)["message"], answer.text
        assert active_jobs("student27") == []
    finally:
        stop_and_wait(admin, "student27")


def test_a_student_starts_a_quarter_gpu_from_the_form_and_reads_it_in_the_status_bar(portal, admin):
    from playwright.sync_api import sync_playwright

    from test_browser import ARGS, CHROMIUM, SHOTS, log_in

    SHOTS.mkdir(exist_ok=True)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
            log_in(page, "student28", to_session=False)
            page.goto(f"{portal}/hub/spawn")
            page.locator('input[name="profile"][value="class-gpu"]').check()
            share = page.locator("#gpus-class-gpu")
            assert share.input_value() == "1/4"  # the profile's default
            said = page.locator("#slice-class-gpu").inner_text()
            assert said == "¼ GPU (about 20 GB of GPU memory), 2 CPU cores, 12 GB memory", said
            page.screenshot(path=str(SHOTS / "spawn-form-share.png"))
            page.locator('form [type="submit"]').first.click()
            page.wait_for_url("**/user/student28/**", timeout=180_000)
            page.wait_for_function("window.dsportalLab && window.dsportalLab.loaded", timeout=120_000)
            status = page.locator(".dsportal-SliceStatus")
            status.wait_for(timeout=60_000)
            page.wait_for_function("document.querySelector('.dsportal-SliceStatus').textContent.startsWith('¼ GPU')",
                                   timeout=60_000)
            assert status.inner_text().startswith("¼ GPU · 2 CPUs · 12 GB"), status.inner_text()
            page.screenshot(path=str(SHOTS / "status-bar-share.png"))
            browser.close()
    finally:
        stop_and_wait(admin, "student28")
