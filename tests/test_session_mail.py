"""Issue 31: an e-mail when a session starts, if she asked for one on the form.

Real parts: her address is the `mail` of her LDAP entry (the demo's slapd); the mail is Slurm's own
at BEGIN (MailProg on the login node); exim4 delivers it to /var/mail/<user>, where the test reads
it. The first tests need no cluster: the #SBATCH lines and the rules (the form's checkbox, read by the
spawner: test_spawner_life.py).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from conftest import CONFIG, HUB, stop_and_wait
from democluster.mta import exim_settings
from hubclient import HubUser, active_jobs
from portal.core.rules import RequestError, judge_request, plain_mail_address, wants_mail
from portal.core.settings import load
from portal.core.templating import render
from spawner.mailaddress import address_in_directory
from test_batch_script import script
from test_profiles import scontrol

MAILBOX = Path("/var/mail/alice")
MAIL_WAIT = 90  # seconds: the BEGIN mail is sent when the job starts, delivered at once by exim


# ---------------------------------------------------------------- no cluster: the batch script
def sbatch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH --mail")]


@pytest.mark.quick
def test_asked_for_mail_the_script_has_begin_and_her_address():
    assert sbatch_lines(script(mail_user="alice@dsportal.test")) == [
        "#SBATCH --mail-type=BEGIN", "#SBATCH --mail-user=alice@dsportal.test"]


@pytest.mark.quick
def test_not_asked_the_script_has_no_mail_lines():
    assert sbatch_lines(script()) == []
    assert sbatch_lines(script(mail_user="")) == []


@pytest.mark.quick
def test_an_address_that_could_smuggle_syntax_never_reaches_the_script():
    with pytest.raises(ValueError):
        script(mail_user="alice@dsportal.test\n#SBATCH --uid=0")
    with pytest.raises(ValueError):
        script(mail_user="alice@dsportal.test $(id)")


# ---------------------------------------------------------------- no cluster: the rules and the form
@pytest.mark.parametrize("value", ["yes", "on", 1, None, ["true"], {"to": "eve@evil.test"}, "eve@evil.test"])
@pytest.mark.quick
def test_a_mail_option_that_is_not_true_or_false_is_refused_in_words(value):
    with pytest.raises(RequestError, match="mail must be true or false"):
        wants_mail({"mail": value})
    profiles = load(CONFIG).profiles
    with pytest.raises(RequestError, match="mail must be true or false"):
        judge_request({"profile": "cpu", "mail": value}, profiles, set(), "gpu", [])


@pytest.mark.quick
def test_true_false_and_left_out_are_accepted():
    assert wants_mail({"mail": True}) is True
    assert wants_mail({"mail": False}) is False
    assert wants_mail({}) is False


@pytest.mark.parametrize("address", ["alice@dsportal.test", "a.b+lab@mail.example.org", "carol@localhost"])
@pytest.mark.quick
def test_plain_addresses_pass(address):
    assert plain_mail_address(address) == address


@pytest.mark.parametrize("address", ["-oQ/tmp@dsportal.test", "alice@dsportal.test\n", "alice @dsportal.test",
                                     "alice@dsportal.test,eve@evil.test", "alice", "@dsportal.test",
                                     "ålice@dsportal.test", "alice@dsportal.test;id", "", None])
@pytest.mark.quick
def test_addresses_that_are_not_plain_are_refused_in_words(address):
    with pytest.raises(RequestError, match="is not a plain address"):
        plain_mail_address(address)


@pytest.mark.quick
def test_the_form_shows_the_checkbox_off_with_the_note_when_there_is_no_address():
    form = render("spawn_form.html.j2", rows=[], default="", mail={"address": "", "note": "No e-mail address is known"})
    assert re.search(r'<input[^>]*name="mail"[^>]*disabled', form)
    assert "No e-mail address is known" in form
    form = render("spawn_form.html.j2", rows=[], default="", mail={"address": "alice@dsportal.test", "note": ""})
    assert not re.search(r'<input[^>]*name="mail"[^>]*disabled', form)
    assert "E-mail me when my session starts" in form and "alice@dsportal.test" in form


@pytest.mark.quick
def test_the_demos_mta_delivers_its_domain_locally_and_relays_nothing():
    settings = dict(line.split("=", 1) for line in exim_settings("dsportal.test").splitlines() if "=" in line)
    assert settings["dc_eximconfig_configtype"] == "'local'"
    assert settings["dc_other_hostnames"] == "'dsportal.test'"
    assert settings["dc_local_interfaces"] == "'127.0.0.1 ; ::1'"
    assert settings["dc_relay_nets"] == settings["dc_relay_domains"] == settings["dc_smarthost"] == "''"
    assert settings["dc_localdelivery"] == "'mail_spool'"


# ---------------------------------------------------------------- the demo cluster
def mailbox_size() -> int:
    return MAILBOX.stat().st_size if MAILBOX.exists() else 0


def mail_since(offset: int) -> str:
    if not MAILBOX.exists():
        return ""
    with MAILBOX.open("rb") as box:
        box.seek(offset)
        return box.read().decode(errors="replace")


def begin_mail(job_id: int) -> str:
    """Slurm's subject for the start of ``job_id`` (a folded header line still matches)."""
    return rf"Job_id={job_id}\s+Name=\S+\s+Began"


def wait_for_begin_mail(job_id: int, offset: int) -> str:
    """The mailbox's new text once Slurm's BEGIN mail for ``job_id`` is in it (or all of it, at the end)."""
    deadline = time.monotonic() + MAIL_WAIT
    while time.monotonic() < deadline:
        text = mail_since(offset)
        if re.search(begin_mail(job_id), text):
            return text
        time.sleep(1)
    return mail_since(offset)


def only_job(user: str) -> int:
    jobs = active_jobs(user)
    assert len(jobs) == 1, jobs
    return jobs[0]["job_id"]


def test_her_entry_in_the_directory_holds_her_address(portal):
    ldap = load(CONFIG).ldap
    assert address_in_directory(ldap, "alice") == "alice@dsportal.test"
    assert address_in_directory(ldap, "student01") is None


def test_the_form_offers_the_checkbox_with_her_address(alice):
    page = alice.web.get(f"{HUB}/hub/spawn")
    assert page.status_code == 200
    assert "E-mail me when my session starts" in page.text
    assert not re.search(r'<input[^>]*name="mail"[^>]*disabled', page.text)
    assert "alice@dsportal.test" in page.text


def test_begin_mail_reaches_her_mailbox_only_when_she_asked(alice, admin):
    # Without the option: no mail lines in the job, so Slurm has nothing to send.
    offset = mailbox_size()
    alice.spawn({"profile": "cpu"})
    quiet_job = only_job("alice")
    assert scontrol(quiet_job).get("MailType") in ("NONE", None), scontrol(quiet_job)
    stop_and_wait(admin, "alice")

    # Asked on the form: Slurm's BEGIN mail for this job arrives in her mailbox.
    response = alice.web.post(f"{HUB}/hub/spawn", data={
        "_xsrf": alice.web.cookies.get("_xsrf"), "profile": "cpu", "gpus.cpu": "0", "walltime.cpu": "01:00:00",
        "mail": "on"}, allow_redirects=False)
    assert response.status_code == 302, response.text[-2000:]
    alice.wait_ready()
    mailed_job = only_job("alice")
    job = scontrol(mailed_job)
    assert (job.get("MailUser"), job.get("MailType")) == ("alice@dsportal.test", "BEGIN"), job
    text = wait_for_begin_mail(mailed_job, offset)
    assert re.search(begin_mail(mailed_job), text), f"no BEGIN mail for job {mailed_job} in {MAILBOX}:\n{text}"
    assert "To: alice@dsportal.test" in text
    # Slurm mailed the later job's start: the earlier one, which did not ask, got none.
    assert not re.search(rf"Job_id={quiet_job}\s", text), text


def test_forged_mail_values_are_refused_and_submit_nothing(alice):
    for options, expected in (({"profile": "cpu", "mail": "eve@evil.test"}, "mail must be true or false"),
                              ({"profile": "cpu", "mail": "yes"}, "mail must be true or false"),
                              ({"profile": "cpu", "mail_user": "eve@evil.test"}, "unknown option(s)")):
        response = alice.start_server(options)
        assert response.status_code == 400, (options, response.status_code, response.text[:300])
        assert expected in response.json()["message"], (options, response.json())
    page = alice.web.post(f"{HUB}/hub/spawn", data={
        "_xsrf": alice.web.cookies.get("_xsrf"), "profile": "cpu", "gpus.cpu": "0", "walltime.cpu": "01:00:00",
        "mail": "eve@evil.test"}, allow_redirects=False)
    assert page.status_code == 400, page.status_code
    assert "mail must be true or false" in page.text
    assert 'name="profile"' in page.text  # the form is shown again
    assert active_jobs("alice") == []
    assert alice.model()["servers"] == {}


def test_without_an_address_the_checkbox_is_off_and_a_forced_request_is_refused(portal):
    student = HubUser(portal, "student01").must_login("student01-demo")
    page = student.web.get(f"{HUB}/hub/spawn")
    assert re.search(r'<input[^>]*name="mail"[^>]*disabled', page.text), page.text[-3000:]
    assert "No e-mail address is known for your account" in page.text
    response = student.start_server({"profile": "class", "mail": True})
    assert response.status_code == 400, (response.status_code, response.text[:300])
    assert "no e-mail address for your account" in response.json()["message"]
    assert active_jobs("student01") == []
    assert student.model()["servers"] == {}
